"""This client's clock, and the clock exchange that maps the worker's timestamps onto it.

The client's clock (`now_ns`) is the wall clock as it read when the SDK was loaded, advanced by the
monotonic clock since: it reads like `time.time_ns`, but a step of the wall clock afterwards (an operator,
an NTP step, a suspended VM put right) moves no client time, so a phase measured on this machine is what
elapsed. How far the wall clock has moved away from it (`wall_lead_ns`) is recorded with each exchange,
which names a step of this client's wall clock for what it is.

Each sample is one Clock.Exchange round trip: t0 (client send), t1 (worker receive), t2 (worker send),
t3 (client receive). offset = ((t1 - t0) + (t2 - t3)) / 2 is worker clock minus client clock; the
true offset lies within +-(round trip - worker time) / 2 of it. Of several samples the one with the
smallest round trip is kept: its uncertainty is the smallest.
"""

from __future__ import annotations

import ctypes
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass

from breeze_tts_proto.v1 import clock_pb2

DEFAULT_SAMPLES = 5
_ANCHOR_NS = time.time_ns() - time.monotonic_ns()  # the wall clock at load, less the monotonic clock


def now_ns() -> int:
    """This client's clock in ns since the epoch: the wall clock at load + the monotonic clock's progress."""
    return time.monotonic_ns() + _ANCHOR_NS


def wall_lead_ns() -> int:
    """How far the wall clock (`time.time_ns`) reads ahead of `now_ns`: about 0 unless it was stepped since."""
    return time.time_ns() - now_ns()


_TIME_ERROR = 5  # adjtimex's state for a clock that nothing disciplines (not synchronized)


def synchronized() -> bool | None:
    """Whether this host's kernel says its clock is disciplined (NTP, chrony: adjtimex's read-only query is not
    TIME_ERROR); None where the kernel cannot be asked (not Linux). Two clocks that drift apart cannot say
    which one moves; a synchronized one is not it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        timex = ctypes.create_string_buffer(512)  # struct timex (about 208 bytes), zeroed: modes 0 reads only
        state = libc.adjtimex(timex)
    except (OSError, AttributeError):
        return None
    return None if state < 0 else state != _TIME_ERROR


@dataclass(frozen=True)
class ClockSample:
    client_send_ns: int
    server_receive_ns: int
    server_send_ns: int
    client_receive_ns: int

    @property
    def rtt_ns(self) -> int:
        return (self.client_receive_ns - self.client_send_ns) - (self.server_send_ns - self.server_receive_ns)

    @property
    def offset_ns(self) -> int:
        return ((self.server_receive_ns - self.client_send_ns) + (self.server_send_ns - self.client_receive_ns)) // 2


@dataclass(frozen=True)
class ClockMapping:
    """worker clock = client clock + offset_ns, give or take uncertainty_ns."""

    offset_ns: int = 0
    uncertainty_ns: int = 0
    rtt_ns: int = 0
    samples: int = 0  # 0: no exchange was made (identity mapping, unknown uncertainty)
    measured_at_ns: int = 0  # client clock when the exchange finished
    wall_lead_ns: int = 0  # how far this client's wall clock read ahead of its clock then (`wall_lead_ns`)
    client_synchronized: bool | None = None  # whether this host's clock was disciplined then (`synchronized`)

    def to_client(self, server_ns: int) -> int | None:
        """A worker timestamp on the client clock (None for an unset timestamp, 0)."""
        return None if not server_ns else int(server_ns) - self.offset_ns

    def to_dict(self) -> dict:
        return {"offset_ns": self.offset_ns, "uncertainty_ns": self.uncertainty_ns, "rtt_ns": self.rtt_ns,
                "samples": self.samples, "measured_at_ns": self.measured_at_ns, "wall_lead_ns": self.wall_lead_ns,
                "client_synchronized": self.client_synchronized}


def request() -> tuple[clock_pb2.ClockExchangeRequest, int]:
    t0 = now_ns()
    return clock_pb2.ClockExchangeRequest(client_send_unix_ns=t0), t0


def sample(t0: int, reply: clock_pb2.ClockExchangeResponse, t3: int) -> ClockSample:
    return ClockSample(t0, reply.server_receive_unix_ns, reply.server_send_unix_ns, t3)


def best_mapping(samples: Iterable[ClockSample]) -> ClockMapping:
    samples = list(samples)
    if not samples:
        raise ValueError("a clock mapping needs at least one sample")
    best = min(samples, key=lambda s: s.rtt_ns)
    rtt = max(best.rtt_ns, 0)
    return ClockMapping(offset_ns=best.offset_ns, uncertainty_ns=(rtt + 1) // 2, rtt_ns=rtt, samples=len(samples),
                        measured_at_ns=now_ns(), wall_lead_ns=wall_lead_ns(), client_synchronized=synchronized())


def exchange(stub, samples: int = DEFAULT_SAMPLES, **call_kwargs) -> ClockMapping:
    """Measure the mapping with a synchronous ClockStub (`call_kwargs`: metadata, timeout)."""
    got = []
    for _ in range(max(1, samples)):
        req, t0 = request()
        reply = stub.Exchange(req, **call_kwargs)
        got.append(sample(t0, reply, now_ns()))
    return best_mapping(got)


async def exchange_async(stub, samples: int = DEFAULT_SAMPLES, **call_kwargs) -> ClockMapping:
    """Measure the mapping with a grpc.aio ClockStub."""
    got = []
    for _ in range(max(1, samples)):
        req, t0 = request()
        reply = await stub.Exchange(req, **call_kwargs)
        got.append(sample(t0, reply, now_ns()))
    return best_mapping(got)
