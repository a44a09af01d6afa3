"""grpc.health.v1 with a bound on its watchers, shared fairly between the peers that watch.

Health is open to every peer (load balancers and probes carry no token, and neither do the health checks a
gRPC client channel makes by itself), and a `Watch` stays open for as long as its client wants: each one holds a
call, its HTTP/2 stream and a task. `BoundedHealthServicer` serves at most `max_watchers` of them at once, for
both ports together. At the bound, a new watcher from a peer address that holds fewer watchers than the busiest
one is let in by ending the busiest peer's oldest watcher (RESOURCE_EXHAUSTED); a watcher from the busiest peer
itself is refused at once. So however many watchers one host opens, a client on another host that watches one
worker is served. `Check` is always answered. Refusals are logged in aggregate (`refusals.RefusalLog`).
"""

from __future__ import annotations

import asyncio
import logging

import grpc
from grpc_health.v1 import health
from prometheus_client.core import GaugeMetricFamily

from breeze_worker.transport.refusals import RefusalLog, peer_address

log = logging.getLogger(__name__)


class BoundedHealthServicer(health.aio.HealthServicer):
    def __init__(self, max_watchers: int) -> None:
        super().__init__()
        self.max_watchers = max_watchers
        self._by_peer: dict[str, dict[asyncio.Task, None]] = {}  # each peer's watcher tasks, oldest first
        self._count = 0  # watchers open: kept as one int, which a metrics scrape reads from its own thread
        self._evicted: set[asyncio.Task] = set()
        self._refusals = RefusalLog(log)

    @property
    def watchers(self) -> int:
        return self._count

    def _admit(self, peer: str) -> bool:
        """Make room for one more watcher of `peer`; False when it is the busiest peer of a full servicer."""
        if self.watchers < self.max_watchers:
            return True
        busiest = max(self._by_peer, key=lambda p: len(self._by_peer[p]))
        if len(self._by_peer[busiest]) <= len(self._by_peer.get(peer, ())) + 1:
            return False
        oldest = next(iter(self._by_peer[busiest]))
        self._forget(busiest, oldest)
        self._evicted.add(oldest)
        oldest.cancel()  # it waits for a status change; it ends with RESOURCE_EXHAUSTED
        self._refusals.note("health watchers ended for another peer's", busiest,
                            f"{self.max_watchers} watchers were open (--health-max-watchers), most of them this "
                            "peer's")
        return True

    def _forget(self, peer: str, task: asyncio.Task) -> None:
        tasks = self._by_peer.get(peer, {})
        if task in tasks:
            del tasks[task]
            self._count -= 1
        if not tasks:
            self._by_peer.pop(peer, None)

    async def Watch(self, request, context) -> None:
        peer = peer_address(context.peer())
        task = asyncio.current_task()
        assert task is not None  # a handler runs in its own task
        if not self._admit(peer):
            self._refusals.note("health watchers refused", peer,
                                f"{self.max_watchers} watchers are open (--health-max-watchers), most of them this "
                                "peer's")
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"this worker serves at most {self.max_watchers} health watchers at once, and your "
                                "address holds the most of them; use Check, or close a watcher")
        self._by_peer.setdefault(peer, {})[task] = None
        self._count += 1
        try:
            await super().Watch(request, context)
        except asyncio.CancelledError:
            if task not in self._evicted:
                raise  # the caller went away
            task.uncancel()
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"this worker serves at most {self.max_watchers} health watchers at once; this one "
                                "was ended for a watcher of an address that held fewer. Use Check, or fewer "
                                "watchers")
        finally:
            self._evicted.discard(task)
            self._forget(peer, task)


class WatcherCollector:
    """The health watchers open now, for the metrics (`breeze_health_watchers`), read at each scrape."""

    def __init__(self, servicer: BoundedHealthServicer) -> None:
        self._servicer = servicer

    def collect(self):
        yield GaugeMetricFamily("breeze_health_watchers", "grpc.health.v1 Watch calls open now, both ports "
                                f"(at most --health-max-watchers, {self._servicer.max_watchers})",
                                value=self._servicer.watchers)
