"""The client gap across runs: a polling loop, a fixed delay in the application, or something else.

One run's gap says only how long the application took to ask for its artifact after the final message;
`causes._client_gap` names what one run can prove (a thread starved of CPU, a connection set up inside the
gap: a cold start). The rest is the application's own timing, and only several runs tell its kind:

- a polling loop picks a finished job up at its next poll, whenever that comes: the gap is anything from
  nothing to a whole period, so it varies from run to run; when the loop polls on a fixed schedule, the
  requests also fall on one grid of that period while the final messages do not;
- a fixed delay (a sleep, a timer, a batch that waits) adds the same time every run: a constant offset.

Pure functions over integers (client-clock ns): no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from breeze_client.phases import format_seconds

VARY_SHARE = 0.25  # gaps whose spread is at least this share of the longest vary from run to run
VARY_MIN_NS = 20_000_000  # ... and by at least this much (less is scheduling noise)
GRID_TOLERANCE_NS = 3_000_000  # a request within this of a grid line is on it (or GRID_TOLERANCE_SHARE of
GRID_TOLERANCE_SHARE = 0.005  # the period, when that is longer: a poll loop's timer wakes a little late)
GRID_MIN_RUNS = 3  # two requests fall on some grid whatever their times: three can refute one


@dataclass(frozen=True)
class Gap:
    final_received_ns: int  # client clock
    request_sent_ns: int

    @property
    def ns(self) -> int:
        return self.request_sent_ns - self.final_received_ns


def _s(ns: float) -> str:
    return format_seconds(ns / 1e9)


def poll_period(gaps: Sequence[Gap]) -> int | None:
    """The period of a grid the requests fall on (within its tolerance) while the final messages do not, at least
    as long as the longest gap (a poll comes within one period); the longest such period, else None. A loop's
    own period is it or a whole fraction of it: a few requests cannot tell which."""
    if len(gaps) < GRID_MIN_RUNS:
        return None
    longest = max(g.ns for g in gaps)
    requests = sorted(g.request_sent_ns for g in gaps)
    finals = sorted(g.final_received_ns for g in gaps)
    first, span = requests[0], requests[-1] - requests[0]
    if longest <= 0 or span <= 0:
        return None
    for k in range(1, int(span // longest) + 1):  # the last request is k periods after the first
        period = span / k
        if period < longest:
            break
        if _on_grid(requests, first, period) and not _on_grid(finals, finals[0], period):
            return int(period)
    return None


def _on_grid(times: Sequence[int], origin: int, period: float) -> bool:
    tolerance = max(GRID_TOLERANCE_NS, GRID_TOLERANCE_SHARE * period)
    for t in times:
        off = (t - origin) % period
        if min(off, period - off) > tolerance:
            return False
    return True


def across_runs(gaps: Sequence[Gap]) -> tuple[str, list[str]] | None:
    """(cause, evidence lines) from the gaps of two runs or more: `polling` when they vary, `client_delay` when
    they are the same each time; None with fewer than two."""
    if len(gaps) < 2:
        return None
    values = sorted(g.ns for g in gaps)
    low, high = values[0], values[-1]
    spread = high - low
    if spread >= max(VARY_SHARE * high, VARY_MIN_NS):
        lines = [f"the gap varied from {_s(low)} to {_s(high)} over {len(gaps)} runs: the application picks a "
                 "finished job up whenever its next poll comes, not when the final message arrives"]
        period = poll_period(gaps)
        if period is not None:
            lines.append(f"the artifact requests were whole multiples of {_s(period)} apart while the final "
                         "messages were not: a loop polling on a fixed schedule, every "
                         f"{_s(period)} or a whole fraction of it no shorter than the longest gap ({_s(high)})")
        return "polling", lines
    return "client_delay", [f"the gap was {_s(low)} to {_s(high)} in all {len(gaps)} runs: a constant offset, a "
                            "fixed delay in the application between the final message and its request"]
