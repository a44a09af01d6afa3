"""Checking the clock mapping of one retrieval: exchanges before and after it, and the order of its events.

A clock exchange bounds the offset (worker clock - client clock) to `offset ± uncertainty` at the moment
it was made; the bound is half the round trip, which holds however asymmetric the path is. One exchange
made once is not enough: a worker clock that steps or drifts afterwards maps every later worker time
wrongly (a -2 s phase, a negative total). So each retrieval is bracketed by exchanges, and the check

1. compares consecutive exchanges: intervals that overlap agree; a gap between them is a move of the
   worker's clock against ours (ours is the client's monotonic clock, `clock.now_ns`, which nothing
   steps: a step of the client's wall clock moves no offset, and is named as the client's from the
   wall clock's lead recorded with each exchange, `client_steps`). A move no faster than `MAX_DRIFT_PPM`
   is drift: the mapping's uncertainty is widened by the drift over the time since the exchange used. A
   faster move is a step (or a clock running far off, which no exchange pair can tell from a step);
2. maps each group of worker events (the job's, the fetch's, the Stat's) with the offsets that agree
   with causality: a worker event that caused a client event happened before it, and one caused by a
   client event happened after it. Each such pair bounds the offset from one side (`Group.before` and
   `Group.after`); the fetch's request and first message bound it from both, as an exchange does;
3. when the exchanges disagree, re-maps each group from the nearest exchange (in client time) whose
   interval meets the group's causal window; when none does, or the group's own worker times contradict
   the order of events, the group is *broken*: its cross-machine phases are not measured.

Pure functions over integers: no I/O, no gRPC.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

MAX_DRIFT_PPM = 500.0  # the fastest a disciplined clock slews (ntpd's and chrony's default limit)
# a move of the client's wall clock against its monotonic clock at least this large is a step (a slew moves
# both clocks alike; reading the two clocks one after the other differs by microseconds)
CLIENT_STEP_MIN_NS = 1_000_000


@dataclass(frozen=True)
class Exchange:
    """One clock exchange: offset ± uncertainty at client time `at_ns`."""

    at_ns: int
    offset_ns: int
    uncertainty_ns: int
    label: str = ""  # where it was made, e.g. "before the job" or "after the fetch"
    client_lead_ns: int | None = None  # how far this client's wall clock read ahead of its clock (clock.now_ns)
    client_synchronized: bool | None = None  # whether this host's clock was disciplined (clock.synchronized)

    @property
    def low(self) -> int:
        return self.offset_ns - self.uncertainty_ns

    @property
    def high(self) -> int:
        return self.offset_ns + self.uncertainty_ns

    def to_dict(self) -> dict:
        return {"at_ns": self.at_ns, "offset_ns": self.offset_ns, "uncertainty_ns": self.uncertainty_ns,
                "label": self.label, "client_lead_ns": self.client_lead_ns,
                "client_synchronized": self.client_synchronized}


@dataclass
class Group:
    """Worker events mapped with one offset, and the causal bounds on that offset."""

    name: str  # "job", "fetch", "stat"
    at_ns: int  # client time the group is nearest to (picks the nearest exchange)
    lows: list[tuple[int, str]] = field(default_factory=list)  # offset >= value
    highs: list[tuple[int, str]] = field(default_factory=list)  # offset <= value

    def before(self, worker_ns: int | None, client_ns: int | None, why: str) -> Group:
        """The worker event happened before the client event: offset >= worker - client."""
        if worker_ns and client_ns:
            self.lows.append((int(worker_ns) - int(client_ns), why))
        return self

    def after(self, worker_ns: int | None, client_ns: int | None, why: str) -> Group:
        """The worker event happened after the client event: offset <= worker - client."""
        if worker_ns and client_ns:
            self.highs.append((int(worker_ns) - int(client_ns), why))
        return self

    def window(self) -> tuple[int | None, int | None]:
        low = max((v for v, _ in self.lows), default=None)
        high = min((v for v, _ in self.highs), default=None)
        return low, high


@dataclass(frozen=True)
class GroupMapping:
    name: str
    offset_ns: int | None  # None: broken, the group's worker events cannot be placed on the client clock
    uncertainty_ns: int
    source: str  # how the offset was chosen, in words

    @property
    def ok(self) -> bool:
        return self.offset_ns is not None

    def to_client(self, worker_ns: int | None) -> int | None:
        return None if not worker_ns or self.offset_ns is None else int(worker_ns) - self.offset_ns

    def to_dict(self) -> dict:
        return {"offset_ns": self.offset_ns, "uncertainty_ns": self.uncertainty_ns, "source": self.source}


@dataclass(frozen=True)
class Move:
    """The worker clock's move against ours between two consecutive exchanges."""

    first: Exchange
    second: Exchange
    delta_ns: int  # offset change
    excess_ns: int  # how far the two intervals are apart (0: they overlap, the exchanges agree)

    @property
    def seconds(self) -> float:
        return max(self.second.at_ns - self.first.at_ns, 1) / 1e9

    @property
    def ppm(self) -> float:
        return abs(self.delta_ns) / 1e3 / self.seconds

    @property
    def uncertainty_ns(self) -> int:
        """How far `delta_ns` may be from the clocks' true move: the two exchanges' uncertainties together."""
        return self.first.uncertainty_ns + self.second.uncertainty_ns

    def to_dict(self) -> dict:
        return {"from": self.first.label, "to": self.second.label, "delta_ns": self.delta_ns,
                "uncertainty_ns": self.uncertainty_ns, "excess_ns": self.excess_ns, "seconds": self.seconds,
                "ppm": self.ppm}


@dataclass(frozen=True)
class ClockCheck:
    status: str  # the worker's: "ok" | "drift" | "stepped" (re-mapped) | "broken" (a group could not be mapped)
    groups: Mapping[str, GroupMapping]
    moves: tuple[Move, ...]
    evidence: tuple[str, ...]
    exchanges: tuple[Exchange, ...] = ()
    client_evidence: tuple[str, ...] = ()  # steps of this client's wall clock (they move no phase)
    drifted: str = ""  # whose clock drifts, when the exchanges show drift: "worker" or "either" (see `_drift_side`)

    @property
    def broken(self) -> bool:
        return self.status == "broken"

    def to_dict(self) -> dict:
        return {"status": self.status, "groups": {k: v.to_dict() for k, v in self.groups.items()},
                "moves": [m.to_dict() for m in self.moves], "evidence": list(self.evidence),
                "exchanges": [e.to_dict() for e in self.exchanges],
                "client_status": "stepped" if self.client_evidence else "ok",
                "client_evidence": list(self.client_evidence), "drifted": self.drifted}


def client_steps(exchanges: Sequence[Exchange]) -> list[str]:
    """Evidence lines for each step of this client's wall clock between consecutive exchanges that recorded it.

    The client times everything on its own clock (`clock.now_ns`, advanced by the monotonic clock), so a wall
    clock step moves no phase and no offset; it is named here for what it is, on the client's side."""
    out = []
    known = [e for e in exchanges if e.client_lead_ns is not None]
    for a, b in zip(known, known[1:]):
        assert a.client_lead_ns is not None and b.client_lead_ns is not None
        delta = b.client_lead_ns - a.client_lead_ns
        if abs(delta) >= CLIENT_STEP_MIN_NS:
            out.append(f"this client's wall clock moved {_fmt(delta)} against its monotonic clock between the "
                       f"exchanges {a.label or 'before'} and {b.label or 'after'}: a step of the client's clock, "
                       "not the worker's; the phases are timed on the client's monotonic clock, so none moved with it")
    return out


def _drift_side(a: Exchange, b: Exchange) -> str:
    """Whose clock drifts between two exchanges: a step is always the worker's (this client times on its
    monotonic clock, which nothing steps), but two clocks drifting apart cannot say which one moves unless one
    is known to be disciplined: "worker" when this client's was at both exchanges, else "either"."""
    return "worker" if a.client_synchronized and b.client_synchronized else "either"


def _fmt(ns: float) -> str:
    s = ns / 1e9
    a = abs(s)
    if a >= 60:
        minutes, seconds = divmod(round(a, 1), 60)
        return f"{'-' if s < 0 else '+'}{int(minutes)} min {seconds:04.1f} s"
    return f"{s:+.2f} s" if a >= 1 else f"{s * 1e3:+.1f} ms" if a >= 1e-3 else f"{s * 1e6:+.0f} us"


def _moves(exchanges: Sequence[Exchange]) -> list[Move]:
    out = []
    for a, b in zip(exchanges, exchanges[1:]):
        excess = max(0, max(a.low, b.low) - min(a.high, b.high))
        out.append(Move(a, b, b.offset_ns - a.offset_ns, excess))
    return out


def _meet(low: int | None, high: int | None, a: int, b: int) -> tuple[int, int] | None:
    lo, hi = a if low is None else max(a, low), b if high is None else min(b, high)
    return (lo, hi) if lo <= hi else None


def _mapped(name: str, span: tuple[int, int], source: str) -> GroupMapping:
    lo, hi = span
    return GroupMapping(name, (lo + hi) // 2, (hi - lo + 1) // 2, source)


def check(exchanges: Iterable[Exchange], groups: Iterable[Group]) -> ClockCheck:
    """Map each group's worker events, checking the exchanges against each other and against causality."""
    ex = sorted(exchanges, key=lambda e: e.at_ns)
    if not ex:
        raise ValueError("a clock check needs at least one exchange")
    moves = _moves(ex)
    moved = [m for m in moves if m.excess_ns > 0]
    evidence: list[str] = []
    if not moved:
        status = "ok"
    elif all(m.ppm <= MAX_DRIFT_PPM for m in moved):
        status = "drift"
    else:
        status = "stepped"
    drifted = ""
    for m in moved:
        between = (f"in {m.seconds:.2f} s between the exchanges {m.first.label or 'before'} and "
                   f"{m.second.label or 'after'}")
        if m.ppm <= MAX_DRIFT_PPM:
            side = _drift_side(m.first, m.second)
            drifted = "either" if "either" in (drifted, side) else side
            evidence.append(
                f"the worker's clock drifted {_fmt(m.delta_ns)} against this client's disciplined clock {between} "
                f"({m.ppm:.0f} ppm: drift)" if side == "worker" else
                f"the worker's clock and this client's drifted {_fmt(m.delta_ns)} apart {between} ({m.ppm:.0f} ppm: "
                "drift; this client's clock is not known to be disciplined, so either may be the one that drifts)")
            continue
        kind = ("a step" if m.ppm > 100_000 else f"a step, or a clock running {m.ppm / 1e4:.2g}% off: no "
                f"disciplined clock drifts faster than {MAX_DRIFT_PPM:.0f} ppm")
        evidence.append(f"the worker's clock moved {_fmt(m.delta_ns)} against this client's {between} "
                        f"({m.ppm:.0f} ppm: {kind})")
    rate = 0.0
    if status == "drift":
        rate = max(m.ppm for m in moved) / 1e6
    mapped: dict[str, GroupMapping] = {}
    broken = False
    for g in groups:
        low, high = g.window()
        if low is not None and high is not None and low > high:
            broken = True
            mapped[g.name] = GroupMapping(g.name, None, 0, "broken: its worker times contradict the order of events")
            why_low = max(g.lows)[1]
            why_high = min(g.highs)[1]
            evidence.append(f"the {g.name}'s worker times cannot all be right on any one mapping ({why_low} and "
                            f"{why_high} disagree by {_fmt(low - high)}): the worker's clock moved inside it")
            continue
        result = None
        if status in ("ok", "drift"):
            near = min(ex, key=lambda e: abs(e.at_ns - g.at_ns))
            if status == "ok":
                a, b = max(e.low for e in ex), min(e.high for e in ex)
                if a > b:  # pairwise-agreeing exchanges whose chain drifts apart: the nearest one
                    a, b = near.low, near.high
                source = f"{len(ex)} agreeing exchanges"
            else:
                widen = int(rate * abs(g.at_ns - near.at_ns))
                a, b = near.low - widen, near.high + widen
                source = f"the exchange {near.label or 'nearest'}, widened by {_fmt(widen)} of drift"
            span = _meet(low, high, a, b)
            if span is not None:
                result = _mapped(g.name, span, source + (" and the order of events" if span != (a, b) else ""))
        if result is None:
            for e in sorted(ex, key=lambda e: abs(e.at_ns - g.at_ns)):
                span = _meet(low, high, e.low, e.high)
                if span is not None:
                    result = _mapped(g.name, span, f"re-mapped from the exchange {e.label or 'nearest'}, the "
                                                   "nearest that agrees with the order of events")
                    if status == "ok":
                        status = "stepped"
                    evidence.append(f"the {g.name}'s worker times were {result.source}")
                    break
        if result is None:
            broken = True
            result = GroupMapping(g.name, None, 0, "broken: no exchange agrees with the order of events")
            evidence.append(f"no clock exchange agrees with the order of the {g.name}'s events: its cross-machine "
                            "phases are not measured")
        mapped[g.name] = result
    if broken:
        status = "broken"
    return ClockCheck(status, mapped, tuple(moves), tuple(evidence), tuple(ex), tuple(client_steps(ex)),
                      drifted if status == "drift" else "")
