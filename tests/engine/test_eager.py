"""The eager frame generator: determinism, end reasons, prompt embeddings, CFG, and agreement of its KV-cached
loop with a cache-free recomputation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from breeze_worker.engine.eager import EagerFrameGenerator
from breeze_worker.engine.prompt import prepare_prompt_embeddings, prompt_layouts
from breeze_worker.engine.request import resolve_request
from breeze_worker.engine.types import (
    EndReason,
    ReferenceInput,
    ResolvedReference,
    SamplingOverrides,
    SynthesisRequest,
)
from breeze_worker.model import prompt_templates as templates
from breeze_worker.model.lm.layers import additive_mask
from breeze_worker.model.tiny import tiny_model

REF = ResolvedReference("r", "ref words", np.random.RandomState(0).randint(0, 2048, (6, 16)), 0.48)


def request(model, reference=None, **kwargs):
    kwargs.setdefault("text", "Hello world")
    kwargs.setdefault("seed", 11)
    if reference is not None:
        kwargs["reference"] = ReferenceInput(audio=b"RIFF", transcript=reference.transcript)
    return resolve_request(SynthesisRequest(**kwargs), model.generation_defaults, reference, tokenizer=model.tokenizer)


def frames(model, req):
    gen = EagerFrameGenerator(model, req)
    out = list(gen)
    return torch.stack(out) if out else torch.empty(0, 16, dtype=torch.int64), gen


def test_same_seed_same_frames_different_seed_different_frames(tiny):
    a, gen = frames(tiny, request(tiny, seed=3, max_frames=4))
    b, _ = frames(tiny, request(tiny, seed=3, max_frames=4))
    c, _ = frames(tiny, request(tiny, seed=4, max_frames=4))
    assert a.shape == (4, 16) and a.dtype == torch.int64
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert gen.end_reason is EndReason.FRAME_LIMIT
    assert set(gen.timings) == {"text_encode_s", "prefill_s", "generate_s"} and gen.timings["generate_s"] > 0
    assert int(a.max()) < 2048 and int(a.min()) >= 0


@pytest.mark.parametrize("kwargs, with_ref", [({"instruction": "calm", "cfg_scale": 2.0}, False),
                                              ({}, True), ({"instruction": "calm", "cfg_scale": 1.5}, True)])
def test_all_templates_generate(tiny, kwargs, with_ref):
    req = request(tiny, REF if with_ref else None, max_frames=3, **kwargs)
    out, gen = frames(tiny, req)
    assert out.shape == (3, 16) and gen.end_reason is EndReason.FRAME_LIMIT


def test_prompt_embeddings_put_each_piece_where_the_layout_says(tiny):
    req = request(tiny, REF, instruction="calm", cfg_scale=2.0)
    layouts = prompt_layouts(tiny, req)
    batch = prepare_prompt_embeddings(tiny, req)
    lm = tiny.lm
    assert batch.inputs_embeds.shape[0] == 2 and batch.lengths == (len(layouts[0]), len(layouts[1]))
    longest = batch.length
    for row, layout in enumerate(layouts):
        offset = longest - len(layout)  # left padding
        assert not batch.attention_mask[row, :offset].any() and batch.attention_mask[row, offset:].all()
        assert torch.equal(batch.positions[row, offset:], torch.arange(len(layout)))
        for span in layout.spans:
            got = batch.inputs_embeds[row, offset + span.start : offset + span.start + span.length]
            with torch.no_grad():
                if span.kind == templates.TEXT:  # the segment encoded on its own
                    ids = torch.tensor([layout.input_ids[span.start : span.start + span.length]])
                    want = lm.encode_text(ids, torch.ones_like(ids))[0]
                elif span.kind == templates.AUDIO:
                    want = lm.embed_frames(torch.as_tensor(REF.codes))
                else:
                    want = lm.embed_frames(torch.zeros(1, 16, dtype=torch.int64))
            assert torch.allclose(got, want, atol=1e-5), span


def test_guidance_changes_the_frames(tiny):
    plain, _ = frames(tiny, request(tiny, instruction="calm", max_frames=3))
    guided, _ = frames(tiny, request(tiny, instruction="calm", cfg_scale=3.0, max_frames=3))
    assert not torch.equal(plain, guided)


@pytest.fixture(scope="module")
def rigged():
    """A private tiny model whose logits we can steer."""
    return tiny_model(seed=0, with_codec=False)


def test_end_of_speech_ends_the_stream(rigged, steer_logits):
    steer_logits.end_of_speech(rigged, at=3)  # the third backbone read-out: after two frames
    out, gen = frames(rigged, request(rigged, max_frames=50))
    assert out.shape[0] == 2 and gen.end_reason is EndReason.END_OF_SPEECH


def test_reserved_ids_are_never_sampled(rigged, monkeypatch):
    lm = rigged.lm
    real_backbone, real_depth = lm.backbone_logits, lm.depth_logits

    def boost(out):
        out[..., 2048:2051] = 1e4
        return out

    monkeypatch.setattr(lm, "backbone_logits", lambda h: boost(real_backbone(h)))
    monkeypatch.setattr(lm, "depth_logits", lambda h, p: boost(real_depth(h, p)))
    out, _ = frames(rigged, request(rigged, max_frames=3))
    assert out.shape == (3, 16) and int(out.max()) < 2048


def test_repetition_penalty_acts_on_the_codebook0_history(rigged, monkeypatch):
    lm = rigged.lm
    real = lm.backbone_logits

    def favourites(hidden):  # code 7 first, code 9 a close second
        out = real(hidden)
        out[..., 7] += 10.0
        out[..., 9] += 8.0
        return out

    monkeypatch.setattr(lm, "backbone_logits", favourites)
    off, _ = frames(rigged, request(rigged, max_frames=4,
                                    sampling=SamplingOverrides(temperature=0.0, repetition_penalty=1.0)))
    on, _ = frames(rigged, request(rigged, max_frames=4,
                                   sampling=SamplingOverrides(temperature=0.0, repetition_penalty=1000.0)))
    assert off[:, 0].tolist() == [7, 7, 7, 7]
    assert on[0, 0] == 7 and on[1, 0] == 9  # 7 is in the history after frame 0, so 9 wins
    assert on[2, 0] not in (7, 9) and on[3, 0] not in (7, 9)
    assert torch.equal(off[0], on[0])  # the first frame has no history


@pytest.mark.parametrize("cfg", [1.0, 2.0])
def test_cached_loop_matches_a_cache_free_recomputation(tiny, cfg):
    """Greedy codebook 0 of frames 1..3 recomputed from scratch over [prompt; frames] (no KV cache)."""
    req = request(tiny, instruction="calm", cfg_scale=cfg, max_frames=4, sampling=SamplingOverrides(temperature=0.0))
    out, _ = frames(tiny, req)
    lm = tiny.lm
    batch = prepare_prompt_embeddings(tiny, req)
    rows = batch.inputs_embeds.shape[0]
    with torch.no_grad():
        for n in range(1, 4):
            embeds = torch.cat([batch.inputs_embeds, lm.embed_frames(out[:n]).expand(rows, -1, -1)], dim=1)
            valid = torch.cat([batch.attention_mask, torch.ones(rows, n, dtype=torch.bool)], dim=1)
            positions = (valid.long().cumsum(-1) - 1).masked_fill(~valid, 1)
            length = embeds.shape[1]
            allowed = torch.ones(length, length, dtype=torch.bool).tril()[None, None] & valid[:, None, None, :]
            hidden = lm.backbone(embeds, positions, additive_mask(allowed, embeds.dtype), lm.new_backbone_cache())
            logits = lm.backbone_logits(hidden[:, -1])
            if rows == 2:
                logits = logits[1:] + cfg * (logits[:1] - logits[1:])
            seen = torch.zeros_like(logits, dtype=torch.bool)
            seen[0, out[:n, 0]] = True
            logits = torch.where(seen & (logits > 0), logits / 1.1, torch.where(seen, logits * 1.1, logits))
            logits[:, 2048:2051] = -torch.inf
            assert int(logits.argmax(-1)) == int(out[n, 0])


@pytest.mark.parametrize("cfg", [2.0, 0.1])
def test_guidance_combines_every_depth_steps_logits(rigged, monkeypatch, cfg):
    """Steer the depth heads so the rows disagree: cond favours code A, uncond code B. The greedy code of
    every depth step must be argmax(u + s*(c - u)) of the two rows, which here is neither A nor B."""
    a, b, c = 100, 200, 300
    lm = rigged.lm
    real = lm.depth_logits
    seen: list[torch.Tensor] = []

    def steered(hidden, position):
        out = real(hidden, position).clone()
        assert out.shape[0] == 2  # both CFG rows reach the head
        out[0, [a, c]] += torch.tensor([100.0, 90.0])  # cond: A first, C a close second
        out[1, [a, b]] += torch.tensor([100.0, 120.0])  # uncond: B first, A close behind, C nowhere
        seen.append(out.clone())
        return out

    monkeypatch.setattr(lm, "depth_logits", steered)
    req = request(rigged, instruction="calm", cfg_scale=cfg, max_frames=2, sampling=SamplingOverrides(temperature=0.0))
    out, _ = frames(rigged, req)
    assert out.shape == (2, 16) and len(seen) == 2 * 15
    for i, logits in enumerate(seen):
        frame, codebook = divmod(i, 15)
        cond, uncond = logits[0], logits[1]
        combined = uncond + cfg * (cond - uncond)
        combined[2048:] = -torch.inf
        assert int(out[frame, codebook + 1]) == int(combined.argmax()), (frame, codebook + 1)
    # s = 2: C (A 100, B -120, C 180); s = 0.1: B (A 100, B 108, C 9); the cond row alone always gives A
    guided = c if cfg > 1 else b
    assert (out[:, 1:] == guided).all()
    assert int(seen[0][0].argmax()) == a and int(seen[0][1].argmax()) == b
