"""One event loop thread for every in-process worker of a test session.

grpc.aio binds each event loop it sees to its one process-wide completion-queue poller: every loop adds a
reader on the same socket, and each of grpc's events wakes them all. A session that started each worker on
its own loop thread ran several loops competing for grpc's events, a layout the product never has (the
worker runs one loop per process). Tests that run a worker in-process put it here instead.

    future = asyncio.run_coroutine_threadsafe(coro, shared_loop())
"""

from __future__ import annotations

import asyncio
import threading

_loop: asyncio.AbstractEventLoop | None = None
_lock = threading.Lock()


def shared_loop() -> asyncio.AbstractEventLoop:
    """The session's worker loop, started (as a daemon thread) on first use."""
    global _loop
    with _lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="test-workers-loop", daemon=True).start()
        return _loop
