"""A test oracle for voice direction with two guidance scales, written from the reference implementation's
description (/work/shared/reference/breeze-tts-2.md; nothing of the worker's engine is used): three branches,
each its own prompt and its own sequence, combined u + s_ref * (r - u) + s_ins * (i - u) at the backbone and
at every depth step, greedy everywhere.

It is deliberately the slowest obvious form, so that it is easy to check by reading:
- prompts by the official recipe, through transformers' tokenizer reading the checkpoint's tokenizer.json:
  each text segment tokenized with special tokens and decoded back, the reference audio as one `<|AUDIO|>`
  per frame and one `<|audio_eos|>`, the pieces concatenated and the whole tokenized once;
- the prompt embedded position by position: each text segment encoded on its own by the text encoder and
  projected, an audio position the sum over codebooks k of E[code_k + vocab * k], the audio end the sum of an
  all-zero frame's;
- no KV cache anywhere: every frame runs each branch's whole sequence (prompt + frames so far) through the
  backbone, and every depth step runs each branch's whole depth sequence (its backbone state, then the codes
  so far) through the depth decoder;
- the backbone's combined logits get the repetition penalty on the codebook-0 history, then the reserved
  classes masked; a depth step's combined logits get the reserved codes masked; argmax; end of speech ends.

It uses the model's modules for the forward passes (the blocks are checked against transformers' own Qwen3,
Llama and T5Gemma2 in tests/model/test_block_parity.py) and reads every id and size from the checkpoint's
config.json.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import PreTrainedTokenizerFast

from breeze_worker.model.lm.layers import NoCache

AUDIO, AUDIO_EOS = "<|AUDIO|>", "<|audio_eos|>"
RESERVED = (2048, 2049, 2050)  # codes the codec cannot decode; never sampled
END_OF_SPEECH = 2051


@dataclass
class Branch:
    embeds: torch.Tensor  # [T, H] the prompt, then one summed embedding per generated frame


class DualGuidanceOracle:
    def __init__(self, checkpoint: Path, lm):
        self.lm = lm
        self.config = json.loads((checkpoint / "config.json").read_text())
        self.tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(checkpoint / "tokenizer.json"))
        self.vocab = int(self.config["vocab_size"])
        self.codebooks = int(self.config["num_codebooks"])
        self.max_sequence = 2048

    # ---- prompts ----
    def _pieces(self, segments: list[tuple[str, object]]) -> tuple[list[int], list[tuple[str, int, object]]]:
        """The recipe: ids of the whole prompt and each piece's (kind, token count, payload)."""
        rendered = []
        for kind, value in segments:
            if kind == "text":
                ids = self.tokenizer(value, add_special_tokens=True)["input_ids"]
                rendered.append((kind, self.tokenizer.decode(ids, skip_special_tokens=False), value))
            else:
                rendered.append((kind, AUDIO * len(value) + AUDIO_EOS, value))
        ids = self.tokenizer("".join(r[1] for r in rendered), add_special_tokens=False)["input_ids"]
        pieces = [(kind, len(self.tokenizer(text, add_special_tokens=False)["input_ids"]), payload)
                  for kind, text, payload in rendered]
        assert sum(n for _, n, _ in pieces) == len(ids), "the pieces do not add up to the prompt"
        return ids, pieces

    def _frame_embedding(self, codes) -> torch.Tensor:
        table = self.lm.depth_decoder.model.embed_tokens.weight
        index = torch.as_tensor(np.asarray(codes), dtype=torch.int64) + self.vocab * torch.arange(self.codebooks)
        return table[index].sum(0)

    def _prompt(self, segments) -> Branch:
        ids, pieces = self._pieces(segments)
        rows, at = [], 0
        for kind, n, payload in pieces:
            if kind == "text":
                piece = torch.tensor([ids[at:at + n]])
                rows.append(self.lm.encode_text(piece, torch.ones_like(piece))[0])
            else:
                audio_id, end_id = self.config["audio_token_id"], self.config["audio_eos_token_id"]
                assert ids[at:at + n] == [audio_id] * (n - 1) + [end_id]
                frames = [self._frame_embedding(frame) for frame in payload]
                rows.append(torch.stack(frames + [self._frame_embedding([0] * self.codebooks)]))
            at += n
        return Branch(torch.cat(rows))

    def branches(self, text: str, instruction: str, transcript: str, reference: np.ndarray) -> dict[str, Branch]:
        return {
            "uncond": self._prompt([("text", f"[S0]{text}")]),
            "ref": self._prompt([("text", f"[S0]{transcript}"), ("audio", reference), ("text", f"[S0]{text}")]),
            "ins": self._prompt([("text", f"[S0]<ins_bos>{instruction}<ins_eos>{text}")]),
        }

    # ---- forward passes, no cache ----
    @staticmethod
    def _causal(n: int) -> torch.Tensor:
        return torch.full((n, n), torch.finfo(torch.float32).min).triu(1)[None, None]

    def _backbone(self, branch: Branch) -> tuple[torch.Tensor, torch.Tensor]:
        """The last position's hidden state [H] and its FP32 logits [vocab + 1]."""
        n = branch.embeds.shape[0]
        hidden = self.lm.backbone_model(branch.embeds[None], torch.arange(n)[None], self._causal(n), NoCache())
        last = hidden[0, -1]
        return last, last.float() @ self.lm.lm_head.weight.float().t()

    def _depth(self, backbone_state: torch.Tensor, codes: list[int]) -> torch.Tensor:
        """Logits [vocab] of codebook len(codes) from the depth sequence (backbone state, codes so far)."""
        model = self.lm.depth_decoder.model
        table = model.embed_tokens.weight
        inputs = torch.stack([backbone_state] + [table[c + self.vocab * k] for k, c in enumerate(codes)])
        n = inputs.shape[0]
        hidden = model(inputs[None], torch.arange(n), self._causal(n), NoCache())[0, -1]
        return hidden.float() @ self.lm.depth_decoder.codebooks_head.weight[n - 2].float()

    @staticmethod
    def _combine(u: torch.Tensor, r: torch.Tensor, i: torch.Tensor, s_ref: float, s_ins: float) -> torch.Tensor:
        return u + s_ref * (r - u) + s_ins * (i - u)

    # ---- the loop ----
    @torch.no_grad()
    def generate(self, text: str, instruction: str, transcript: str, reference: np.ndarray, s_ref: float,
                 s_ins: float, max_frames: int, repetition_penalty: float = 1.1) -> list[list[int]]:
        """Greedy frames (16 codes each) until end of speech or the frame limit."""
        branches = self.branches(text, instruction, transcript, reference)
        longest = max(b.embeds.shape[0] for b in branches.values())
        limit = min(max_frames, self.max_sequence - 1 - longest)
        history: set[int] = set()
        frames = []
        for _ in range(limit):
            states, logits = {}, {}
            for name, branch in branches.items():
                states[name], logits[name] = self._backbone(branch)
            scores = self._combine(logits["uncond"], logits["ref"], logits["ins"], s_ref, s_ins).clone()
            for code in history:  # CTRL's penalty: positive scores divided, negative ones multiplied
                score = scores[code]
                scores[code] = score / repetition_penalty if score > 0 else score * repetition_penalty
            scores[list(RESERVED)] = float("-inf")
            code0 = int(scores.argmax())
            if code0 == END_OF_SPEECH:
                break
            history.add(code0)
            codes = [code0]
            for _ in range(1, self.codebooks):
                per_branch = {name: self._depth(states[name], codes) for name in branches}
                depth = self._combine(per_branch["uncond"], per_branch["ref"], per_branch["ins"], s_ref, s_ins)
                depth[list(RESERVED)] = float("-inf")
                codes.append(int(depth.argmax()))
            frames.append(codes)
            step = self._frame_embedding(codes)[None]
            for branch in branches.values():
                branch.embeds = torch.cat([branch.embeds, step])
        return frames
