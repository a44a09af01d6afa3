"""Naming the cause of one slow phase in one run, from the evidence that phase carries.

A phase's length alone names nothing: a 30 s commit is a slow volume if the worker spent it inside its
fsyncs and a stalled worker if it did not; a slow transfer is the link, a window, a slow disk read or a
starved client depending on the rates. Each rule here compares what was measured inside the phase
(`Timeline.evidence`: the worker's fsync, read and send times, the client's CPU wait, the chunks' arrival
span, bytes in flight per round trip against the stream window) before it names a cause, and returns the
comparison as evidence. A rule sees one run only, so the cause cannot depend on how many runs there were;
where only several runs can tell two causes apart, the finding says so (`Finding.needs_runs`).

Pure functions over `phases.Timeline`: no I/O, no gRPC.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from breeze_client.phases import (
    PhaseTime,
    Timeline,
    delivery_rate,
    fetch_ns,
    format_seconds,
    transfer_bytes,
    transfer_rate,
    write_rate,
)

DEFAULT_HTTP2_WINDOW = 64 * 1024  # gRPC's initial HTTP/2 stream window before BDP probing grows it
SMALL_CHUNK = 32 * 1024  # below this, per-message overhead dominates in Python gRPC
CPU_STARVED_SHARE = 0.25  # a client thread that waited for a CPU this share of a span was starved of CPU,
CPU_STARVED_MIN_NS = 20_000_000  # if the wait is also this long (shorter ones are scheduling noise)
STORAGE_SHARE = 0.5  # storage calls that took this share of a worker phase are its cause
HELD_BURST_SHARE = 0.25  # data that all arrived within this share of the first byte's transit came in a burst
LATENCY_SLACK_S = 0.005  # scheduling slack on top of the path's one-way delay
QUEUE_MIN_NS = 20_000_000  # chunks delayed this much (and two round trips) more than the fastest queued on the path


@dataclass
class Finding:
    cause: str  # a verdict.CATALOGUE key
    evidence: list[str] = field(default_factory=list)
    needs_runs: str | None = None  # what several runs would tell apart, when one run cannot


def _s(ns: float | None) -> str:
    return format_seconds(None if ns is None else ns / 1e9)


def _rate(bytes_per_s: float, bits: bool = True) -> str:
    """MB/s (or kB/s below 1 MB/s), with Mbit/s for rates on a network path."""
    text = f"{bytes_per_s / 1e6:.2f} MB/s" if bytes_per_s >= 1e6 else f"{bytes_per_s / 1e3:.1f} kB/s"
    return text + (f" ({bytes_per_s * 8 / 1e6:.1f} Mbit/s)" if bits else "")


def _rtt_s(t: Timeline, synthesis: bool = False) -> float | None:
    """The path's round trip from its clock exchange. A one-way delay may be anything up to it (paths can be
    asymmetric), so a message slower than the round trip was held somewhere."""
    rtt = t.evidence.get("synthesis_rtt_ns") if synthesis else t.rtt_ns
    return None if not rtt else int(rtt) / 1e9


def _ev(t: Timeline, key: str) -> int | None:
    v = t.evidence.get(key)
    return None if v is None else int(v)


def _client_starved(t: Timeline, wait_key: str, span_ns: int | None, what: str) -> str | None:
    """An evidence line when the client thread waited for a CPU a large share of `span_ns`, else None."""
    wait = _ev(t, wait_key)
    if wait is None or not span_ns or span_ns <= 0 or wait < max(CPU_STARVED_SHARE * span_ns, CPU_STARVED_MIN_NS):
        return None
    run = _ev(t, "client_cpu_run_ns") if wait_key == "client_cpu_wait_ns" else None
    ran = f", ran {_s(run)}" if run is not None else ""
    return (f"the client's {what} thread waited {_s(wait)} for a CPU{ran} over {_s(span_ns)} "
            f"({wait / span_ns:.0%}): the client is starved of CPU")


def _fetch_starved(t: Timeline) -> str | None:
    return _client_starved(t, "client_cpu_wait_ns", fetch_ns(t), "fetching")


def _job_span(t: Timeline) -> int | None:
    start, end = t.evidence.get("job_request_sent"), t.event("final_received")
    return None if start is None or end is None else int(end) - int(start)


# ---- one rule per phase ----

def _commit(t: Timeline, pt: PhaseTime) -> Finding:
    d = pt.duration_ns or 0
    storage, fsync = _ev(t, "commit_storage_ns"), _ev(t, "commit_fsync_ns")
    nbytes = _ev(t, "commit_bytes") or t.file_bytes
    if storage is None:
        return Finding("storage_write", [f"the commit took {_s(d)}; the worker does not report its commit steps "
                                         "(an older worker), so storage is only presumed"])
    started, done = t.evidence.get("commit_started"), t.event("generation_done")
    queued = None if started is None or done is None else max(0, int(started) - done)
    parts = [f"{_s(storage)} inside its storage calls ({_s(fsync)} of them fsync)"]
    if queued is not None:
        parts.append(f"{_s(queued)} before the artifact writer took it up")
    parts.append(f"{_s(max(0, d - storage - (queued or 0)))} elsewhere")
    ev = [f"the commit took {_s(d)}: " + ", ".join(parts)]
    if storage >= STORAGE_SHARE * d:
        synced_in = fsync or storage
        rate = _rate(nbytes / (synced_in / 1e9), bits=False)
        # the worker writes back while streaming: its count is what was still in memory when the sync began
        part = (f" (what the worker still held of the {t.file_bytes / 1e6:.2f} MB file; the rest reached the volume "
                "while it streamed)" if t.file_bytes and nbytes < t.file_bytes else "")
        ev.append(f"{nbytes / 1e6:.2f} MB{part} made durable in {_s(synced_in)} = {rate}: the commit's time went to "
                  "the volume")
        return Finding("storage_write", ev)
    ev.append("most of the commit went by outside the storage calls: the worker was busy or stalled around them")
    return Finding("worker_busy", ev)


def _notify(t: Timeline, pt: PhaseTime) -> Finding:
    d = pt.duration_ns or 0
    ev = [f"the final message reached the client {_s(d)} after the commit"]
    starved = _client_starved(t, "synthesis_cpu_wait_ns", _job_span(t), "streaming")
    if starved:
        return Finding("client_cpu", ev + [starved])
    worker_span, client_span = _ev(t, "worker_audio_span_ns"), _ev(t, "client_audio_span_ns")
    if worker_span and client_span is not None and worker_span >= 50e6 \
            and client_span <= HELD_BURST_SHARE * worker_span:
        ev.append(f"the audio the worker streamed over {_s(worker_span)} reached the client within {_s(client_span)}: "
                  "something between them held the stream and let it go at once")
        return Finding("buffering_intermediary", ev)
    rtt = _rtt_s(t, synthesis=True)
    if rtt is not None:
        ev.append(f"the synthesis path's round trip (clock exchange) is {format_seconds(rtt)}")
        if d / 1e9 <= rtt + LATENCY_SLACK_S:
            return Finding("network_latency", ev)
    ev.append("longer than a whole round trip: the notice waited somewhere between the worker and the client")
    return Finding("polling", ev)


def _client_gap(t: Timeline, pt: PhaseTime) -> Finding:
    ev = [f"the client waited {_s(pt.duration_ns)} between the final message and its artifact request"]
    starved = _fetch_starved(t) or _client_starved(t, "synthesis_cpu_wait_ns", _job_span(t), "streaming")
    if starved:
        return Finding("client_cpu", ev + [starved])
    return Finding("cold_start", ev, needs_runs="a gap that varies from run to run is a polling interval, a steady "
                                                "one a start-up cost: compare several runs (-n 3)")


def _request(t: Timeline, pt: PhaseTime) -> Finding:
    d = pt.duration_ns or 0
    ev = [f"the request took {_s(d)} to reach the worker's handler"]
    starved = _fetch_starved(t)
    if starved:
        return Finding("client_cpu", ev + [starved])
    rtt = _rtt_s(t)
    if rtt is not None:
        ev.append(f"the path's round trip (clock exchange) is {format_seconds(rtt)}")
        if d / 1e9 > 2 * rtt + LATENCY_SLACK_S:
            ev.append("more than two round trips: the connection was set up (again) for this request")
            return Finding("cold_start", ev)
    return Finding("network_latency", ev)


def _server_first_byte(t: Timeline, pt: PhaseTime) -> Finding:
    d = pt.duration_ns or 0
    opened = _ev(t, "worker_open_ns")
    if opened is None:
        return Finding("storage_read", [f"the worker took {_s(d)} to its first message; it does not say how long "
                                        "the open took"])
    ev = [f"the worker took {_s(d)} from the request to its first message, {_s(opened)} of it opening the "
          "artifact (sidecar read, open, size check)"]
    if opened >= STORAGE_SHARE * d:
        return Finding("storage_read", ev + ["the artifact volume answers slowly"])
    ev.append(f"{_s(d - opened)} after the file was open: the worker itself was slow to answer")
    return Finding("worker_busy", ev)


def _first_byte_transit(t: Timeline, pt: PhaseTime) -> Finding:
    d = pt.duration_ns or 0
    first = t.first_chunk_bytes
    ev = [f"the response's first message ({first / 1024:.0f} KiB of file data) took {_s(d)} from the worker "
          "to the client"]
    starved = _fetch_starved(t)
    if starved:
        return Finding("client_cpu", ev + [starved])
    rtt = _rtt_s(t)
    held = rtt is not None and d / 1e9 > rtt + 4 * LATENCY_SLACK_S
    if rtt is not None:
        ev.append(f"the path's round trip (clock exchange) is {format_seconds(rtt)}: no one-way delay is longer")
    if first > 0 and rtt is not None and d / 1e9 > rtt + LATENCY_SLACK_S:
        rate = first / (d / 1e9 - rtt / 2)  # a first message with file bytes moved at the path's rate
        ev.append(f"much longer than the one-way delay: its {first / 1024:.0f} KiB moved at about {_rate(rate)}")
        return Finding(_rate_cause(t, rate, ev), ev)
    span = _ev(t, "data_receive_span_ns")
    if held and span is not None and transfer_bytes(t) > 0 and span <= HELD_BURST_SHARE * d:
        ev.append(f"then all {transfer_bytes(t) / 1e6:.2f} MB of data arrived within {_s(span)}: the first byte was "
                  "held back with the rest and released in one burst")
        if (delivered := delivery_rate(t)) is not None:
            ev.append(f"through the buffer the path delivered {_rate(delivered)} (first byte sent -> last byte "
                      "received); the burst rate behind it says nothing about the path")
        sent = _ev(t, "worker_send_span_ns")
        if sent:
            ev.append(f"the worker spent {_s(sent)} sending the data")
        return Finding("buffering_intermediary", ev)
    if held and t.parallel > 1:
        ev.append(f"{t.parallel} fetches shared the connection: the first message waited behind the others' bytes")
        return Finding("bandwidth", ev)
    return Finding("network_latency", ev)


def _transfer(t: Timeline, pt: PhaseTime) -> Finding:
    d = pt.duration_ns or 0
    rate = transfer_rate(t)
    moved, size, wire = transfer_bytes(t), t.file_bytes, t.wire_bytes
    ev = [f"{moved / 1e6:.2f} MB of file data in {_s(d)}" + (f" = {_rate(rate)}" if rate else "")]
    if t.chunks:
        ev.append(f"{t.chunks} chunk{'s' if t.chunks != 1 else ''} of ~{size / t.chunks / 1024:.0f} KiB, compression "
                  f"{t.compression}, {wire / 1e6:.2f} MB on the wire")
    if t.resumes:
        ev.append(f"the stream broke and resumed {t.resumes} time(s)")
        return Finding("connection_drops", ev)
    starved = _fetch_starved(t)
    if starved:
        return Finding("client_cpu", ev + [starved])
    read, send_wait = _ev(t, "worker_read_ns"), _ev(t, "worker_send_wait_ns")
    if read is not None:
        ev.append(f"the worker spent {_s(read)} reading the file"
                  + (f" ({_rate(size / (read / 1e9), bits=False)})" if read else "")
                  + (f" and {_s(send_wait)} waiting for the connection to take it" if send_wait is not None else ""))
        if read >= STORAGE_SHARE * d:
            ev.append("the reads took most of the transfer: the artifact volume reads slower than the path carries")
            return Finding("storage_read", ev)
    if size and wire > 1.25 * size:
        ev.append(f"the wire carried {wire / size:.2f}x the file's bytes")
        return Finding("payload_encoding", ev)
    cause = _rate_cause(t, rate, ev, d)
    if cause == "bandwidth" and not _queued(t) and t.chunks >= 8 and size / t.chunks < SMALL_CHUNK:
        return Finding("per_message_overhead", ev)  # small chunks, and no sign the link held them back
    finding = Finding(cause, ev)
    if cause == "window_limited" and t.evidence.get("stream_window_bytes") is None:
        finding.needs_runs = ("with BDP probing on, the window may still have been growing: fetch in parallel "
                              "(--parallel): parallel fetches add up past a window limit but share a link limit")
    return finding


def _rate_cause(t: Timeline, rate: float | None, ev: list[str], duration_ns: int | None = None) -> str:
    """bandwidth or window_limited: chunks that queued on the path mean the link; a worker held back by flow
    control while nothing queued means the window; else bytes in flight per round trip against the window."""
    rtt = None if not t.rtt_ns else t.rtt_ns / 1e9
    if rate and t.parallel > 1:
        ev.append(f"{t.parallel} fetches shared the path at once (this one's share: {_rate(rate)})")
    if not rate or rtt is None:
        return "bandwidth"
    queue, wait = _ev(t, "path_queue_ns"), _ev(t, "worker_send_wait_ns")
    if _queued(t):
        ev.append(f"chunks waited up to {_s(queue)} longer on the way than the fastest one (round trip "
                  f"{format_seconds(rtt)}): bytes queued on the path, so the link is the bottleneck")
        return "bandwidth"
    if rtt > 0.002 and wait is not None and duration_ns and wait >= 0.5 * duration_ns:
        ev.append(f"the worker waited {_s(wait)} of the {_s(duration_ns)} for flow control to let its chunks go, "
                  f"while none queued on the path (at most {_s(queue)} behind the fastest): the window, not the "
                  "link, set the pace")
        _in_flight(t, rate, rtt, ev)
        return "window_limited"
    in_flight, effective = _in_flight(t, rate, rtt, ev)
    if rtt > 0.002 and 0.75 * effective <= in_flight <= 1.3 * effective:
        ev.append("about one window per round trip: the flow-control window, not the link, sets the rate")
        return "window_limited"
    if (wait := _ev(t, "worker_send_wait_ns")) is not None and t.evidence.get("worker_read_ns") is not None:
        ev.append(f"the worker's writes waited {_s(wait)} for the connection while its reads took "
                  f"{_s(_ev(t, 'worker_read_ns'))}: the path set the pace")
    return "bandwidth"


def _queued(t: Timeline) -> bool:
    """Whether chunks queued on the path (the slowest took two round trips, and 20 ms, longer than the fastest)."""
    queue, rtt = _ev(t, "path_queue_ns"), t.rtt_ns
    return queue is not None and rtt is not None and rtt != 0 and queue >= max(2 * rtt, QUEUE_MIN_NS)


def _in_flight(t: Timeline, rate: float, rtt: float, ev: list[str]) -> tuple[float, float]:
    """(bytes in flight per round trip, the effective stream window), with the evidence line."""
    fixed = t.evidence.get("stream_window_bytes")
    window = int(fixed) if fixed else DEFAULT_HTTP2_WINDOW
    chunk = t.file_bytes / t.chunks if t.chunks else 0
    effective = max(window, chunk)  # gRPC lets a whole awaited message in whatever the window
    in_flight = rate * rtt
    ev.append(f"round trip {format_seconds(rtt)}: {in_flight / 1024:.0f} KiB in flight per round trip"
              + (" per fetch" if t.parallel > 1 else "") + f", against a stream window of {effective / 1024:.0f} KiB"
              + (" (fixed by the client's channel options)" if fixed else " (gRPC's initial window; BDP probing "
                                                                          "grows it)"))
    return in_flight, effective


def _client_write(t: Timeline, pt: PhaseTime) -> Finding:
    rate = write_rate(t)
    ev = [f"writing and fsyncing the file took {_s(pt.duration_ns)}"
          + (f" ({_rate(rate, bits=False)})" if rate else "")]
    starved = _fetch_starved(t)
    if starved:
        return Finding("client_cpu", ev + [starved])
    return Finding("slow_client_disk", ev)


RULES = {
    "commit": _commit, "notify": _notify, "client_gap": _client_gap, "request": _request,
    "server_first_byte": _server_first_byte, "first_byte_transit": _first_byte_transit,
    "transfer": _transfer, "client_write": _client_write,
}


def classify(t: Timeline, pt: PhaseTime) -> Finding:
    """The cause of phase `pt` in run `t`, with the evidence compared to name it."""
    return RULES[pt.phase.name](t, pt)

