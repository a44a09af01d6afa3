"""One job's events to its caller, with a bound on the audio that waits for a caller who reads slowly.

The engine makes audio as fast as it can and the caller takes it as fast as it reads; gRPC's own buffers
(HTTP/2 flow control, the socket) hold part of the difference and the rest waits here. `relay` takes the
engine's events as they come and writes them in order. When more than `max_buffered_bytes` of audio waits
for a caller who does not read, the call ends with RESOURCE_EXHAUSTED, and the job runs on without a
listener, so its artifact is still committed: the message names the artifact id, and the whole audio can
be fetched once the job is done. (Cancelling instead would throw away work a slow but live reader, such as
a real-time player, still wants; the slot it holds is bounded by the job's frame limit.)

A caller who hangs up cancels the relay, which cancels the job, as before.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from breeze_worker.engine import types as et
from breeze_worker.errors import ResourceExhausted

log = logging.getLogger(__name__)

_detached: set[asyncio.Task] = set()  # jobs running on after their caller's stream ended (kept referenced)


class _Outbox:
    def __init__(self, limit: int, writer: asyncio.Task) -> None:
        self.limit = limit
        self.writer = writer  # the task writing to the caller; cancelled when the bound is passed
        self.items: collections.deque = collections.deque()
        self.bytes = 0
        self.changed = asyncio.Event()
        self.overflow = asyncio.Event()
        self.ended = False
        self.error: BaseException | None = None
        self.job_id = ""
        self.artifact_id = ""

    def too_slow(self) -> ResourceExhausted:
        fetch = (f"; job {self.job_id} runs on and its artifact {self.artifact_id} can be fetched once it is "
                 "committed (Stat it until it exists)") if self.artifact_id else ""
        return ResourceExhausted(
            f"the client read the audio more slowly than it was generated: over {self.limit:,} bytes waited to be "
            f"sent (the worker's --max-stream-buffer-bytes), so the stream was ended{fetch}. Read the stream "
            "continuously (a player should buffer on its side), or synthesize without streaming and fetch the "
            "artifact")


def _size(event) -> int:
    return len(event.pcm) if isinstance(event, et.AudioChunk) else 0


async def _pull(events: AsyncIterator, box: _Outbox) -> None:
    """Take every event as it comes; past the bound, keep taking them (the job runs on) but drop them."""
    try:
        async for event in events:
            if box.overflow.is_set():
                continue
            if isinstance(event, et.JobStarted):
                box.job_id, box.artifact_id = event.job_id, event.artifact_id
            box.items.append(event)
            box.bytes += _size(event)
            if box.bytes > box.limit:
                box.items.clear()
                box.bytes = 0
                box.overflow.set()
                box.writer.cancel()  # it is blocked in a write the caller does not read
                log.warning("job %s: the client stopped reading (over %d bytes of audio waiting); its stream ends "
                            "with RESOURCE_EXHAUSTED and the job runs on for its artifact %s", box.job_id,
                            box.limit, box.artifact_id or "-")
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


async def relay(events: AsyncIterator, write: Callable[[object], Awaitable[None]], max_buffered_bytes: int) -> None:
    """Write `events` through `write` in order; raise ResourceExhausted once a slow reader lets more than
    `max_buffered_bytes` of audio wait (the job then runs on); re-raise the engine's error if it fails."""
    writer = asyncio.current_task()
    if writer is None:  # the puller cancels the writer's task to unblock its write
        raise RuntimeError("relay must be awaited inside an asyncio task")
    box = _Outbox(max_buffered_bytes, writer)
    pull = asyncio.create_task(_pull(events, box))
    try:
        while True:
            while box.items:
                event = box.items.popleft()
                box.bytes -= _size(event)
                await write(event)
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
        raise
    finally:
        if box.overflow.is_set() and not pull.done():
            _detached.add(pull)
            pull.add_done_callback(_detached.discard)
        elif not pull.done():
            pull.cancel()  # the caller hung up or the write failed: the job is cancelled
            try:
                await pull
            except asyncio.CancelledError:
                pass
