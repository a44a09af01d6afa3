"""One job's events to its caller, with bounds on the audio that waits for a caller who reads slowly.

The engine makes audio as fast as it can and the caller takes it as fast as it reads; gRPC's own buffers
(HTTP/2 flow control, the socket) hold part of the difference and the rest waits here. `relay` takes the
engine's events as they come and writes them in order. A caller is *too slow* when
- more than `SlowReaderBounds.stream_bytes` of audio waits for it, or
- the audio every stream keeps waiting for its caller would pass `SlowReaderBounds.total_bytes` with its
  next chunk (the bound on what all slow readers together can make the worker hold), or
- it has taken nothing for `SlowReaderBounds.stall_s` (a write waited that long).
Then its stream ends with RESOURCE_EXHAUSTED, and the job runs on without a listener, so its artifact is still
committed: the message names the artifact id, and the whole audio can be fetched once the job is done.
(Cancelling instead would throw away work a slow but live reader, such as a real-time player, still wants;
the slot it holds is bounded by the job's frame limit.)

A caller who hangs up cancels the job, as before, unless it had taken nothing for `stall_s` by then: a
stream that ends while its caller does not read (the transport dropped a peer that stopped acknowledging,
or a client gave up on a stream it no longer read) is a slow reader's, and the job runs on for its artifact.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from breeze_worker.engine import types as et
from breeze_worker.errors import ResourceExhausted

log = logging.getLogger(__name__)

_detached: set[asyncio.Task] = set()  # jobs running on after their caller's stream ended (kept referenced)


@dataclass
class SlowReaderBounds:
    """What slow readers may hold: per stream, for all streams together (`held`, shared by every relay of a
    server), and how long a caller may take nothing."""

    stream_bytes: int
    total_bytes: int
    stall_s: float
    held: int = field(default=0, init=False)  # audio bytes waiting in every relay now (one event loop)

    def fits(self, nbytes: int) -> bool:
        return self.held + nbytes <= self.total_bytes


class _Outbox:
    def __init__(self, bounds: SlowReaderBounds, writer: asyncio.Task) -> None:
        self.bounds = bounds
        self.writer = writer  # the task writing to the caller; cancelled when a bound is passed
        self.items: collections.deque = collections.deque()
        self.bytes = 0
        self.changed = asyncio.Event()
        self.overflow = asyncio.Event()  # the stream ended for a slow reader; the job runs on
        self.why = ""  # which bound, in words
        self.ended = False
        self.error: BaseException | None = None
        self.job_id = ""
        self.artifact_id = ""
        self.writing_since: float | None = None  # loop time the write in progress began

    def hold(self, event) -> None:
        n = _size(event)
        self.items.append(event)
        self.bytes += n
        self.bounds.held += n

    def take(self):
        event = self.items.popleft()
        n = _size(event)
        self.bytes -= n
        self.bounds.held -= n
        return event

    def let_go(self) -> None:
        self.bounds.held -= self.bytes
        self.items.clear()
        self.bytes = 0

    def stalled(self, now: float) -> bool:
        return self.writing_since is not None and now - self.writing_since >= self.bounds.stall_s

    def too_slow(self) -> ResourceExhausted:
        fetch = (f"; job {self.job_id} runs on and its artifact {self.artifact_id} can be fetched once it is "
                 "committed (Stat it until it exists)") if self.artifact_id else ""
        return ResourceExhausted(
            f"the client read the audio more slowly than it was generated: {self.why}, so the stream was "
            f"ended{fetch}. Read the stream continuously (a player should buffer on its side), or synthesize "
            "without streaming and fetch the artifact")


def _size(event) -> int:
    return len(event.pcm) if isinstance(event, et.AudioChunk) else 0


def _detach(box: _Outbox, why: str) -> None:
    """The stream ends for a slow reader: what waits for it is let go of; the job runs on."""
    box.why = why
    box.let_go()
    box.overflow.set()
    log.warning("job %s: the client stopped reading (%s); its stream ends and the job runs on for its artifact %s",
                box.job_id, why, box.artifact_id or "-")


def _ended_under_write(box: _Outbox, now: float) -> None:
    """The call ended (its caller hung up, or the transport dropped it) with a write in progress: if the caller
    had not taken it for stall_s, it was a slow reader, and its job runs on."""
    if box.stalled(now) and not box.overflow.is_set():
        _detach(box, f"it took nothing for {box.bounds.stall_s:g} s before its stream ended")


async def _pull(events: AsyncIterator, box: _Outbox) -> None:
    """Take every event as it comes; past a bound, keep taking them (the job runs on) but drop them."""
    bounds = box.bounds
    try:
        async for event in events:
            if box.overflow.is_set():
                continue
            if isinstance(event, et.JobStarted):
                box.job_id, box.artifact_id = event.job_id, event.artifact_id
            if not bounds.fits(_size(event)):
                _detach(box, f"the worker's streams together hold {bounds.held:,} bytes of audio for their "
                             f"clients, and its --max-buffered-audio-bytes is {bounds.total_bytes:,}")
                box.writer.cancel()  # it is blocked in a write the caller does not read
                continue
            box.hold(event)
            if box.bytes > bounds.stream_bytes:
                _detach(box, f"over {bounds.stream_bytes:,} bytes waited to be sent (the worker's "
                             "--max-stream-buffer-bytes)")
                box.writer.cancel()
            box.changed.set()
    except asyncio.CancelledError:
        raise
    except BaseException as exc:  # noqa: BLE001 - handed to the writer, which raises it in the call
        box.error = exc
    finally:
        box.ended = True
        box.changed.set()
        if box.overflow.is_set():
            log.info("job %s ended without a listener (its stream had ended: the client read too slowly)",
                     box.job_id)


async def relay(events: AsyncIterator, write: Callable[[object], Awaitable[None]], bounds: SlowReaderBounds) -> None:
    """Write `events` through `write` in order; raise ResourceExhausted once the caller is too slow (the job then
    runs on); re-raise the engine's error if it fails."""
    writer = asyncio.current_task()
    if writer is None:  # the puller cancels the writer's task to unblock its write
        raise RuntimeError("relay must be awaited inside an asyncio task")
    loop = asyncio.get_running_loop()
    box = _Outbox(bounds, writer)
    pull = asyncio.create_task(_pull(events, box))
    try:
        while True:
            while box.items:
                event = box.take()
                box.writing_since = loop.time()
                try:
                    async with asyncio.timeout(bounds.stall_s):
                        await write(event)
                except TimeoutError:
                    _detach(box, f"it took nothing for {bounds.stall_s:g} s (the worker's --reader-stall-s)")
                    raise box.too_slow() from None
                box.writing_since = None
            if box.ended:
                if box.error is not None:
                    raise box.error
                return
            box.changed.clear()
            await box.changed.wait()
    except asyncio.CancelledError:
        if box.overflow.is_set():  # the puller cancelled the blocked write: end the call with a status
            writer.uncancel()
            raise box.too_slow() from None
        _ended_under_write(box, loop.time())
        raise
    except Exception:  # a write that failed (the call is over), or the engine's error
        _ended_under_write(box, loop.time())
        raise
    finally:
        box.let_go()
        if box.overflow.is_set() and not pull.done():
            _detached.add(pull)
            pull.add_done_callback(_detached.discard)
        elif not pull.done():
            pull.cancel()  # the caller hung up or the write failed: the job is cancelled
            try:
                await pull
            except asyncio.CancelledError:
                pass
