"""From the SDK's records of one retrieval to a `phases.Timeline`: clock-checked events and their evidence.

The SDK maps worker times with whatever mapping its channel held at the time; here they are taken back
to the worker's clock and mapped again by `clockcheck.check`, which weighs the clock exchanges made
around the retrieval against the order of its events (a worker event that caused a client event came
first). Three groups of worker times are mapped, each with one offset: the job's (start, first chunk,
generation done, commit), the Stat's (commit, for existing artifacts) and the fetch's (request received,
first byte, data and last byte sent). A group the check cannot map leaves its cross-machine phases
unmeasured, with the reason; its same-clock phases (commit, server first byte) still stand.

`Timeline.evidence` gets what each phase carries (see `phases.EVIDENCE`): the commit's storage steps, the
worker's open, read and send times, the arrival span of the data, the client threads' CPU wait, the
audio's send and arrival spans, the fixed stream window. Pure functions of the SDK's records.
"""

from __future__ import annotations

from collections.abc import Sequence

from breeze_client import hostcpu
from breeze_client.clock import ClockMapping
from breeze_client.clockcheck import ClockCheck, Exchange, Group, GroupMapping, check
from breeze_client.phases import Timeline
from breeze_client.types import ArtifactRef, FetchResult, SynthesisResult

# the phases (and spans) that cross between a group's worker events and the client's
_CROSSING = {"job": ("notify", "total", "waited"), "stat": ("waited",), "fetch": ("request", "first_byte_transit")}


def exchange_from(mapping: ClockMapping, label: str) -> Exchange:
    return Exchange(mapping.measured_at_ns, mapping.offset_ns, mapping.uncertainty_ns, label, mapping.wall_lead_ns,
                    mapping.client_synchronized)


def _raw(mapped: int | None, offset: int) -> int | None:
    """A worker time back on the worker's clock (the SDK mapped it with `offset`)."""
    return None if not mapped else int(mapped) + int(offset)


def _fallback_exchanges(fetch: FetchResult, synthesis: SynthesisResult | None) -> list[Exchange]:
    """The channels' own mappings, placed at the calls that used them, when no exchanges were made around."""
    ft = fetch.timing
    out = [Exchange(ft.request_sent_ns, ft.clock_offset_ns, ft.clock_uncertainty_ns, "of the artifact channel")]
    if synthesis is not None:
        st = synthesis.timing
        out.append(Exchange(st.request_sent_ns, st.clock_offset_ns, st.clock_uncertainty_ns,
                            "of the synthesis channel"))
    return out


def build_timeline(label: str, fetch: FetchResult, *, synthesis: SynthesisResult | None = None,
                   artifact: ArtifactRef | None = None, exchanges: Sequence[Exchange] = (),
                   stat_received_ns: int | None = None, parallel: int = 1, **extra) -> Timeline:
    """One retrieval's Timeline: a job's (`synthesis`) or an existing artifact's (`artifact` from Stat)."""
    ft = fetch.timing
    off_f = ft.clock_offset_ns
    w_rr, w_opened = _raw(ft.server_request_received_ns, off_f), _raw(ft.server_file_opened_ns, off_f)
    w_fbs, w_lbs = _raw(ft.server_first_byte_sent_ns, off_f), _raw(ft.server_last_byte_sent_ns, off_f)
    w_first_data = _raw(ft.server_first_data_sent_ns, off_f)
    groups: list[Group] = []
    worker: dict[str, tuple[str, int | None]] = {  # event -> (group, worker time)
        "request_received": ("fetch", w_rr), "first_byte_sent": ("fetch", w_fbs)}
    fetch_group = Group("fetch", ft.request_sent_ns)
    fetch_group.after(w_rr, ft.request_sent_ns, "the request reached the worker after it was sent")
    fetch_group.before(w_fbs, ft.first_byte_received_ns, "the first message arrived after it was sent")
    fetch_group.before(w_first_data, ft.first_data_received_ns, "the first data arrived after it was sent")
    fetch_group.before(w_lbs, ft.last_message_received_ns, "the last message arrived after it was sent")
    groups.append(fetch_group)

    client = {"request_sent": ft.request_sent_ns, "first_byte_received": ft.first_byte_received_ns,
              "last_byte_received": ft.last_byte_received_ns, "file_fsynced": ft.file_fsynced_ns}
    ev: dict[str, int] = {}
    ref, ref_group = artifact, "stat"
    if synthesis is not None:
        st = synthesis.timing
        off_s = st.clock_offset_ns
        w_started, w_first_chunk = _raw(st.server_started_ns, off_s), _raw(st.server_first_chunk_ns, off_s)
        w_done, w_committed = _raw(st.server_done_ns, off_s), _raw(st.server_committed_ns, off_s)
        job = Group("job", st.final_received_ns or ft.request_sent_ns)
        job.after(w_started, st.request_sent_ns, "the job started after it was requested")
        job.before(w_first_chunk, st.first_chunk_received_ns, "the first audio chunk arrived after it was sent")
        job.before(w_committed, st.final_received_ns, "the final message arrived after the commit")
        groups.append(job)
        worker.update(generation_done=("job", w_done), artifact_committed=("job", w_committed))
        client["final_received"] = st.final_received_ns
        ev["job_request_sent"] = st.request_sent_ns
        if st.cpu_wait_ns is not None:
            ev["synthesis_cpu_wait_ns"] = st.cpu_wait_ns
        if st.clock_rtt_ns:
            ev["synthesis_rtt_ns"] = st.clock_rtt_ns
        if w_done and w_first_chunk:
            ev["worker_audio_span_ns"] = w_done - w_first_chunk
        if st.final_received_ns and st.first_chunk_received_ns:
            ev["client_audio_span_ns"] = st.final_received_ns - st.first_chunk_received_ns
        w_final_sent = _raw(st.server_final_sent_ns, off_s)
        if w_final_sent and w_committed:
            ev["worker_notify_span_ns"] = w_final_sent - w_committed
        if st.server_notify_cpu_wait_ns is not None:
            ev["worker_notify_cpu_wait_ns"] = st.server_notify_cpu_wait_ns
        gap_wait = hostcpu.wait_between(st.cpu_at_final, ft.cpu_at_request)  # one thread received and requested
        if gap_wait is not None:
            ev["client_gap_cpu_wait_ns"] = gap_wait
        ref, ref_group = synthesis.artifact, "job"
    elif artifact is not None:
        w_committed = _raw(artifact.server_committed_ns, artifact.clock_offset_ns)
        stat = Group("stat", stat_received_ns or ft.request_sent_ns)
        stat.before(w_committed, stat_received_ns or ft.request_sent_ns, "Stat saw the artifact after its commit")
        groups.append(stat)
        worker["artifact_committed"] = ("stat", w_committed)
    w_commit_started = None
    if ref is not None and ref.commit is not None:
        c = ref.commit
        w_commit_started = _raw(c.server_started_ns, ref.clock_offset_ns)
        ev.update(commit_storage_ns=c.storage_ns, commit_fsync_ns=c.wav_fsync_ns + c.sidecar_fsync_ns + c.dir_fsync_ns,
                  commit_bytes=c.bytes_synced)
        ev.update({key: v for key, v in (("worker_commit_cpu_wait_ns", c.cpu_wait_ns),
                                         ("worker_commit_cpu_run_ns", c.cpu_run_ns),
                                         ("worker_commit_storage_cpu_wait_ns", c.storage_cpu_wait_ns),
                                         ("worker_commit_fsync_cpu_wait_ns", c.fsync_cpu_wait_ns)) if v is not None})

    mapping = check(exchanges or _fallback_exchanges(fetch, synthesis), groups)
    events = {k: int(v) for k, v in client.items() if v}
    event_unc: dict[str, int] = {}
    for name, (group, w) in worker.items():
        g = mapping.groups[group]
        if not w:
            continue
        # a broken group's events still give its same-clock phases; its crossing ones are unmeasured below
        events[name] = w - _offset(mapping, g, groups)
        event_unc[name] = g.uncertainty_ns
    if w_commit_started and ref_group in mapping.groups:
        g = mapping.groups[ref_group]
        ev["commit_started"] = w_commit_started - _offset(mapping, g, groups)
    if w_lbs and mapping.groups["fetch"].ok:
        ev["last_byte_sent"] = w_lbs - _offset(mapping, mapping.groups["fetch"], groups)
    unmeasured = {phase: f"clock mapping broken: {g.source}" for g in mapping.groups.values() if not g.ok
                  for phase in _CROSSING[g.name]}
    unmeasured.update({f"event:{name}": "placed with an unchecked mapping (clock mapping broken)"
                       for name, (group, w) in worker.items() if w and not mapping.groups[group].ok})

    ev.update(_fetch_evidence(fetch, w_rr, w_opened, w_first_data, w_lbs))
    ok_unc = [g.uncertainty_ns for g in mapping.groups.values() if g.ok]
    rtt = ft.clock_rtt_ns or None
    return Timeline(
        label=label, events=events, clock_uncertainty_ns=max(ok_unc, default=0), file_bytes=fetch.bytes_received,
        wire_bytes=fetch.wire_bytes, chunk_size=fetch.chunk_size, chunks=fetch.chunks, compression=fetch.compression,
        rtt_ns=rtt, resumes=fetch.resumes, write_during_transfer_ns=ft.write_during_transfer_ns,
        first_chunk_bytes=fetch.first_message_bytes, parallel=max(1, parallel),
        extra=dict(extra, verified=fetch.verified), event_uncertainty_ns=event_unc, unmeasured=unmeasured,
        evidence=ev, clock=mapping.to_dict())


def _offset(mapping: ClockCheck, g: GroupMapping, groups: Sequence[Group]) -> int:
    """The group's offset, or for a broken group (no offset) the nearest clock exchange's."""
    return g.offset_ns if g.offset_ns is not None else _nearest(mapping, g.name, groups)


def _nearest(mapping: ClockCheck, name: str, groups: Sequence[Group]) -> int:
    at = next(g.at_ns for g in groups if g.name == name)
    return min(mapping.exchanges, key=lambda e: abs(e.at_ns - at)).offset_ns


def _fetch_evidence(fetch: FetchResult, w_rr, w_opened, w_first_data, w_lbs) -> dict[str, int]:
    ft = fetch.timing
    ev: dict[str, int] = {}
    if w_rr and w_opened:
        ev["worker_open_ns"] = w_opened - w_rr
    if any(c.server_sent_ns for c in ft.chunk_times):  # a worker that stamps its chunks
        ev["worker_read_ns"] = ft.server_read_ns
        ev["worker_send_wait_ns"] = ft.server_send_wait_ns
        if w_first_data and w_lbs:
            ev["worker_send_span_ns"] = w_lbs - w_first_data
        transits = [c.received_ns - c.server_sent_ns for c in ft.chunk_times if c.server_sent_ns]
        if len(transits) >= 2:  # one mapping for all: the offset cancels out
            ev["path_queue_ns"] = max(transits) - min(transits)
    if ft.first_data_received_ns and ft.last_byte_received_ns:
        ev["data_receive_span_ns"] = ft.last_byte_received_ns - ft.first_data_received_ns
    if ft.cpu_wait_ns is not None:
        ev["client_cpu_wait_ns"] = ft.cpu_wait_ns
        if ft.cpu_run_ns is not None:  # hostcpu gives both or neither; an unknown one stays absent
            ev["client_cpu_run_ns"] = ft.cpu_run_ns
    if fetch.stream_window_bytes:
        ev["stream_window_bytes"] = fetch.stream_window_bytes
    if ft.channel_opened_ns:
        ev["artifact_channel_opened"] = ft.channel_opened_ns
    if ft.clock_measured_ns:
        ev["artifact_clock_measured"] = ft.clock_measured_ns
    if w_rr and w_lbs:
        ev["worker_handler_span_ns"] = w_lbs - w_rr
    ev.update({key: v for key, v in (("worker_open_cpu_wait_ns", ft.server_open_cpu_wait_ns),
                                     ("worker_arrival_cpu_wait_ns", ft.server_arrival_cpu_wait_ns),
                                     ("worker_read_cpu_wait_ns", ft.server_read_cpu_wait_ns),
                                     ("worker_handler_cpu_wait_ns", ft.server_handler_cpu_wait_ns),
                                     ("worker_handler_cpu_run_ns", ft.server_handler_cpu_run_ns)) if v is not None})
    return ev
