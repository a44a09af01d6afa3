"""A burst onto an idle engine joins at one frame boundary (engine/scheduler.py, "Bursts"), through the real
`Engine` on the CPU: the first request of a burst waits for the ones still being received, and for those
handed over one after another less than `join_gather_quiet_ms` apart (as the event loop hands over a burst
of plain requests), up to `join_gather_ms` in all, so all of them are admitted in one join; without the
gather the first joins alone. A lone request, and one sent after a refused request, wait no longer than the
quiet gap."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch
from engine_helpers import tone_wav

from breeze_worker.artifacts.store import ArtifactStore
from breeze_worker.config import ArtifactSettings, EngineSettings
from breeze_worker.engine.service import Engine
from breeze_worker.engine.types import JobFinished, ReferenceInput, SynthesisRequest
from breeze_worker.errors import InvalidRequest


def _engine(tmp_path, gather_ms: float, quiet_ms: float = 2.0, burst_quiet_ms: float = 0.0) -> Engine:
    """burst_quiet_ms 0: a burst's quiet gap is the lone request's (`join_gather_quiet_ms`)."""
    torch.set_num_threads(1)
    settings = EngineSettings(device="cpu", max_active_streams=4, max_queue=4, join_gather_ms=gather_ms,
                              join_gather_quiet_ms=quiet_ms, join_gather_burst_quiet_ms=burst_quiet_ms)
    return Engine(settings, ArtifactStore(ArtifactSettings(directory=tmp_path / f"artifacts-{gather_ms:g}")))


async def _run(engine: Engine, seed: int, text: str = "one two three") -> list:
    return [event async for event in engine.synthesize(SynthesisRequest(text=text, seed=seed, max_frames=2))]


def _join_sizes(engine: Engine, monkeypatch, requests) -> list[int]:
    """Runs the coroutines `requests()` gives on the started engine, together; returns the number of joiners
    of each join."""
    sizes: list[int] = []

    async def main():
        await engine.start()
        stepper = engine.scheduler._stepper
        join = stepper.join
        monkeypatch.setattr(stepper, "join", lambda joiners: sizes.append(len(joiners)) or join(joiners))
        try:
            results = await asyncio.wait_for(asyncio.gather(*requests()), 60)
        finally:
            await engine.stop()
        assert all(isinstance(events[-1], JobFinished) for events in results)

    asyncio.run(main())
    return sizes


def _burst_join_sizes(engine: Engine, monkeypatch) -> list[int]:
    """Three requests sent together, the last two still being received (resolved) 300 ms after the first
    was submitted."""
    resolve = engine._resolve

    async def slow_resolve(request):
        # every request of the burst has reached the worker (counts as arriving) before the first is
        # submitted; the later two are still being received 300 ms after it
        await asyncio.sleep(0 if request.seed == 1 else 0.3)
        return await resolve(request)

    monkeypatch.setattr(engine, "_resolve", slow_resolve)
    return _join_sizes(engine, monkeypatch, lambda: [_run(engine, seed) for seed in (1, 2, 3)])


def test_a_burst_onto_an_idle_engine_joins_at_one_boundary(tmp_path, monkeypatch):
    assert _burst_join_sizes(_engine(tmp_path, gather_ms=5000), monkeypatch) == [3]


def test_without_the_gather_the_first_request_joins_alone(tmp_path, monkeypatch):
    sizes = _burst_join_sizes(_engine(tmp_path, gather_ms=0), monkeypatch)
    assert sizes[0] == 1 and sum(sizes) == 3


@pytest.mark.parametrize("after_refusal", [False, True])
def test_a_lone_request_does_not_wait_for_the_gather(tmp_path, after_refusal):
    engine = _engine(tmp_path, gather_ms=60_000)  # a wait would outlast the test's 20 s limit

    async def main():
        await engine.start()
        try:
            if after_refusal:  # refused while it was arriving: it no longer counts as arriving
                with pytest.raises(InvalidRequest):
                    await _run(engine, 1, text="")
            return await asyncio.wait_for(_run(engine, 2), 20)
        finally:
            await engine.stop()

    events = asyncio.run(main())
    assert isinstance(events[-1], JobFinished) and events[-1].stats.frames == 2
    assert engine.scheduler._arriving == 0


def _one_after_another_join_sizes(engine: Engine, monkeypatch, gap_s: float) -> list[int]:
    """Three plain requests handed over `gap_s` apart, each submitted before the next arrives (nothing is
    ever counted as arriving when the engine looks)."""

    async def later(i):
        await asyncio.sleep(i * gap_s)
        return await _run(engine, i + 1)

    return _join_sizes(engine, monkeypatch, lambda: [later(i) for i in range(3)])


def test_requests_handed_over_within_the_quiet_gap_join_together(tmp_path, monkeypatch):
    engine = _engine(tmp_path, gather_ms=20_000, quiet_ms=1_000)
    assert _one_after_another_join_sizes(engine, monkeypatch, gap_s=0.1) == [3]


def test_requests_further_apart_than_the_quiet_gap_join_as_they_come(tmp_path, monkeypatch):
    engine = _engine(tmp_path, gather_ms=20_000, quiet_ms=1)
    sizes = _one_after_another_join_sizes(engine, monkeypatch, gap_s=0.5)
    assert sizes[0] == 1 and sum(sizes) == 3


def test_the_gather_ends_at_its_limit_even_while_requests_keep_coming(tmp_path, monkeypatch):
    """A quiet gap longer than the whole gather: the first request still joins once `join_gather_ms` passed
    (here before the third request is handed over)."""
    engine = _engine(tmp_path, gather_ms=600, quiet_ms=60_000)  # arrivals at 0, 0.4 and 0.8 s
    sizes = _one_after_another_join_sizes(engine, monkeypatch, gap_s=0.4)
    assert sizes[0] == 2 and sum(sizes) == 3


def test_the_gather_ends_once_the_queued_jobs_fill_every_free_slot(tmp_path, monkeypatch):
    """Four requests for four slots, handed over 0.1 s apart: the gather ends as the fourth is queued, not
    after its quiet gap or limit (a minute each: waiting for either would outlast the test's limit)."""
    engine = _engine(tmp_path, gather_ms=60_000, quiet_ms=60_000)

    async def later(i):
        await asyncio.sleep(i * 0.1)
        return await asyncio.wait_for(_run(engine, i + 1), 20)

    assert _join_sizes(engine, monkeypatch, lambda: [later(i) for i in range(4)]) == [4]


def test_a_clone_in_a_burst_prepares_during_the_gather_and_joins_with_the_rest(tmp_path, monkeypatch):
    """A request with new reference audio gets its slot while the engine gathers the burst, so its decode and
    encode overlap the gather and it joins with the plain requests; before, it got its slot after the gather
    and joined one step later, alone."""
    engine = _engine(tmp_path, gather_ms=20_000, quiet_ms=300)
    audio = tone_wav(2.0)
    engine_intake = None

    async def clone():
        request = SynthesisRequest(text="one two three", seed=9, max_frames=2,
                                   reference=ReferenceInput(audio=audio, transcript="a tone, not words"))
        return [event async for event in engine.synthesize(request)]

    def requests():
        nonlocal engine_intake
        store = engine.references
        engine_intake = store.intake

        def slow_intake(*args):  # slower than the quiet gap: the gather must wait for it, not for silence
            time.sleep(0.6)
            return engine_intake(*args)

        monkeypatch.setattr(store, "intake", slow_intake)
        return [clone(), *(_run(engine, seed) for seed in (1, 2, 3))]

    assert _join_sizes(engine, monkeypatch, requests) == [4]


@pytest.mark.parametrize("burst_quiet_ms", [50, 800])
def test_once_two_requests_wait_the_burst_ends_after_the_longer_quiet_gap(tmp_path, monkeypatch, burst_quiet_ms):
    """Two requests handed over together, a third 0.3 s later: with a 50 ms gap for a lone request and a burst
    gap of 800 ms the third joins the first two; with both gaps 50 ms the first two join without it."""
    engine = _engine(tmp_path, gather_ms=20_000, quiet_ms=50, burst_quiet_ms=burst_quiet_ms)

    async def later(i):
        await asyncio.sleep(0 if i < 2 else 0.3)
        return await _run(engine, i + 1)

    sizes = _join_sizes(engine, monkeypatch, lambda: [later(i) for i in range(3)])
    assert sizes == ([3] if burst_quiet_ms == 800 else [2, 1])
