"""A client that cancels mid-stream frees its engine slot: the next job starts without waiting for it.

The test worker runs one stream at a time, so the next job could only start early if the abandoned
one's slot was freed. Hanging up is explicit (`cancel()`), or implicit: leaving the `for` loop early
(sync) or an `async with` block (asyncio) without reading the final message.
"""

from __future__ import annotations

import time

from worker_helpers import assert_still_serving

from breeze_client.aio import AsyncBreezeClient


def _long_job_frames(client) -> tuple[float, int]:
    """(seconds per frame here, a frame limit that would hold the slot for >= ~8 s)."""
    probe = client.synthesize("Probe.", max_frames=4, seed=1)
    per_frame_s = probe.stats.wall_seconds / probe.stats.frames
    return per_frame_s, max(60, int(8.0 / per_frame_s))


def _assert_slot_freed(worker, abandoned_job_id: str, result, waited: float, remaining_s: float) -> None:
    assert result.stats.frames >= 1
    assert result.job.queue_wait_s < remaining_s / 4, (result.job.queue_wait_s, remaining_s)
    assert waited < remaining_s / 2, (waited, remaining_s)
    # the abandoned job was cancelled, not run to the end: it committed no artifact and left no partial file
    jobs = {worker.store.describe(a).get("job_id") for a in worker.store.list_ids()}
    assert abandoned_job_id not in jobs
    assert not list(worker.store.directory.glob(".art-*.partial"))


def test_cancel_mid_stream_frees_the_slot(client, worker):
    # how long a frame takes here, to size a job that would hold the slot for many seconds
    probe = client.synthesize("Probe.", max_frames=4, seed=1)
    per_frame_s = probe.stats.wall_seconds / probe.stats.frames
    frames = max(60, int(8.0 / per_frame_s))  # the abandoned job would run >= ~8 s more
    stream = client.stream("A long text that the caller abandons.", max_frames=frames, seed=2, temperature=0.0)
    seen = 0
    for _chunk in stream:
        seen += 1
        if seen == 2:
            stream.cancel()
            break
    t0 = time.monotonic()
    nxt = client.stream("The next job.", max_frames=2, seed=3)
    chunks = list(nxt)
    waited = time.monotonic() - t0
    result = nxt.result
    remaining_s = (frames - seen) * per_frame_s
    assert chunks and result.stats.frames >= 1
    assert result.job.queue_wait_s < remaining_s / 4, (result.job.queue_wait_s, remaining_s)
    assert waited < remaining_s / 2, (waited, remaining_s)
    # nothing of the abandoned job is left half-written in the store
    assert not list(worker.store.directory.glob(".art-*.partial"))
    assert_still_serving(client)


def test_breaking_out_of_the_loop_frees_the_slot_without_cancel(client, worker):
    per_frame_s, frames = _long_job_frames(client)
    stream = client.stream("A long text that the caller walks away from.", max_frames=frames, seed=4,
                           temperature=0.0)
    seen = 0
    for _chunk in stream:
        seen += 1
        if seen == 2:
            break  # no cancel(): leaving the loop hangs up
    t0 = time.monotonic()
    result = client.synthesize("The next job.", max_frames=2, seed=3)
    waited = time.monotonic() - t0
    _assert_slot_freed(worker, stream.job.job_id, result, waited, (frames - seen) * per_frame_s)
    assert_still_serving(client)


async def test_leaving_an_async_with_block_frees_the_slot(client, worker):
    per_frame_s, frames = _long_job_frames(client)
    async with AsyncBreezeClient(worker.target, timeout_s=120) as aclient:
        seen = 0
        async with await aclient.stream("An async caller walks away.", max_frames=frames, seed=5,
                                        temperature=0.0) as stream:
            async for _chunk in stream:
                seen += 1
                if seen == 2:
                    break
        t0 = time.monotonic()
        result = await aclient.synthesize("The next job.", max_frames=2, seed=3)
        waited = time.monotonic() - t0
    _assert_slot_freed(worker, stream.job.job_id, result, waited, (frames - seen) * per_frame_s)
