"""Sampling on the GPU: the Triton sampling kernel against the torch sampler, and no sampler ever drawing a
token its filters cut or a reserved id.

- The kernel (engine/fastpath/fused_sampling.py, the committed launch plan) keeps exactly the torch sampler's
  token set and draws its codes (engine/sampling.py `filter_rows` / `sample_rows`), flags non-finite rows,
  over 1-48 streams, both widths (2051 depth classes, 2052 for codebook 0), ties, nucleus and greedy rows.
- 200,000 draws each through the torch sampler (sorted and pairwise filters) and the kernel, random logits,
  default filters (temperature 0.9, top-k 50, top-p 1), the reserved ids 2048-2050 blocked: every code is a
  kept, unblocked token; again with every cut token given the smallest noise the generator makes (the draw
  most likely to escape a filter if the noise could reach 0).
- The reported requests (default sampling, "Hello world.", 3 frames, seeds 9095, 536954, 764867; each ended in
  INTERNAL before the noise fix) finish normally through the real engine on CUDA (batched stepper, graphs).
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from gpu_support import release_device_memory

from breeze_worker.engine.fastpath import fused_sampling
from breeze_worker.engine.sampling import RowSampling, exponential_noise, filter_rows, sample_rows, uniform_open

pytestmark = pytest.mark.gpu

RESERVED = (2048, 2049, 2050)
CRASHING_SEEDS = (9095, 536954, 764867)


def _blocked(vocab: int, device) -> torch.Tensor:
    blocked = torch.zeros(vocab, dtype=torch.bool, device=device)
    blocked[list(RESERVED)] = True  # 2051, codebook 0's end of speech, stays open
    return blocked


def _mixed_rows(streams: int, device) -> RowSampling:
    """Default rows, nucleus rows, a row without top-k, a top-k 7 row; the last row greedy."""
    top_k = [(50, 50, 0, 7)[s % 4] for s in range(streams)]
    top_p = [(1.0, 0.9, 0.7, 1.0)[s % 4] for s in range(streams)]
    temperature = [0.9] * streams
    if streams > 1:
        temperature[-1] = 0.0
    return RowSampling(temperature=torch.tensor(temperature, device=device),
                       top_k=torch.tensor(top_k, device=device), top_p=torch.tensor(top_p, device=device),
                       repetition_penalty=torch.ones(streams, device=device),
                       seed=torch.arange(streams, dtype=torch.int64, device=device) * 17 + 5)


@pytest.mark.parametrize("streams,vocab,ties", [(1, 2051, False), (2, 2052, False), (8, 2051, True),
                                                (16, 2052, False), (32, 2051, True), (48, 2052, False)])
def test_sampling_kernel_matches_the_torch_sampler(cuda, streams, vocab, ties):
    generator = torch.Generator(device=cuda).manual_seed(streams)
    logits = torch.randn(streams, vocab, generator=generator, device=cuda) * 3
    if ties:  # values on a coarse grid: runs of equal logits around every threshold
        logits = (logits * 2).round() / 2
    rows, blocked = _mixed_rows(streams, cuda), _blocked(vocab, cuda)
    frame = torch.full((streams,), 3, dtype=torch.int64, device=cuda)
    noise = exponential_noise(rows.seed, frame, 4, vocab)
    flags = torch.zeros(streams, dtype=torch.bool, device=cuda)
    keep = torch.zeros(streams, vocab, dtype=torch.int8, device=cuda)
    code = fused_sampling.sample(logits, rows, blocked, torch.log(noise), flags, keep_out=keep)
    assert torch.equal(keep.bool(), filter_rows(logits, rows, blocked)[1])
    assert torch.equal(code, sample_rows(logits, rows, frame, 4, blocked, noise=noise))
    assert not bool(flags.any())
    bad = logits.clone()
    bad[0, 3] = float("nan")
    flags.zero_()
    fused_sampling.sample(bad, rows, blocked, torch.log(noise), flags)
    assert bool(flags[0]) and not bool(flags[1:].any())


def _draws(device, rows_n: int, positions: int, seed: int):
    """`positions` (frame, codebook) positions for `rows_n` streams with their own seeds: per position, random
    logits [rows_n, V] (V = 2052 for codebook 0, else 2051) and the rows' settings (the defaults)."""
    generator = torch.Generator(device=device).manual_seed(seed)
    seeds = torch.randint(0, 2**62, (rows_n,), generator=generator, device=device)
    rows = RowSampling(temperature=torch.full((rows_n,), 0.9, device=device),
                       top_k=torch.full((rows_n,), 50, dtype=torch.int64, device=device),
                       top_p=torch.ones(rows_n, device=device), repetition_penalty=torch.ones(rows_n, device=device),
                       seed=seeds)
    for position in range(positions):
        frame_index, codebook = divmod(position, 16)
        vocab = 2052 if codebook == 0 else 2051
        logits = torch.randn(rows_n, vocab, generator=generator, device=device) * 3
        yield rows, torch.full((rows_n,), frame_index, dtype=torch.int64, device=device), codebook, logits


def escaped_draws(device, sampler: str, extreme: bool, streams: int, positions: int, chunk: int) -> tuple[int, int]:
    """(draws, draws outside the filters or reserved) over `streams` streams x `positions` positions, `chunk`
    streams at a time. `sampler`: "sorted" or "pairwise" (engine/sampling.py), or "kernel" (the sampling
    kernel). `extreme`: every token the filters cut gets the smallest noise there is (the largest hash)."""
    draws = escaped = 0
    smallest = -torch.log(uniform_open(torch.tensor(2**32 - 1, device=device)))
    for part in range(streams // chunk):
        for rows, frame, codebook, logits in _draws(device, chunk, positions, seed=part):
            vocab = logits.shape[1]
            blocked = _blocked(vocab, device)
            _, keep = filter_rows(logits, rows, blocked, pairwise=sampler == "pairwise")
            noise = exponential_noise(rows.seed, frame, codebook, vocab)
            if extreme:
                noise = torch.where(keep, noise, smallest)
            if sampler == "kernel":
                flags = torch.zeros(chunk, dtype=torch.bool, device=device)
                code = fused_sampling.sample(logits, rows, blocked, torch.log(noise), flags)
                escaped += int(flags.sum())  # a finite row flagged non-finite counts against the kernel too
            else:
                code = sample_rows(logits, rows, frame, codebook, blocked, noise=noise,
                                   pairwise=sampler == "pairwise")
            inside = keep.gather(1, code[:, None])[:, 0] & ~blocked[code]
            escaped += int((~inside).sum())
            draws += chunk
    return draws, escaped


@pytest.mark.parametrize("sampler", ["sorted", "pairwise", "kernel"])
@pytest.mark.parametrize("extreme", [False, True], ids=["noise", "extreme-noise"])
def test_sampler_never_leaves_its_filter(cuda, sampler, extreme):
    """200,000 draws (1,000 streams x 200 positions): each code is kept by the filters and not reserved.
    `extreme`: the old noise rounded the largest hash's uniform to 1, its noise to 0, and drew the cut token."""
    chunk = 100 if sampler == "pairwise" else 1000  # the pairwise filter holds V x V comparisons a row
    draws, escaped = escaped_draws(cuda, sampler, extreme, streams=1000, positions=200, chunk=chunk)
    assert draws == 200_000
    assert escaped == 0


def test_the_seeds_that_crashed_finish_on_the_gpu(cuda, tmp_path):
    """The reported requests through the engine on CUDA (the tiny default in FP32, as reported; the batched
    stepper with its graphs and the sampling kernel): each ends normally with all its audio and an artifact."""
    from breeze_worker.artifacts.store import ArtifactStore
    from breeze_worker.config import ArtifactSettings, EngineSettings
    from breeze_worker.engine.service import Engine
    from breeze_worker.engine.types import AudioChunk, EndReason, JobFinished, SynthesisRequest

    async def run_all():
        engine = Engine(EngineSettings(device=str(cuda), precision="fp32", max_active_streams=len(CRASHING_SEEDS)),
                        ArtifactStore(ArtifactSettings(directory=tmp_path)))
        await engine.start()
        try:
            async def one(seed: int):
                samples, finished = 0, None
                async for event in engine.synthesize(SynthesisRequest(text="Hello world.", seed=seed, max_frames=3)):
                    if isinstance(event, AudioChunk):
                        samples += event.num_samples
                    elif isinstance(event, JobFinished):
                        finished = event
                return samples, finished

            return await asyncio.gather(*(one(seed) for seed in CRASHING_SEEDS))
        finally:
            await engine.stop()

    try:
        results = asyncio.run(run_all())
    finally:
        release_device_memory()
    for samples, finished in results:
        assert finished is not None and finished.stats.end_reason in (EndReason.FRAME_LIMIT, EndReason.END_OF_SPEECH)
        assert finished.artifact is not None and samples == finished.stats.frames * 1920
