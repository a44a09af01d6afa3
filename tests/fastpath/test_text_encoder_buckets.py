"""The joins' text encoder (engine/fastpath/prompt.py) runs padded, power-of-two batches, split into chunks;
on the CPU in FP32 (`use_graphs=False`: the same padded batches, eagerly) every segment's states equal the
model's own unpadded encoding, and the keys captured at start-up cover every batch a join can bring."""

from __future__ import annotations

import itertools

import pytest
import torch

from breeze_worker.engine.fastpath.prompt import (
    MAX_TEXT_SEGMENTS,
    TEXT_BUCKETS,
    TextEncoderGraphs,
    keys_for,
    plan,
)
from breeze_worker.engine.prompt import lay_out
from breeze_worker.engine.types import ResolvedReference, Template
from breeze_worker.model import prompts


def _segments(model, lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.text_encoder.vocab_size
    return [torch.randint(1, min(vocab, 5000), (n,), generator=g) for n in lengths]


@pytest.mark.parametrize("lengths, max_tokens", [
    ([5], 4096),  # one segment, one filler-free row
    ([7, 3, 12], 4096),  # three rows padded to four
    ([30, 2, 17, 9, 25, 31, 1], 64),  # 32-token bucket, 2 rows per chunk: four chunks, the last one padded
    ([40, 3, 60], 128),  # 64-token bucket, 2 rows per chunk
    ([40, 3, 60, 120, 5, 70], 256),  # three buckets (32, 64, 128), each chunked; starts follow the input order
])
def test_padded_chunks_equal_the_unpadded_encoding(model, lengths, max_tokens):
    segments = _segments(model, lengths)
    want = model.lm.encode_segments(segments)
    encoder = TextEncoderGraphs(model.lm, torch.device("cpu"), use_graphs=False, max_tokens=max_tokens)
    got = encoder.encode_segments(segments)
    assert [g.shape for g in got] == [w.shape for w in want]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_plan_chunks_stay_within_the_token_budget_and_cover_every_segment():
    for count, longest, max_tokens in itertools.product([1, 2, 3, 5, 64, 130, 256], [1, 31, 33, 200, 512],
                                                        [512, 4096]):
        lengths = [1 + (i * 37) % longest for i in range(count - 1)] + [longest]
        chunks = plan(lengths, max_tokens)
        covered = sorted(i for _, members, _ in chunks for i in members)
        assert covered == list(range(count))
        for length, members, rows in chunks:
            # every segment in its own (smallest) bucket: a long one pads no short one
            assert all(lengths[i] <= length and not any(lengths[i] <= b for b in TEXT_BUCKETS if b < length)
                       for i in members)
            assert members == sorted(members) and rows >= len(members) and rows & (rows - 1) == 0
            assert rows * length <= max_tokens or rows == 1
            assert (rows, length) in keys_for(count, max_tokens)  # start-up captured it
    assert plan([513]) is None and plan([]) is None and plan([3, 513]) is None


def test_a_long_segment_leaves_the_short_ones_in_their_bucket():
    chunks = plan([10] * 6 + [300], 4096)
    assert chunks == [(32, [0, 1, 2, 3, 4, 5], 8), (512, [6], 1)]


def test_a_request_brings_at_most_max_text_segments(model):
    """The start-up capture sizes joins by MAX_TEXT_SEGMENTS per request: every template, CFG on and off, and
    the direction template with two guidance scales."""
    reference = ResolvedReference(reference_id="ref-" + "0" * 32, transcript="a reference line",
                                  codes=torch.zeros((3, 16), dtype=torch.int64).numpy(), seconds=0.24)
    counts = []
    for template in Template:
        for cfg in (False, True):
            ref = reference if template.value in (prompts.CLONE, prompts.DIRECTION) else None
            instruction = "calmly" if template.value in (prompts.INSTRUCTION, prompts.DIRECTION) else None
            try:
                laid = lay_out(model.tokenizer, template, "some text", instruction, ref, cfg)
            except ValueError:  # CFG on a template without a negative prompt
                continue
            counts.append(sum(len(layout.text_segments()) for layout in laid.layouts))
    dual = lay_out(model.tokenizer, Template.DIRECTION, "some text", "calmly", reference, True, dual=True)
    assert len(dual.layouts) == 3
    counts.append(sum(len(layout.text_segments()) for layout in dual.layouts))
    assert max(counts) == MAX_TEXT_SEGMENTS == counts[-1]
