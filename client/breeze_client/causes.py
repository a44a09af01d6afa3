"""Naming the cause of one slow phase in one run, from the evidence that phase carries.

A phase's length alone names nothing: a 30 s commit is a slow volume if the worker spent it inside its
fsyncs, a starved worker if it spent them waiting for a CPU, and a stalled worker if neither; a slow
transfer is the link, a window, a slow disk read or a starved client or worker depending on the rates and
the waits. Each rule here compares what was measured inside the phase (`Timeline.evidence`: the worker's
fsync, read and send times and its own wait for a CPU, the client's CPU wait, the chunks' arrival span,
bytes in flight per round trip against the stream window) before it names a cause, and returns the
comparison as evidence: it starts with what was measured and ends with the comparison that named the cause
(the verdict's headline keeps both). A storage or network cause is named only when the time went there and
not to waiting for a CPU. A rule sees one run only, so the cause cannot depend on how many runs there were;
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
CPU_PHASE_SHARE = 0.5  # ... and a wait that could account for at least this share of the phase named for it
STORAGE_SHARE = 0.5  # storage calls that took this share of a worker phase are its cause
HELD_BURST_SHARE = 0.25  # data that arrived within this share of the time the worker took to send it came in a burst
HELD_SEND_MIN_NS = 20_000_000  # a response sent faster than this cannot show that a buffer held it
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


def _cpu_line(who: str, wait: int | None, span: int | None, d: int, run: int | None = None) -> str | None:
    """`who waited W for a CPU over S (P%)` when the wait is a large share of span S (CPU_STARVED_SHARE, and at
    least CPU_STARVED_MIN_NS) and could account for most of a phase of `d` (CPU_PHASE_SHARE), else None."""
    if wait is None or not span or span <= 0:
        return None
    if wait < max(CPU_STARVED_SHARE * span, CPU_STARVED_MIN_NS, CPU_PHASE_SHARE * d):
        return None
    ran = f", ran {_s(run)}" if run is not None else ""
    return f"{who} waited {_s(min(wait, span))} for a CPU{ran} over {_s(span)} ({min(wait / span, 1.0):.0%})"


def _client_starved(t: Timeline, wait_key: str, span_ns: int | None, what: str, d: int) -> str | None:
    """An evidence line when the client thread waited for a CPU a large share of `span_ns`, else None."""
    run = _ev(t, "client_cpu_run_ns") if wait_key == "client_cpu_wait_ns" else None
    line = _cpu_line(f"the client's {what} thread", _ev(t, wait_key), span_ns, d, run)
    return None if line is None else line + ": the client is starved of CPU"


def _fetch_starved(t: Timeline, d: int) -> str | None:
    return _client_starved(t, "client_cpu_wait_ns", fetch_ns(t), "fetching", d)


def _job_span(t: Timeline) -> int | None:
    start, end = t.evidence.get("job_request_sent"), t.event("final_received")
    return None if start is None or end is None else int(end) - int(start)


def _worker_fetch_starved(t: Timeline, d: int, request_ns: int | None = None) -> str | None:
    """An evidence line when the worker was held from running through this fetch, else None: its wait for a CPU
    (its event loop's, or its CPU quota holding every thread) while the request reached the handler (since the
    job's final message, at most the request's transit) and over the handler, against that time."""
    handler, span = _ev(t, "worker_handler_cpu_wait_ns"), _ev(t, "worker_handler_span_ns")
    arrival = _ev(t, "worker_arrival_cpu_wait_ns")
    if handler is None or span is None:
        return None
    transit = 0 if request_ns is None else max(request_ns, 0)
    before = 0 if arrival is None else min(arrival, transit)
    line = _cpu_line("the worker", handler + before, span + (transit if before else 0), d,
                     _ev(t, "worker_handler_cpu_run_ns"))
    if line is None:
        return None
    where = f" ({_s(before)} of it before the request reached its handler)" if before else ""
    return line + where + ": the worker is starved of CPU"


def _worker_wait_in(what: str, wait: int | None, d: int, note: str = "") -> str | None:
    """An evidence line when the worker waited for a CPU for at least half of a worker-side step of `d`."""
    line = _cpu_line(f"the worker's {what}", wait, d, d)
    return None if line is None else line + note + ": the worker is starved of CPU"


def _net(total: int, wait: int | None) -> int:
    """A worker step's time less its wait for a CPU (the step itself)."""
    return max(0, total - (wait or 0))


# ---- one rule per phase ----

def _commit(t: Timeline, pt: PhaseTime) -> Finding:
    d = pt.duration_ns or 0
    storage, fsync = _ev(t, "commit_storage_ns"), _ev(t, "commit_fsync_ns")
    nbytes = _ev(t, "commit_bytes") or t.file_bytes
    if storage is None:
        return Finding("storage_write", [f"the commit took {_s(d)}; the worker does not report its commit steps "
                                         "(an older worker), so storage is only presumed"])
    wait, storage_wait = _ev(t, "worker_commit_cpu_wait_ns"), _ev(t, "worker_commit_storage_cpu_wait_ns")
    fsync_wait = _ev(t, "worker_commit_fsync_cpu_wait_ns")
    started, done = t.evidence.get("commit_started"), t.event("generation_done")
    queued = None if started is None or done is None else max(0, int(started) - done)
    parts = [f"{_s(storage)} inside its storage calls ({_s(fsync)} of them fsync)"]
    if queued is not None:
        parts.append(f"{_s(queued)} before the artifact writer took it up")
    parts.append(f"{_s(max(0, d - storage - (queued or 0)))} elsewhere")
    ev = [f"the commit took {_s(d)}: " + ", ".join(parts)]
    inside = f" ({_s(storage_wait)} of it inside the storage calls)" if storage_wait else ""
    starved = _worker_wait_in("commit threads", wait, d, inside)
    if starved and _net(storage, storage_wait) < STORAGE_SHARE * d:
        return Finding("worker_cpu", ev + [starved])
    if wait is not None:
        ev.append(f"the worker's commit threads waited {_s(wait)} of it for a CPU{inside}")
    if _net(storage, storage_wait) >= STORAGE_SHARE * d:
        synced_in = _net(fsync or 0, fsync_wait) or _net(storage, storage_wait)
        rate = _rate(nbytes / (synced_in / 1e9), bits=False)
        # the worker writes back while streaming: its count is what was still in memory when the sync began
        part = (f" (what the worker still held of the {t.file_bytes / 1e6:.2f} MB file; the rest reached the volume "
                "while it streamed)" if t.file_bytes and nbytes < t.file_bytes else "")
        ev.append(f"{nbytes / 1e6:.2f} MB{part} made durable in {_s(synced_in)} = {rate}: the commit's time went to "
                  "the volume")
        return Finding("storage_write", ev)
    ev.append("most of the commit went by outside the storage calls"
              + (" and not waiting for a CPU: the worker was stalled around them" if wait is not None else
                 ": the worker was busy or stalled around them (it does not report its wait for a CPU)"))
    return Finding("worker_busy", ev)


def _notify(t: Timeline, pt: PhaseTime) -> Finding:
    d = pt.duration_ns or 0
    ev = [f"the final message reached the client {_s(d)} after the commit"]
    starved = _client_starved(t, "synthesis_cpu_wait_ns", _job_span(t), "streaming", d)
    if starved:
        return Finding("client_cpu", ev + [starved])
    in_worker = _ev(t, "worker_notify_span_ns")
    held_before, arrival = _ev(t, "worker_notify_cpu_wait_ns"), _ev(t, "worker_arrival_cpu_wait_ns")
    if in_worker is not None and (held_before is not None or arrival is not None):
        # held before the message was handed to gRPC, and after (gRPC's threads send it: the wait from the final
        # message to the fetch's handler, at most what is left of the phase)
        held_after = min(arrival or 0, max(0, d - in_worker))
        starved = _worker_wait_in("threads", (held_before or 0) + held_after, d,
                                  f" ({_s(held_after)} of it after it was handed to gRPC)" if held_after else "")
        if starved:
            return Finding("worker_cpu", ev + [f"the worker handed it to gRPC {_s(in_worker)} after the commit",
                                               starved])
    if in_worker is not None and in_worker >= CPU_PHASE_SHARE * d:
        ev.append(f"the worker handed it to gRPC {_s(in_worker)} after the commit")
        return Finding("worker_busy", ev + ["the worker was slow to send it, without waiting for a CPU"])
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
    """One run's view of the gap: the client starved of CPU, or a connection set up inside it (a cold start);
    otherwise the application's own delay, which only several runs tell from a polling loop (gaps.py)."""
    d = pt.duration_ns or 0
    ev = [f"the client waited {_s(d)} between the final message and its artifact request"]
    gap_wait = _ev(t, "client_gap_cpu_wait_ns")
    starved = (_client_starved(t, "client_gap_cpu_wait_ns", d, "application", d) if gap_wait is not None else
               _fetch_starved(t, d) or _client_starved(t, "synthesis_cpu_wait_ns", _job_span(t), "streaming", d))
    if starved:
        return Finding("client_cpu", ev + [starved])
    setup = _setup_in_gap(t)
    if setup:
        return Finding("cold_start", ev + setup)
    return Finding("client_delay", ev, needs_runs=GAP_NEEDS_RUNS)


GAP_NEEDS_RUNS = ("one run cannot tell a polling loop (gaps that vary from run to run) from a fixed delay (the "
                  "same gap every time): compare several runs (-n 3)")


def _setup_in_gap(t: Timeline) -> list[str] | None:
    """Evidence lines when the client set up its artifact connection (or its clock exchange) after the final
    message arrived, inside the gap: a fresh client or connection per retrieval; else None."""
    final = t.event("final_received")
    opened, clocked = _ev(t, "artifact_channel_opened"), _ev(t, "artifact_clock_measured")
    if final is None:
        return None
    lines = []
    if opened is not None and opened >= final:
        lines.append(f"the client opened its artifact channel {_s(opened - final)} after the final message: the "
                     "connection was set up inside the gap")
    if clocked is not None and clocked >= final:
        lines.append(f"it exchanged clocks with the worker {_s(clocked - final)} after the final message, before "
                     "the request")
    return lines or None


def _request(t: Timeline, pt: PhaseTime) -> Finding:
    d = pt.duration_ns or 0
    ev = [f"the request took {_s(d)} to reach the worker's handler"]
    starved = _fetch_starved(t, d)
    if starved:
        return Finding("client_cpu", ev + [starved])
    starved = _worker_fetch_starved(t, d, request_ns=d)
    if starved:
        return Finding("worker_cpu", ev + [starved])
    rtt = _rtt_s(t)
    if rtt is not None:
        ev.append(f"the path's round trip (clock exchange) is {format_seconds(rtt)}")
        if d / 1e9 > 2 * rtt + LATENCY_SLACK_S:
            setup = _setup_in_gap(t)
            if setup:
                ev += setup
                ev.append("more than two round trips: the connection was still being set up")
                return Finding("cold_start", ev)
            ev.append("more than two round trips, on a connection that was already open: the request waited on the "
                      "path (a proxy, a congested link)")
    return Finding("network_latency", ev)


def _server_first_byte(t: Timeline, pt: PhaseTime) -> Finding:
    d = pt.duration_ns or 0
    opened = _ev(t, "worker_open_ns")
    if opened is None:
        return Finding("storage_read", [f"the worker took {_s(d)} to its first message; it does not say how long "
                                        "the open took"])
    wait = _ev(t, "worker_open_cpu_wait_ns")
    ev = [f"the worker took {_s(d)} from the request to its first message, {_s(opened)} of it opening the "
          "artifact (sidecar read, open, size check)"]
    if wait is not None:
        ev.append(f"it waited {_s(min(wait, d))} of the {_s(d)} for a CPU")
    if _net(opened, wait) >= STORAGE_SHARE * d:
        return Finding("storage_read", ev + ["the artifact volume answers slowly"])
    starved = _worker_wait_in("Fetch handler", wait, d)
    if starved:
        return Finding("worker_cpu", ev + [starved])
    ev.append(f"{_s(d - opened)} after the file was open: the worker itself was slow to answer")
    return Finding("worker_busy", ev)


def _first_byte_transit(t: Timeline, pt: PhaseTime) -> Finding:
    d = pt.duration_ns or 0
    first = t.first_chunk_bytes
    ev = [f"the response's first message ({first / 1024:.0f} KiB of file data) took {_s(d)} from the worker "
          "to the client"]
    starved = _fetch_starved(t, d)
    if starved:
        return Finding("client_cpu", ev + [starved])
    rtt = _rtt_s(t)
    starved = _worker_fetch_starved(t, d - int((rtt or 0) * 1e9))  # what a one-way delay cannot explain
    if starved and (rtt is None or d / 1e9 > rtt + LATENCY_SLACK_S):
        return Finding("worker_cpu", ev + [starved])
    if rtt is not None:
        ev.append(f"the path's round trip (clock exchange) is {format_seconds(rtt)}: no one-way delay is longer")
    if first > 0 and rtt is not None and d / 1e9 > rtt + LATENCY_SLACK_S:
        rate = first / (d / 1e9 - rtt / 2)  # a first message with file bytes moved at the path's rate
        ev.append(f"much longer than the one-way delay: its {first / 1024:.0f} KiB moved at about {_rate(rate)}")
        return Finding(_rate_cause(t, rate, ev), ev)
    held = _held_to_the_end(t) or _held_past_the_path(t, d)
    if held:
        if (delivered := delivery_rate(t)) is not None:
            ev.append(f"through the buffer the path delivered {_rate(delivered)} (first byte sent -> last byte "
                      "received); the burst rate behind it says nothing about the path")
        return Finding("buffering_intermediary", ev + held)
    waited = _waited_past_the_path(t, d)
    if waited is not None:
        return Finding(waited[0], ev + waited[1])
    if rtt is not None and d / 1e9 > rtt + 4 * LATENCY_SLACK_S and t.parallel > 1:
        ev.append(f"{t.parallel} fetches shared the connection: the first message waited behind the others' bytes")
        return Finding("bandwidth", ev)
    return Finding("network_latency", ev)


def _waited_past_the_path(t: Timeline, d: int) -> tuple[str, list[str]] | None:
    """(cause, evidence) when the first message took over twice the path's round trip (a loaded host adds tens of
    ms to a transit: that stays latency), no buffer held it (`_held_past_the_path`: the waits take up too much of
    it), and one side's wait for a CPU is a real share of the excess: that side. A held worker's gRPC threads
    send what its handler handed them, unseen by its counters, so its wait shows only in part."""
    if not t.rtt_ns:
        return None
    excess = d - t.rtt_ns
    worker, client = _ev(t, "worker_handler_cpu_wait_ns") or 0, _ev(t, "client_cpu_wait_ns") or 0
    if excess < max(CPU_STARVED_MIN_NS, t.rtt_ns) \
            or max(worker, client) < max(CPU_STARVED_MIN_NS, CPU_STARVED_SHARE * excess):
        return None
    line = (f"{_s(excess)} of it is more than the path's round trip allows and no buffer held it: the "
            f"{'worker' if worker >= client else 'client'} waited {_s(max(worker, client))} for a CPU over the fetch "
            f"(the {'client' if worker >= client else 'worker'} {_s(min(worker, client))})")
    if worker >= client:
        return "worker_cpu", [line + ": the worker is starved of CPU"]
    return "client_cpu", [line + ": the client is starved of CPU"]


def _held_past_the_path(t: Timeline, d: int) -> list[str] | None:
    """An evidence line when most of the first message's transit is more than any one-way delay on the path can
    be, even after both sides' waits for a CPU: something on the path held it. (A response sent within a round
    trip cannot show whether the rest was held with it: `_held_to_the_end` needs a longer one.)"""
    if not t.rtt_ns:
        return None
    waits = (_ev(t, "client_cpu_wait_ns") or 0) + (_ev(t, "worker_handler_cpu_wait_ns") or 0)
    held = d - t.rtt_ns - waits
    if held < CPU_PHASE_SHARE * d or held < HELD_SEND_MIN_NS:
        return None
    return [f"{_s(held)} of it is more than the path's round trip and both sides' waits for a CPU ({_s(waits)}) "
            "allow: something between the worker and the client held the first message"]


def _held_to_the_end(t: Timeline) -> list[str] | None:
    """Evidence lines when the response's first byte was held until the worker had sent its last one, else None.

    On a path that only delays, the first byte arrives one one-way delay (at most a round trip) after it was
    sent. When the worker took longer than two round trips to send the whole response and the first byte still
    arrived only after the last was sent, with all the data right behind it, something on the path held the
    response and let it go at once. A response sent within a round trip (one small chunk) cannot tell a buffer
    from a delay: both deliver it together, one one-way delay late."""
    first_sent, first_received = t.event("first_byte_sent"), t.event("first_byte_received")
    last_sent, span = _ev(t, "last_byte_sent"), _ev(t, "data_receive_span_ns")
    if first_sent is None or first_received is None or last_sent is None or span is None or not t.rtt_ns:
        return None
    sending = last_sent - first_sent  # one group's mapping: the worker's own clock difference
    unc = t.uncertainty_of("first_byte_sent")
    if sending < max(2 * t.rtt_ns + 2 * unc, HELD_SEND_MIN_NS) or first_received < last_sent - unc:
        return None
    if span > HELD_BURST_SHARE * sending or transfer_bytes(t) <= 0:
        return None
    lines = [f"the worker took {_s(sending)} to send the response, more than two round trips, yet its first byte "
             f"arrived {_s(first_received - last_sent)} after the last one was sent",
             f"then all {transfer_bytes(t) / 1e6:.2f} MB of data arrived within {_s(span)}: the first byte was "
             "held back with the rest and released in one burst"]
    return lines


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
    starved = _fetch_starved(t, d)
    if starved:
        return Finding("client_cpu", ev + [starved])
    starved_worker = _worker_fetch_starved(t, d)  # a held worker's reads and sends are slow too
    read, send_wait = _ev(t, "worker_read_ns"), _ev(t, "worker_send_wait_ns")
    read_wait = _ev(t, "worker_read_cpu_wait_ns")
    if read is not None:
        ev.append(f"the worker spent {_s(read)} reading the file"
                  + (f" ({_rate(size / (read / 1e9), bits=False)})" if read else "")
                  + (f", {_s(read_wait)} of it waiting for a CPU" if read_wait else "")
                  + (f" and {_s(send_wait)} waiting for the connection to take it" if send_wait is not None else ""))
    if starved_worker:
        return Finding("worker_cpu", ev + [starved_worker])
    if read is not None and _net(read, read_wait) >= STORAGE_SHARE * d:
        ev.append("the reads took most of the transfer: the artifact volume reads slower than the path carries")
        return Finding("storage_read", ev)
    if size and wire > 1.25 * size:
        ev.append(f"the wire carried {wire / size:.2f}x the file's bytes")
        return Finding("payload_encoding", ev)
    cause = _rate_cause(t, rate, ev, d)
    if cause == "bandwidth" and not _queued(t) and t.chunks >= 8 and size / t.chunks < SMALL_CHUNK:
        ev.append(f"{t.chunks} chunks of under {SMALL_CHUNK // 1024} KiB and no sign the link held them back: each "
                  "message's own cost sets the pace")
        return Finding("per_message_overhead", ev)
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
        _in_flight(t, rate, rtt, ev)
        ev.append(f"the worker waited {_s(wait)} of the {_s(duration_ns)} for flow control to let its chunks go, "
                  f"while none queued on the path (at most {_s(queue)} behind the fastest): the window, not the "
                  "link, set the pace")
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
    starved = _fetch_starved(t, pt.duration_ns or 0)
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

