"""Sync-free sampling shared by the eager reference and the fast path.

Everything here is element-wise or fixed-shape tensor work: no `.item()`, no `torch.multinomial`, no
data-dependent shapes, so one frame's sampling can live inside a CUDA graph.

Sampling uses the exponential race (Gumbel-max): `argmax(logits - log(q))` with `q ~ Exp(1)` draws a
token with probability `softmax(logits)`. The noise comes from a counter-based generator: a hash of
(request seed, frame index, codebook, token id), computed with 32-bit lanes inside int64 so no product
overflows. Each request therefore owns its own random stream, independent of its row in a batch, of the
other requests beside it, and of the device (CPU and CUDA compute the same integers).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_M32 = 0xFFFFFFFF
_MUL_A = 0x7FEB352D  # odd multipliers below 2**31: a 32-bit lane times one stays below 2**63
_MUL_B = 0x2C1B3C6D
_GOLDEN = 0x61C88647


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit avalanche mixer on int64 tensors holding values in [0, 2**32)."""
    x = x & _M32
    x = x ^ (x >> 16)
    x = (x * _MUL_A) & _M32
    x = x ^ (x >> 15)
    x = (x * _MUL_B) & _M32
    x = x ^ (x >> 16)
    return x


def noise_hash(seed: torch.Tensor, draw: torch.Tensor, vocab: int) -> torch.Tensor:
    """The 32-bit hashes [R, K, vocab] (int64) behind the noise of rows `seed` [R] and draw counters
    `draw` [R, K] (frame * 16 + codebook)."""
    seed = seed.to(torch.int64)
    row = _mix32(_mix32(seed & _M32) ^ ((seed >> 32) & _M32))
    row = _mix32(row[:, None] ^ (draw & _M32))
    ids = torch.arange(vocab, device=seed.device, dtype=torch.int64)
    x = _mix32(row[:, :, None] ^ ((ids[None, None, :] * _GOLDEN) & _M32))
    return _mix32(x + _GOLDEN)


def _noise(seed: torch.Tensor, draw: torch.Tensor, vocab: int) -> torch.Tensor:
    """Exp(1) noise [R, K, vocab] for rows `seed` [R] and draw counters `draw` [R, K] (frame * 16 + codebook)."""
    return -torch.log(uniform_open(noise_hash(seed, draw, vocab)))


def uniform_open(x: torch.Tensor) -> torch.Tensor:
    """float32 uniforms strictly inside (0, 1) from int64 hashes in [0, 2**32).

    The top 23 bits k give (k + 0.5) / 2**23: both k + 0.5 (24 significant bits) and the power-of-two
    scale are exact in float32, so the result is never rounded to 0 or 1; it lies in
    [2**-24, 1 - 2**-24]. Hence the Exp(1) noise -log(u) lies in [~6e-8, ~16.6]: never 0 (its log would be
    -inf, and a filtered logit minus -inf is NaN, which argmax would pick) and never infinite.
    """
    return ((x >> 9).to(torch.float32) + 0.5) * (1.0 / 8388608.0)


def exponential_noise(seed: torch.Tensor, frame: torch.Tensor, codebook: int, vocab: int) -> torch.Tensor:
    """Exp(1) noise [R, vocab] (float32) for rows with `seed` [R] and `frame` [R] (int64), one codebook.

    The same (seed, frame, codebook) always gives the same noise, on any device and in any batch row.
    """
    return _noise(seed, (frame.to(torch.int64) * 16 + codebook)[:, None], vocab)[:, 0]


@dataclass
class RowSampling:
    """Per-row sampling settings as device tensors, one row per stream (CFG rows are combined first)."""

    temperature: torch.Tensor  # float32 [R]; 0 means greedy
    top_k: torch.Tensor  # int64 [R]; 0 means no top-k
    top_p: torch.Tensor  # float32 [R]; 1 means no nucleus filter
    repetition_penalty: torch.Tensor  # float32 [R]; 1 disables
    seed: torch.Tensor  # int64 [R]

    @classmethod
    def from_params(cls, params: list, seeds: list[int], device: torch.device | str) -> RowSampling:
        """Build from `SamplingParams`-like objects (temperature, top_k, top_p, repetition_penalty)."""
        return cls(
            temperature=torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device),
            top_k=torch.tensor([p.top_k for p in params], dtype=torch.int64, device=device),
            top_p=torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
            repetition_penalty=torch.tensor(
                [p.repetition_penalty for p in params], dtype=torch.float32, device=device
            ),
            seed=torch.tensor(seeds, dtype=torch.int64, device=device),
        )

    def copy_(self, other: RowSampling) -> None:
        """Copy another instance's values into these tensors in place (static buffers for graphs)."""
        for name in ("temperature", "top_k", "top_p", "repetition_penalty", "seed"):
            getattr(self, name).copy_(getattr(other, name))


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """CTRL-style penalty on tokens already in the row's history (`seen` bool [R, V]): divide positive
    logits by the penalty, multiply negative ones."""
    p = penalty[:, None]
    penalized = torch.where(logits > 0, logits / p, logits * p)
    return torch.where(seen, penalized, logits)


def sample_rows(
    logits: torch.Tensor,
    rows: RowSampling,
    frame: torch.Tensor,
    codebook: int,
    blocked: torch.Tensor | None = None,
    noise: torch.Tensor | None = None,
    pairwise: bool = False,
) -> torch.Tensor:
    """Sample one token per row from float32 `logits` [R, V]: mask `blocked` ids (bool [V]), then
    temperature, top-k, top-p, exponential race. Greedy rows take the argmax. Returns int64 [R].

    `noise` [R, V], if given, must equal `exponential_noise(rows.seed, frame, codebook, V)` (the fast path
    computes all codebooks' noise of a frame in one batch, see `frame_noise`). `pairwise`: the same filters
    without a sort (`_pairwise_keep`)."""
    scaled, keep = filter_rows(logits, rows, blocked, pairwise)
    filtered = scaled.masked_fill(~keep, float("-inf"))

    if noise is None:
        noise = exponential_noise(rows.seed, frame, codebook, scaled.shape[-1])
    drawn = torch.argmax(filtered - torch.log(noise), dim=-1)
    best = torch.argmax(filtered, dim=-1)
    return torch.where(rows.temperature <= 0, best, drawn)


def filter_rows(logits: torch.Tensor, rows: RowSampling, blocked: torch.Tensor | None = None,
                pairwise: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """`sample_rows`' filters: the rows' float32 logits with `blocked` ids masked and divided by their
    temperature (1 for greedy rows), and the tokens top-k then top-p keep (bool [R, V])."""
    logits = logits.float()
    if blocked is not None:
        logits = logits.masked_fill(blocked[None, :], float("-inf"))
    temperature = torch.where(rows.temperature <= 0, torch.ones_like(rows.temperature), rows.temperature)
    scaled = logits / temperature[:, None]
    vocab = scaled.shape[-1]
    k = torch.where(rows.top_k > 0, rows.top_k.clamp(max=vocab), torch.full_like(rows.top_k, vocab))
    keep = _pairwise_keep(scaled, k, rows.top_p) if pairwise else _sorted_keep(scaled, k, rows.top_p)
    return scaled, keep


def _sorted_keep(scaled: torch.Tensor, k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Top-k then top-p over the sorted row: the tokens kept, bool [R, V]."""
    sorted_logits, _ = torch.sort(scaled, dim=-1, descending=True)
    kth = sorted_logits.gather(-1, (k - 1)[:, None])
    keep = scaled >= kth
    # nucleus: keep the smallest prefix of the sorted distribution whose mass reaches top_p
    sorted_probs = torch.softmax(sorted_logits.masked_fill(sorted_logits < kth, float("-inf")), dim=-1)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    # top_p 1 means no nucleus filter, whatever the rounding of the mass near 1
    in_nucleus = (mass_before < top_p[:, None]) | (top_p[:, None] >= 1.0)
    in_nucleus[:, 0] = True  # the most likely token is always in
    # the smallest logit still inside the nucleus, per row
    nucleus_floor = torch.where(in_nucleus, sorted_logits, torch.full_like(sorted_logits, float("inf")))
    return keep & (scaled >= nucleus_floor.min(dim=-1, keepdim=True).values)


def _pairwise_keep(scaled: torch.Tensor, k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """`_sorted_keep` without sorting, from comparisons of every token with every other (V^2 per row, two
    fused reductions once compiled; at a few rows cheaper than sorting 2051 values per row).

    A token is in the top k exactly when fewer than k tokens are strictly larger (integer counts: the same
    set as `scaled >= kth`, ties included). Its nucleus test uses the probability mass of the strictly
    larger kept tokens, which is the sorted prefix's mass before the first token of its value; the nucleus
    floor is therefore the same value. The sums differ from the sorted cumulative sum only by FP32
    rounding order (top_p 1 filters nothing in both, whatever that rounding)."""
    greater = scaled[:, None, :] > scaled[:, :, None]  # [R, j, i]: token i strictly larger than token j
    above = greater.sum(-1)
    keep = above < k[:, None]
    probs = torch.softmax(scaled.masked_fill(~keep, float("-inf")), dim=-1)
    mass_above = (probs[:, None, :] * greater).sum(-1)
    in_nucleus = keep & ((mass_above < top_p[:, None]) | (above == 0) | (top_p[:, None] >= 1.0))
    floor = torch.where(in_nucleus, scaled, torch.full_like(scaled, float("inf"))).min(dim=-1, keepdim=True).values
    return keep & (scaled >= floor)


def frame_noise(seed: torch.Tensor, frame: torch.Tensor, codebooks: int, vocab: int) -> torch.Tensor:
    """`exponential_noise` for codebooks 0..codebooks-1 at once: [R, codebooks, vocab], bit-identical to
    calling it per codebook (same integer hash), in one batch of element-wise kernels."""
    book = torch.arange(codebooks, device=seed.device, dtype=torch.int64)
    return _noise(seed, frame.to(torch.int64)[:, None] * 16 + book[None, :], vocab)
