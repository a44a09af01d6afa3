"""Voice direction with two guidance scales on an official-layout checkpoint (`breeze-worker make-checkpoint`):
the eager generator's greedy codes are the oracle's (dual_guidance_oracle.py, written from the reference
implementation's description), and the fast path's are the eager generator's, alone and batched."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from dual_guidance_oracle import DualGuidanceOracle

from breeze_worker.engine.eager import EagerFrameGenerator
from breeze_worker.engine.prompt import prompt_layouts
from breeze_worker.engine.request import resolve_request
from breeze_worker.engine.types import ReferenceInput, ResolvedReference, SamplingOverrides, SynthesisRequest
from breeze_worker.model.loader import load_checkpoint

TEXT, INSTRUCTION, TRANSCRIPT = "the ferry left the harbour", "calm and slow", "a voice to follow"
REFERENCE = np.random.RandomState(3).randint(0, 2048, (7, 16))
FRAMES = 6


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt") / "breeze"
    done = subprocess.run([sys.executable, "-m", "breeze_worker.cli", "make-checkpoint", "--size", "tiny", "--seed",
                           "5", "--dtype", "fp32", str(out)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def model(checkpoint):
    torch.set_num_threads(1)
    return load_checkpoint(checkpoint, device="cpu", dtype=torch.float32, require_codec=False)


def direction_request(model, s_ref: float | None, s_ins: float | None, *, seed: int = 1, frames: int = FRAMES,
                      temperature: float = 0.0, text: str = TEXT, **extra):
    reference = ResolvedReference("ref-dual", TRANSCRIPT, REFERENCE, 0.56)
    req = SynthesisRequest(text=text, instruction=INSTRUCTION, seed=seed, max_frames=frames,
                           reference=ReferenceInput(audio=b"RIFF", transcript=TRANSCRIPT),
                           cfg_scale_reference=s_ref, cfg_scale_instruction=s_ins,
                           sampling=SamplingOverrides(temperature=temperature), **extra)
    return resolve_request(req, model.generation_defaults, reference, tokenizer=model.tokenizer)


def eager_codes(model, request) -> list[list[int]]:
    return [frame.tolist() for frame in EagerFrameGenerator(model, request, "cpu")]


def test_the_three_branches_are_the_instruction_clone_and_plain_prompts_in_the_recipes_ids(model, checkpoint):
    oracle = DualGuidanceOracle(checkpoint, model.lm)
    theirs = oracle.branches(TEXT, INSTRUCTION, TRANSCRIPT, REFERENCE)
    request = direction_request(model, 1.5, 2.0)
    assert request.branches == 3 and request.cfg_scale == 1.0
    layouts = prompt_layouts(model, request)
    want = {name: oracle._pieces(segments)[0] for name, segments in (
        ("ins", [("text", f"[S0]<ins_bos>{INSTRUCTION}<ins_eos>{TEXT}")]),
        ("ref", [("text", f"[S0]{TRANSCRIPT}"), ("audio", REFERENCE), ("text", f"[S0]{TEXT}")]),
        ("uncond", [("text", f"[S0]{TEXT}")]))}
    assert [list(layout.input_ids) for layout in layouts] == [want["ins"], want["ref"], want["uncond"]]
    assert [len(layout) for layout in layouts] == [theirs[n].embeds.shape[0] for n in ("ins", "ref", "uncond")]


@pytest.mark.parametrize("s_ref, s_ins", [(1.5, 2.0), (0.0, 3.0), (2.5, 0.5)])
def test_eager_dual_guidance_gives_the_oracles_greedy_codes(model, checkpoint, s_ref, s_ins):
    oracle = DualGuidanceOracle(checkpoint, model.lm)
    want = oracle.generate(TEXT, INSTRUCTION, TRANSCRIPT, REFERENCE, s_ref, s_ins, FRAMES)
    got = eager_codes(model, direction_request(model, s_ref, s_ins))
    assert len(want) == FRAMES and got == want


def test_the_two_scales_are_not_interchangeable(model, checkpoint):
    """The test above could not tell the branches apart if swapping the scales gave the same codes."""
    oracle = DualGuidanceOracle(checkpoint, model.lm)
    swapped = oracle.generate(TEXT, INSTRUCTION, TRANSCRIPT, REFERENCE, 2.0, 1.5, FRAMES)
    single = eager_codes(model, direction_request(model, None, None, cfg_scale=2.0))
    dual = eager_codes(model, direction_request(model, 1.5, 2.0))
    assert dual != swapped and dual != single


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_the_fast_path_gives_the_eager_frames(model, temperature):
    """The fast path's frame step (static caches, three rows combined in one step; no graphs on the CPU) in FP32:
    the eager generator's frames, greedy and sampled (the noise is keyed by seed, frame and codebook)."""
    from breeze_worker.engine.fastpath.generator import FastFrameGenerator

    request = direction_request(model, 1.5, 2.0, temperature=temperature, seed=4)
    fast = [frame.tolist() for frame in FastFrameGenerator(model, request, "cpu")]
    assert fast == eager_codes(model, request) and len(fast) == FRAMES
