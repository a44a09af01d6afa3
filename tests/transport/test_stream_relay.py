"""The relay's bounds on what a slow reader holds (transport/stream_relay.py), on an event loop with a job that
yields events and a caller whose writes never complete: past the stream's bound, past the bound of every stream
together, or after taking nothing for the stall time, the stream ends with ResourceExhausted and the job runs
to its end; a caller who hangs up while keeping up cancels the job, one who took nothing for the stall time
does not. Against real worker processes and stock clients: tests/reliability/test_slow_reader.py."""

from __future__ import annotations

import asyncio

import pytest

from breeze_worker.config import ServerSettings
from breeze_worker.engine import types as et
from breeze_worker.errors import ResourceExhausted
from breeze_worker.transport import stream_relay
from breeze_worker.transport.stream_relay import SlowReaderBounds, relay

CHUNK = 4096


class Job:
    """A job's events: a start, `chunks` chunks of CHUNK bytes, then the end; records how it ended."""

    def __init__(self, chunks: int, name: str = "job-1") -> None:
        self.chunks, self.name = chunks, name
        self.sent = 0
        self.ended = asyncio.Event()
        self.outcome = ""  # finished | cancelled

    async def events(self):
        try:
            yield et.JobStarted(self.name, None, 24000, 0.0, 0, artifact_id=f"art-{self.name}")
            for i in range(self.chunks):
                await asyncio.sleep(0)
                self.sent += 1
                yield et.AudioChunk(i, i * CHUNK // 2, b"\0" * CHUNK, CHUNK // 2, 0)
            self.outcome = "finished"
        except (asyncio.CancelledError, GeneratorExit):
            self.outcome = "cancelled"
            raise
        finally:
            self.ended.set()


def reader(takes: int):
    """A caller's write: the first `takes` messages go through, then every write waits for ever."""
    taken: list = []

    async def write(event) -> None:
        if len(taken) >= takes:
            await asyncio.Event().wait()
        taken.append(event)

    return write, taken


def test_past_the_streams_bound_the_stream_ends_and_the_job_runs_to_its_end():
    async def main():
        bounds = SlowReaderBounds(stream_bytes=10 * CHUNK, total_bytes=100 * CHUNK, stall_s=600)
        job = Job(chunks=200)
        write, taken = reader(takes=3)
        with pytest.raises(ResourceExhausted, match=r"over 40,960 bytes waited to be sent .*--max-stream-buffer-"
                                                    r"bytes.*job job-1 runs on and its artifact art-job-1"):
            await relay(job.events(), write, bounds)
        await asyncio.wait_for(job.ended.wait(), 30)
        assert job.outcome == "finished" and job.sent == 200 and len(taken) == 3
        assert bounds.held == 0
    asyncio.run(main())


def test_past_the_bound_of_every_stream_together_the_stream_that_would_pass_it_ends():
    async def main():
        bounds = SlowReaderBounds(stream_bytes=50 * CHUNK, total_bytes=60 * CHUNK, stall_s=600)
        first, second = Job(chunks=40, name="job-1"), Job(chunks=200, name="job-2")
        write_first, _ = reader(takes=1)
        write_second, _ = reader(takes=1)
        holding = asyncio.create_task(relay(first.events(), write_first, bounds))
        await asyncio.wait_for(first.ended.wait(), 30)  # its 39 chunks wait for a caller who reads nothing
        assert bounds.held == 39 * CHUNK
        with pytest.raises(ResourceExhausted, match=r"the worker's streams together hold 245,760 bytes of audio "
                                                    r"for their clients, and its --max-buffered-audio-bytes is "
                                                    r"245,760.*job job-2 runs on"):
            await relay(second.events(), write_second, bounds)
        await asyncio.wait_for(second.ended.wait(), 30)
        assert second.outcome == "finished" and bounds.held == 39 * CHUNK  # the first stream is untouched
        assert not holding.done()
        holding.cancel()  # its caller hangs up
        with pytest.raises(asyncio.CancelledError):
            await holding
        assert bounds.held == 0
    asyncio.run(main())


def test_a_caller_that_takes_nothing_for_the_stall_time_loses_its_stream_not_its_job():
    async def main():
        bounds = SlowReaderBounds(stream_bytes=1000 * CHUNK, total_bytes=1000 * CHUNK, stall_s=0.2)
        job = Job(chunks=50)
        write, taken = reader(takes=2)
        with pytest.raises(ResourceExhausted, match=r"it took nothing for 0.2 s \(the worker's --reader-stall-s\)"):
            await relay(job.events(), write, bounds)
        await asyncio.wait_for(job.ended.wait(), 30)
        assert job.outcome == "finished" and len(taken) == 2 and bounds.held == 0
    asyncio.run(main())


def test_a_caller_that_hangs_up_while_keeping_up_cancels_the_job():
    async def main():
        bounds = SlowReaderBounds(stream_bytes=1000 * CHUNK, total_bytes=1000 * CHUNK, stall_s=600)
        job = Job(chunks=10_000)
        taken: list = []

        async def write(event) -> None:
            taken.append(event)

        call = asyncio.create_task(relay(job.events(), write, bounds))
        while len(taken) < 5:
            await asyncio.sleep(0)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await asyncio.wait_for(job.ended.wait(), 30)
        assert job.outcome == "cancelled" and job.sent < 10_000 and bounds.held == 0
    asyncio.run(main())


def test_a_stream_that_ends_under_a_write_not_taken_for_the_stall_time_leaves_its_job_running(monkeypatch):
    """The transport can end a call before the stall timer runs (a peer that stopped acknowledging is dropped):
    then the write in progress, older than the stall time, says the caller had stopped reading."""
    async def main():
        bounds = SlowReaderBounds(stream_bytes=1000 * CHUNK, total_bytes=1000 * CHUNK, stall_s=30)
        job = Job(chunks=100)
        write, taken = reader(takes=1)
        loop = asyncio.get_running_loop()
        call = asyncio.create_task(relay(job.events(), write, bounds))
        while not taken:
            await asyncio.sleep(0)
        await asyncio.sleep(0.05)  # the second write is waiting
        call.cancel()  # the transport's end of the call, delivered before the clock below reaches the timer
        real_time = loop.time
        monkeypatch.setattr(loop, "time", lambda: real_time() + 31)
        with pytest.raises(asyncio.CancelledError):
            await call
        monkeypatch.setattr(loop, "time", real_time)
        await asyncio.wait_for(job.ended.wait(), 30)
        assert job.outcome == "finished" and bounds.held == 0
        assert not stream_relay._detached  # the detached job's task let go of once done
    asyncio.run(main())


def test_the_default_bound_is_less_than_the_largest_job():
    """A bound above every job would never end a stream: the largest is the model's 1500-frame cap (120 s) of
    f32le audio at 24 kHz, 11.5 MB."""
    assert ServerSettings().max_stream_buffer_bytes < 1500 * 1920 * 4


def test_a_write_that_fails_after_the_stall_time_leaves_the_job_running(monkeypatch):
    """The call can also end under a write as an error of the write (gRPC's, when the peer is gone)."""
    from grpc._cython import cygrpc

    async def main():
        bounds = SlowReaderBounds(stream_bytes=1000 * CHUNK, total_bytes=1000 * CHUNK, stall_s=30)
        job = Job(chunks=100)
        loop = asyncio.get_running_loop()
        real_time = loop.time
        gone = asyncio.Event()
        taken: list = []

        async def write(event) -> None:
            if taken:
                await gone.wait()
                raise cygrpc.ExecuteBatchError("the peer is gone")
            taken.append(event)

        call = asyncio.create_task(relay(job.events(), write, bounds))
        while not taken:
            await asyncio.sleep(0)
        await asyncio.sleep(0.05)
        monkeypatch.setattr(loop, "time", lambda: real_time() + 31)
        gone.set()
        with pytest.raises(cygrpc.ExecuteBatchError):
            await call
        monkeypatch.setattr(loop, "time", real_time)
        await asyncio.wait_for(job.ended.wait(), 30)
        assert job.outcome == "finished" and bounds.held == 0
    asyncio.run(main())
