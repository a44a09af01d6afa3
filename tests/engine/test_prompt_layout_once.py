"""A request's prompt is laid out (tokenized) once, when it is resolved (engine/prompt.py): the resolved request
carries its layouts, and joining it (batched or alone), the batch-1 fast generator and the eager reference
encode those layouts without tokenizing again. A request resolved without a tokenizer, or changed after its
resolution, is laid out at the join instead, and gives the frames of one resolved with its layouts."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from breeze_worker.engine.batching import BatchedStepper
from breeze_worker.engine.eager import EagerFrameGenerator
from breeze_worker.engine.fastpath.generator import FastFrameGenerator
from breeze_worker.engine.fastpath.graph import clear_runners
from breeze_worker.engine.prompt import lay_out, prompt_layouts
from breeze_worker.engine.request import resolve_request
from breeze_worker.engine.types import ReferenceInput, ResolvedReference, SynthesisRequest
from breeze_worker.model import prompt_templates as templates

REF = ResolvedReference("r", "ref words", np.random.RandomState(0).randint(0, 2048, (6, 16)), 0.48)


def _resolve(model, tokenizer=True, reference=None, **kwargs):
    kwargs.setdefault("text", "Hello world")
    kwargs.setdefault("seed", 11)
    kwargs.setdefault("max_frames", 3)
    if reference is not None:
        kwargs["reference"] = ReferenceInput(audio=b"RIFF", transcript=reference.transcript)
    return resolve_request(SynthesisRequest(**kwargs), model.generation_defaults, reference,
                           tokenizer=model.tokenizer if tokenizer else None)


@pytest.fixture
def layouts_made(monkeypatch):
    """Counts every prompt laid out (model/templates.build_prompts, one per branch: the tokenizer's work)."""
    calls = []
    real = templates.build_prompts
    monkeypatch.setattr(templates, "build_prompts",
                        lambda tokenizer, branches: calls.extend([1] * len(branches)) or real(tokenizer, branches))
    return calls


def _run(stepper, joiners):
    assert stepper.join(joiners) == {}
    out = {key: [] for key, _ in joiners}
    while len(stepper):
        for key, outcome in stepper.step().items():
            assert outcome.error is None
            if outcome.frame is not None:
                out[key].append(outcome.frame)
    return out


def test_resolution_carries_the_layouts_the_join_would_make(tiny):
    plain, guided = _resolve(tiny), _resolve(tiny, instruction="calm", cfg_scale=2.0, reference=REF)
    assert len(plain.prompt.layouts) == 1 and len(guided.prompt.layouts) == 2  # CFG: positive and negative
    for request in (plain, guided):
        fresh = lay_out(tiny.tokenizer, request.template, request.text, request.instruction, request.reference,
                        request.uses_cfg)
        assert [layout.input_ids for layout in request.prompt.layouts] == [f.input_ids for f in fresh.layouts]
        assert prompt_layouts(tiny, request) == list(request.prompt.layouts)
    # the resolved request still compares and prints by its parameters alone
    assert dataclasses.replace(plain, prompt=None) == plain and "prompt=" not in repr(plain)


@pytest.mark.parametrize("batch_joins", [True, False])
def test_joining_tokenizes_nothing_more(tiny, layouts_made, batch_joins):
    requests = {"a": _resolve(tiny), "b": _resolve(tiny, instruction="calm", cfg_scale=2.0, seed=5),
                "c": _resolve(tiny, text="Another one", reference=REF)}
    assert len(layouts_made) == 4  # one layout per branch, at resolution
    stepper = BatchedStepper(tiny, 3, "cpu", batch_joins=batch_joins)
    frames = _run(stepper, list(requests.items()))
    assert all(len(f) == 3 for f in frames.values())
    assert len(layouts_made) == 4


def test_the_generators_tokenize_nothing_more(tiny, layouts_made):
    request = _resolve(tiny, instruction="calm", cfg_scale=2.0)
    assert len(layouts_made) == 2
    clear_runners()
    fast = list(FastFrameGenerator(tiny, request, "cpu"))
    clear_runners()
    eager = list(EagerFrameGenerator(tiny, request, "cpu"))
    assert len(layouts_made) == 2
    assert len(fast) == 3 and all(torch.equal(a, b) for a, b in zip(fast, eager))


def test_without_carried_layouts_the_join_lays_out_and_gives_the_same_frames(tiny, layouts_made):
    carried = _resolve(tiny, instruction="calm", cfg_scale=2.0)
    bare = _resolve(tiny, tokenizer=False, instruction="calm", cfg_scale=2.0)
    assert bare.prompt is None and len(layouts_made) == 2
    with_layouts = _run(BatchedStepper(tiny, 1, "cpu"), [("x", carried)])["x"]
    assert len(layouts_made) == 2
    laid_at_join = _run(BatchedStepper(tiny, 1, "cpu"), [("x", bare)])["x"]
    assert len(layouts_made) == 4  # positive and negative, laid out at the join
    assert len(with_layouts) == 3 and all(torch.equal(a, b) for a, b in zip(with_layouts, laid_at_join))


def test_a_request_changed_after_resolution_is_laid_out_again(tiny):
    request = _resolve(tiny)
    changed = dataclasses.replace(request, text="Something else entirely")
    assert changed.prompt is request.prompt  # carried along by replace, but made from the old text
    fresh = lay_out(tiny.tokenizer, changed.template, changed.text, None, None, False).layouts
    assert [layout.input_ids for layout in prompt_layouts(tiny, changed)] == [layout.input_ids for layout in fresh]
    assert prompt_layouts(tiny, changed)[0].input_ids != request.prompt.layouts[0].input_ids
