"""What the worker refuses to peers that ask too much, said in the log in aggregate, and the per-peer budget
of failed authentications.

- `RefusalLog`: a refusal that a client can repeat thousands of times a second (a wrong token, one health
  watcher too many) is one log line per kind per `interval_s`, with the count and the peers that caused
  it most, not one line each: the first of a quiet period at once, the rest summed up at the next.
- `FailureBudget`: each peer address (the IP, without the port: every connection from a host shares it)
  may fail `burst` times, and regains one failure every `per_s` seconds; a peer over its budget is
  refused until it has one again. Peers with a full budget are forgotten, and at most `MAX_PEERS` are
  remembered (the fullest forgotten first), so a spray of addresses cannot grow it without bound.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

MAX_PEERS = 10_000


def peer_address(peer: str) -> str:
    """The host part of a gRPC peer string: 'ipv4:10.0.0.1:5555' -> '10.0.0.1', 'ipv6:[::1]:5555' -> '::1';
    anything else (a unix socket) as it is."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0] or rest
    if kind == "ipv6":
        host = rest.rpartition(":")[0] if rest.startswith("[") else rest
        return host.strip("[]")
    return peer


class RefusalLog:
    """One log line per kind of refusal per `interval_s`: the first at once, then a count with the top peers."""

    def __init__(self, logger: logging.Logger, interval_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        self._interval_s = interval_s
        self._clock = clock
        self._next: dict[str, float] = {}  # kind -> when its next line may be written
        self._counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)

    def note(self, kind: str, peer: str, detail: str) -> None:
        """A refusal of `kind` (one sentence, the same each time) to `peer`; `detail` is said in the first line."""
        now = self._clock()
        counts = self._counts[kind]
        counts[peer] += 1
        if now < self._next.get(kind, 0.0):
            return
        total = sum(counts.values())
        if total == 1:
            self._log.warning("%s: %s (peer %s); more are counted and logged at most every %.0f s", kind, detail,
                              peer, self._interval_s)
        else:
            top = ", ".join(f"{p} x{n}" for p, n in counts.most_common(3))
            self._log.warning("%s: %d in the last %.0f s, from %d peer(s) (most: %s)", kind, total,
                              self._interval_s, len(counts), top)
        counts.clear()
        self._next[kind] = now + self._interval_s


class FailureBudget:
    """Failed attempts per peer address: `burst` at once, one more every `per_s` seconds."""

    def __init__(self, burst: int, per_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.burst, self.per_s = burst, per_s
        self._clock = clock
        self._left: dict[str, tuple[float, float]] = {}  # peer -> (failures left, when counted)

    def _now_left(self, peer: str, now: float) -> float:
        left, at = self._left.get(peer, (float(self.burst), now))
        return min(float(self.burst), left + (now - at) / self.per_s)

    def exhausted(self, peer: str) -> bool:
        """Whether `peer` has no failure left (its calls are refused until it has)."""
        if peer not in self._left:
            return False
        return self._now_left(peer, self._clock()) < 1.0

    def retry_after_s(self, peer: str) -> float:
        """Seconds until `peer` has a failure left again."""
        return max(0.0, (1.0 - self._now_left(peer, self._clock())) * self.per_s)

    def fail(self, peer: str) -> None:
        """Count one failure of `peer`."""
        now = self._clock()
        self._left[peer] = (max(0.0, self._now_left(peer, now) - 1.0), now)
        if len(self._left) > MAX_PEERS:
            self._forget(now)

    def _forget(self, now: float) -> None:
        """Drop the peers back at a full budget; if still too many, the fullest."""
        for peer in [p for p in self._left if self._now_left(p, now) >= self.burst]:
            del self._left[peer]
        if len(self._left) > MAX_PEERS:
            fullest = sorted(self._left, key=lambda p: self._now_left(p, now), reverse=True)
            for peer in fullest[:len(self._left) - MAX_PEERS]:
                del self._left[peer]

    def __len__(self) -> int:
        return len(self._left)
