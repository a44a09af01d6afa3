"""A client that cancels mid-stream frees its engine slot: the next job starts without waiting for it.

The test worker runs one stream at a time, so the next job could only start early if the abandoned
one's slot was freed.
"""

from __future__ import annotations

import time

from worker_helpers import assert_still_serving


def test_cancel_mid_stream_frees_the_slot(client, worker):
    # how long a frame takes here, to size a job that would hold the slot for many seconds
    probe = client.synthesize("Probe.", max_frames=4, seed=1)
    per_frame_s = probe.stats.wall_seconds / probe.stats.frames
    frames = max(60, int(8.0 / per_frame_s))  # the abandoned job would run >= ~8 s more
    stream = client.stream("A long text that the caller abandons.", max_frames=frames, seed=2, temperature=0.0)
    seen = 0
    for chunk in stream:
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
