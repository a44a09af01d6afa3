"""The sort-free top-k / top-p filter of the fused forms (engine/sampling.py `_pairwise_keep`) keeps the same
tokens as the sorted reference (`_sorted_keep`), ties and blocked ids included, and samples the same codes."""

from __future__ import annotations

import torch

from breeze_worker.engine.sampling import RowSampling, _pairwise_keep, _sorted_keep, sample_rows


def _rows(n: int, top_k: list[int], top_p: list[float]) -> RowSampling:
    return RowSampling(temperature=torch.full((n,), 0.9), top_k=torch.tensor(top_k), top_p=torch.tensor(top_p),
                       repetition_penalty=torch.ones(n), seed=torch.arange(n, dtype=torch.int64) * 7 + 3)


def test_pairwise_filter_keeps_the_sorted_filters_tokens():
    g = torch.Generator().manual_seed(0)
    vocab = 300
    logits = torch.randn(8, vocab, generator=g) * 3
    logits[1] = logits[1].clamp(max=2.0)
    logits[1, :40] = 5.0  # a tie group of 40 at the top, straddling top-k 10
    logits[7, :3] = 20.0  # three tied leaders holding most of the mass: the nucleus boundary inside a tie
    logits[2, 5:] = float("-inf")  # fewer finite tokens than top_k
    logits[3] = 1.0  # every token tied
    logits[4, 100:] = float("-inf")
    top_k = torch.tensor([50, 10, 20, 7, 0, 1, 0, 299])
    top_p = torch.tensor([1.0, 1.0, 0.9, 0.3, 0.8, 1.0, 1.0, 0.5])
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
    sorted_keep, pairwise_keep = _sorted_keep(logits, k, top_p), _pairwise_keep(logits, k, top_p)
    assert torch.equal(sorted_keep, pairwise_keep)
    # the filters do something: some rows keep strictly fewer tokens than top-k alone would
    assert (pairwise_keep.sum(-1) < torch.minimum(k, torch.isfinite(logits).sum(-1))).any()
    assert pairwise_keep[1].sum() == 40 and pairwise_keep[3].sum() == vocab  # ties kept whole, as sorted
    assert pairwise_keep[7].sum() == 3 and pairwise_keep[6].sum() == vocab  # top_p 1: no nucleus filter


def test_pairwise_sampling_draws_the_same_codes():
    g = torch.Generator().manual_seed(1)
    n, vocab = 6, 2051
    rows = _rows(n, [50, 0, 5, 50, 2051, 1], [1.0, 0.9, 1.0, 0.7, 0.95, 1.0])
    blocked = torch.zeros(vocab, dtype=torch.bool)
    blocked[2048:] = True
    frame = torch.zeros(n, dtype=torch.int64)
    same = 0
    for codebook in range(16):
        logits = torch.randn(n, vocab, generator=g) * 4
        a = sample_rows(logits, rows, frame, codebook, blocked)
        b = sample_rows(logits, rows, frame, codebook, blocked, pairwise=True)
        assert torch.equal(a, b)
        same += int((a == sample_rows(logits, rows, frame + 1, codebook, blocked, pairwise=True)).sum())
    assert same < 16 * n  # the noise matters: another frame index draws other codes
