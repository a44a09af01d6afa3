"""A batched join builds its prefill input as one gather from a table of every joiner's prompt pieces
(engine/prompt.py `gather_prompts`). On the tiny model in FP32 on the CPU: each request's rows are exactly
`prepare_prompt_embeddings`' from the same text encodings (every template, references of different
lengths, CFG on and off, a request whose prompt fails beside ones that do not), and streams joined
together that way, clones among them, give the frames of each stream alone."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from breeze_worker.engine.batching import BatchedStepper
from breeze_worker.engine.eager import EagerFrameGenerator
from breeze_worker.engine.fastpath.text_encoder_graphs import TextEncoderGraphs
from breeze_worker.engine.prompt import gather_prompts, prepare_prompt_embeddings, prompt_text_segments
from breeze_worker.engine.request import resolve_request
from breeze_worker.engine.types import ReferenceInput, ResolvedReference, SynthesisRequest

REF_A = ResolvedReference("a", "ref words", np.random.RandomState(0).randint(0, 2048, (6, 16)), 0.48)
REF_B = ResolvedReference("b", "another, longer reference line", np.random.RandomState(1).randint(0, 2048, (9, 16)),
                          0.72)


@pytest.fixture(scope="module")
def model():
    from breeze_worker.model.tiny import tiny_model

    torch.set_num_threads(1)
    return tiny_model(seed=0, with_codec=False)


def _resolve(model, text, seed, frames=4, reference=None, **kwargs):
    if reference is not None:
        kwargs["reference"] = ReferenceInput(audio=b"RIFF", transcript=reference.transcript)
    return resolve_request(SynthesisRequest(text=text, seed=seed, max_frames=frames, **kwargs),
                           model.generation_defaults, reference, tokenizer=model.tokenizer)


@pytest.fixture(scope="module")
def requests(model):
    return {
        "plain": _resolve(model, "hello there", 1),
        "instruction": _resolve(model, "a longer sentence with more words", 2, instruction="calm", cfg_scale=2.0),
        "clone": _resolve(model, "cloned words", 3, reference=REF_A),
        "direction": _resolve(model, "directed", 4, reference=REF_B, instruction="whisper", cfg_scale=1.5),
        "direction-no-cfg": _resolve(model, "directed again", 5, reference=REF_A, instruction="loud"),
    }


@pytest.mark.parametrize("bucketed", [False, True])
def test_gathered_rows_are_the_prompt_batch_rows(model, requests, bucketed):
    encoder = TextEncoderGraphs(model.lm, torch.device("cpu"), use_graphs=False if bucketed else None)
    # laid out again at the join (its layouts dropped), where guidance on the plain template fails
    broken = dataclasses.replace(_resolve(model, "this one breaks", 6), prompt=None, cfg_scale=2.0)
    batch = [*requests.values(), broken]
    gathered = gather_prompts(model, batch, encoder)
    assert isinstance(gathered[-1], Exception)
    table = gathered[0].table
    assert all(g.table is table for g in gathered[:-1])  # one table for the whole join
    assert torch.equal(table[-1], torch.zeros_like(table[-1]))  # the padding row
    # the same text encodings, one batch for all (a segment's encoding depends on its batch by rounding)
    segments = [prompt_text_segments(model, request) for request in requests.values()]
    encoded = iter(encoder.encode_segments([seg for segs in segments for seg in segs]))
    for request, segs, got in zip(requests.values(), segments, gathered):
        want = prepare_prompt_embeddings(model, request, encoded=[next(encoded) for _ in segs])
        assert not isinstance(got, BaseException)
        assert got.length == want.length and len(got.rows) == want.inputs_embeds.shape[0]
        for r, index in enumerate(got.rows):
            n = len(index)
            assert n == want.lengths[r]
            assert torch.equal(table[torch.from_numpy(index)], want.inputs_embeds[r, want.length - n:])
            assert not want.attention_mask[r, : want.length - n].any()  # the rest is padding


def test_streams_joined_with_gathered_prompts_give_their_frames_alone(model, requests):
    alone = {key: list(EagerFrameGenerator(model, req, "cpu")) for key, req in requests.items()}
    stepper = BatchedStepper(model, 5, "cpu", batch_joins=True)
    keys = list(requests)
    assert stepper.join([(key, requests[key]) for key in keys[:3]]) == {}
    frames: dict = {key: [] for key in keys}
    joined_late = False
    while len(stepper):
        for key, outcome in stepper.step().items():
            assert outcome.error is None
            if outcome.frame is not None:
                frames[key].append(outcome.frame)
        if not joined_late:  # two more join mid-flight, in one batched join
            assert stepper.join([(key, requests[key]) for key in keys[3:]]) == {}
            joined_late = True
    for key in keys:
        assert len(frames[key]) == len(alone[key]) > 0, key
        assert all(torch.equal(a, b) for a, b in zip(frames[key], alone[key])), key
