"""The sampler never leaves its own filter: the exponential-race noise is never 0 or infinite, whatever the
hash, so a filtered or reserved id (2048..2050) can never win the race; and a code the codec cannot decode is
never handed to it, whatever produced it.

Before, `((x >> 8) + 0.5) / 2**24` in float32 rounded to exactly 1.0 for the largest hash: the noise was 0,
its log -inf, a filtered logit minus -inf NaN, and argmax picked the NaN's index (~1.2e-4 of draws)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from breeze_worker.artifacts.store import ArtifactStore
from breeze_worker.config import ArtifactSettings, EngineSettings
from breeze_worker.engine.sampling import RowSampling, exponential_noise, noise_hash, sample_rows, uniform_open
from breeze_worker.engine.service import Engine
from breeze_worker.engine.types import AudioChunk, EndReason, JobFinished, SynthesisRequest
from breeze_worker.errors import CodeOutOfRange

VOCAB = 2052  # codebook 0's classes: 0..2047 codes, 2048..2050 reserved, 2051 end of speech
RESERVED = [2048, 2049, 2050]
# seeds whose default-sampling draws for "Hello world." (3 frames, tiny default) hit the largest hash at a
# filtered id: each ended in INTERNAL (IndexError in the codec) before the fix
CRASHING_SEEDS = (9095, 536954, 764867)


def test_the_uniforms_never_reach_either_end():
    ends = torch.tensor([0, 1, 511, 512, 2**31, 2**32 - 513, 2**32 - 512, 2**32 - 1], dtype=torch.int64)
    u = uniform_open(ends)
    assert bool(((u > 0) & (u < 1)).all()), u.tolist()
    assert u[-1].item() == 1 - 2**-24 and u[0].item() == 2**-24  # exact: no rounding at either end
    noise = -torch.log(u)
    assert bool((noise > 0).all() & torch.isfinite(torch.log(noise)).all())


def _extreme_draws(seed: int, draws: int, vocab: int) -> list[tuple[int, int]]:
    """(draw counter, token id) pairs whose hash is in the top 2**9 values (uniform = 1 - 2**-24)."""
    x = noise_hash(torch.tensor([seed]), torch.arange(draws)[None, :], vocab)[0]
    hits = ((x >> 9) == (2**23 - 1)).nonzero().tolist()
    return [(int(d), int(t)) for d, t in hits]


def test_a_blocked_token_at_the_largest_hash_is_never_drawn():
    """Real counter values whose hash is the largest: block exactly that token and sample that draw."""
    hits = _extreme_draws(seed=7, draws=8192, vocab=VOCAB)
    assert len(hits) >= 2  # ~2**-23 per token: 8192 draws x 2052 ids hold about 2
    for draw, token in hits:
        frame, codebook = divmod(draw, 16)
        rows = RowSampling(temperature=torch.tensor([0.9]), top_k=torch.tensor([50]), top_p=torch.tensor([1.0]),
                           repetition_penalty=torch.tensor([1.0]), seed=torch.tensor([7]))
        noise = exponential_noise(rows.seed, torch.tensor([frame]), codebook, VOCAB)
        assert bool(torch.isfinite(torch.log(noise)).all()) and noise[0, token].item() > 0
        logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(draw))
        blocked = torch.zeros(VOCAB, dtype=torch.bool)
        blocked[token] = True
        code = sample_rows(logits, rows, torch.tensor([frame]), codebook, blocked)
        assert code.item() != token
        logits[0, token] = logits.max() + 5.0  # most likely, but cut by top-k 1 (another token is kept)
        rows.top_k.fill_(1)
        blocked[token] = False
        logits[0, (token + 1) % VOCAB] = logits.max() + 5.0
        code = sample_rows(logits, rows, torch.tensor([frame]), codebook, blocked)
        assert code.item() == (token + 1) % VOCAB


@pytest.mark.parametrize("pairwise", [False, True], ids=["sorted", "pairwise"])
def test_many_draws_stay_inside_the_filter(pairwise):
    """40,000 draws (the old noise escaped its filter ~5 times in as many) over random logits, default
    filters (top-k 50, reserved ids blocked): every code is a kept, unblocked token. The pairwise filter
    (V^2 per row) gets a small sample: it shares the noise, only its kept set is computed differently."""
    rows_n, frames = (250, 10) if not pairwise else (4, 2)
    vocab = VOCAB
    gen = torch.Generator().manual_seed(1234)
    blocked = torch.zeros(vocab, dtype=torch.bool)
    blocked[RESERVED] = True
    from breeze_worker.engine.sampling import filter_rows

    draws = 0
    for frame_index in range(frames):
        rows = RowSampling(temperature=torch.full((rows_n,), 0.9), top_k=torch.full((rows_n,), 50),
                           top_p=torch.full((rows_n,), 1.0), repetition_penalty=torch.ones(rows_n),
                           seed=torch.randint(0, 2**62, (rows_n,), generator=gen))
        frame = torch.full((rows_n,), frame_index)
        for codebook in range(16):
            logits = torch.randn(rows_n, vocab, generator=gen) * 3
            _, keep = filter_rows(logits, rows, blocked, pairwise)
            code = sample_rows(logits, rows, frame, codebook, blocked, pairwise=pairwise)
            assert bool(keep.gather(1, code[:, None]).all())
            assert not bool(blocked[code].any())
            draws += rows_n
    assert draws == rows_n * frames * 16


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    torch.set_num_threads(1)
    store = ArtifactStore(ArtifactSettings(directory=tmp_path_factory.mktemp("artifacts")))
    eng = Engine(EngineSettings(device="cpu", max_active_streams=4), store)
    asyncio.run(eng.start())
    yield eng
    asyncio.run(eng.stop())


async def _run(engine, request) -> tuple[int, JobFinished]:
    samples, finished = 0, None
    async for event in engine.synthesize(request):
        if isinstance(event, AudioChunk):
            samples += event.num_samples
        elif isinstance(event, JobFinished):
            finished = event
    return samples, finished


def test_the_seeds_that_crashed_now_finish(engine):
    """The reported requests: default sampling, "Hello world.", 3 frames, the tiny default."""
    async def all_seeds():
        return await asyncio.gather(*(_run(engine, SynthesisRequest(text="Hello world.", seed=s, max_frames=3))
                                      for s in CRASHING_SEEDS))

    for samples, finished in asyncio.run(all_seeds()):
        assert finished.stats.end_reason in (EndReason.FRAME_LIMIT, EndReason.END_OF_SPEECH)
        assert samples == finished.stats.frames * 1920 and finished.artifact is not None


def test_an_out_of_range_code_fails_its_stream_only(engine, monkeypatch):
    """Whatever the stepper hands over, a code outside [0, 2048) is never decoded: that stream ends with
    INTERNAL's CodeOutOfRange naming the code, and a stream beside it gets all its audio."""
    stepper = engine.scheduler._stepper
    step = stepper.step
    poisoned = 4242

    def poison(**kwargs):
        outcomes = step(**kwargs)
        for job, out in outcomes.items():
            if job.params.seed == poisoned and out.frame is not None:
                out.frame[3] = 2049  # a reserved id in codebook 3
        return outcomes

    monkeypatch.setattr(stepper, "step", poison)

    async def both():
        bad = _run(engine, SynthesisRequest(text="Hello world.", seed=poisoned, max_frames=3))
        good = _run(engine, SynthesisRequest(text="Hello world.", seed=5, max_frames=3))
        return await asyncio.gather(bad, good, return_exceptions=True)

    bad, good = asyncio.run(both())
    assert isinstance(bad, CodeOutOfRange) and "2049" in str(bad) and "[0, 2048)" in str(bad)
    samples, finished = good
    assert finished.stats.frames == 3 and samples == 3 * 1920
