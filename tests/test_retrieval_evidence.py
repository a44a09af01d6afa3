"""The clock check and the evidence rules: pure functions over synthetic exchanges and timelines.

The real faults behind each rule are in test_retrieval_faults.py; here each rule is pinned down on its
edges: the same phase length gets a different cause when the evidence inside it differs.
"""

import dataclasses

import pytest
from test_retrieval_phases import MS, SIZE, make_timeline

from breeze_client.clockcheck import MAX_DRIFT_PPM, Exchange, Group, check
from breeze_client.phases import phase_times, summarize_phases, total_ns
from breeze_client.verdict import diagnose

S = 1_000_000_000
T0 = 1_700_000_000 * S


def exchange(at_s: float, offset_ms: float, unc_ms: float = 0.2, label: str = "") -> Exchange:
    return Exchange(T0 + int(at_s * S), int(offset_ms * MS), int(unc_ms * MS), label)


def fetch_group(at_s: float, true_offset_ms: float, latency_ms: float = 0.5) -> Group:
    """A fetch at `at_s` on a worker clock `true_offset_ms` ahead: request and first message each take
    `latency_ms` one way."""
    sent = T0 + int(at_s * S)
    off = int(true_offset_ms * MS)
    g = Group("fetch", sent)
    g.after(sent + int(latency_ms * MS) + off, sent, "request")  # received after it was sent
    g.before(sent + int(latency_ms * MS) + off, sent + int(2 * latency_ms * MS), "first message")
    return g


def test_agreeing_exchanges_and_causality_narrow_the_mapping():
    ex = [exchange(0.0, 5.0, 0.3), exchange(1.0, 5.1, 0.3)]
    result = check(ex, [fetch_group(0.5, 5.0)])
    g = result.groups["fetch"]
    assert result.status == "ok" and g.ok and not result.evidence
    assert abs(g.offset_ns - 5.0 * MS) <= g.uncertainty_ns <= 0.3 * MS  # within both exchanges' bound


def test_a_step_between_exchanges_is_re_mapped_from_the_exchange_that_agrees():
    ex = [exchange(0.0, 300_000.0, label="before"), exchange(1.0, 298_000.0, label="after")]
    job = Group("job", T0 + int(0.8 * S))  # before the step: the commit preceded the final message
    job.before(T0 + int(0.79 * S) + 300_000 * MS, T0 + int(0.8 * S), "commit before final message")
    job.after(T0 + int(0.01 * S) + 300_000 * MS, T0, "job started after its request")
    result = check(ex, [job, fetch_group(0.9, 298_000.0)])
    assert result.status == "stepped"
    assert result.groups["job"].offset_ns == pytest.approx(300_000 * MS, abs=0.3 * MS)
    assert result.groups["fetch"].offset_ns == pytest.approx(298_000 * MS, abs=0.3 * MS)
    assert "before" in result.groups["job"].source and "after" in result.groups["fetch"].source
    assert any("-2.00 s" in e and "a step" in e for e in result.evidence)


def test_plausible_drift_widens_the_uncertainty_and_a_runaway_clock_is_broken():
    ppm = MAX_DRIFT_PPM / 2  # 250 ppm over 60 s: 15 ms, far beyond the exchanges' 0.2 ms
    ex = [exchange(0.0, 0.0), exchange(60.0, 60 * ppm / 1e3)]
    result = check(ex, [Group("stat", T0 + 30 * S)])  # no causal bound: the exchanges alone
    assert result.status == "drift" and result.groups["stat"].uncertainty_ns >= 7 * MS
    # 5%: each exchange is ms away from the fetch's own causal window
    runaway = check([exchange(0.0, 0.0), exchange(1.0, 50.0)], [fetch_group(0.9, 45.0)])
    assert runaway.status == "broken" and not runaway.groups["fetch"].ok
    assert any("no clock exchange agrees" in e for e in runaway.evidence)


def test_drift_is_named_for_the_worker_only_when_this_client_s_clock_is_disciplined():
    """Two clocks drifting apart cannot say which one moves; a client whose kernel says its clock is disciplined
    is not it. A step is always the worker's: the client times on its monotonic clock, which nothing steps."""
    ppm = MAX_DRIFT_PPM / 2

    def drifting(synced: bool | None) -> list[Exchange]:
        return [dataclasses.replace(exchange(at, at * ppm / 1e3, label=label), client_synchronized=synced)
                for at, label in ((0.0, "before"), (60.0, "after"))]

    disciplined = check(drifting(True), [Group("stat", T0 + 30 * S)])
    (line,) = disciplined.evidence
    assert disciplined.drifted == "worker" and "the worker's clock drifted" in line and "disciplined" in line, line
    for synced in (False, None):
        either = check(drifting(synced), [Group("stat", T0 + 30 * S)])
        (line,) = either.evidence
        assert either.status == "drift" and either.drifted == "either", either
        assert "drifted +15.0 ms apart" in line and "either may be the one that drifts" in line, line
    stepped = check([dataclasses.replace(e, client_synchronized=False) for e in
                     (exchange(0.0, 0.0, label="before"), exchange(1.0, -2000.0, label="after"))], [])
    assert stepped.status == "stepped" and stepped.drifted == ""
    assert "the worker's clock moved -2.00 s" in stepped.evidence[0], stepped.evidence
    # the verdict's headline names the side the same way
    t = make_timeline("art-d")
    for check_result, words in ((disciplined, "the worker's clock moved (run 1 drift"),
                                (either, "the worker's clock and this client's drifted apart (run 1")):
        run = dataclasses.replace(t, clock=check_result.to_dict())
        assert any(words in e for e in diagnose([run]).verdict.evidence + diagnose([run]).verdict.details), words


def test_the_client_asks_its_kernel_whether_its_clock_is_disciplined():
    """adjtimex's read-only query, as chronyc or timedatectl would make it; a host without it says unknown."""
    import sys

    from breeze_client.clock import synchronized

    state = synchronized()
    assert (state is None) if not sys.platform.startswith("linux") else isinstance(state, bool)


def test_a_group_whose_own_worker_times_contradict_causality_is_broken():
    g = Group("job", T0)
    g.before(T0 + 10 * MS, T0, "commit before final message")  # offset >= 10 ms
    g.after(T0 + 2 * MS, T0, "started after request")  # offset <= 2 ms
    result = check([exchange(0.0, 5.0)], [g])
    assert result.status == "broken" and "contradict" in result.groups["job"].source


def test_a_phase_that_cannot_be_a_measurement_is_never_one():
    t = make_timeline()
    negative = dataclasses.replace(t, events={**t.events, "request_received": t.events["request_sent"] - 2 * S})
    times = {pt.phase.name: pt for pt in phase_times(negative)}
    assert times["request"].duration_ns is None and "came out -2.00 s" in times["request"].why
    longer = dataclasses.replace(t, evidence={"job_request_sent": t.events["final_received"] - 50 * MS},
                                 events={**t.events, "generation_done": t.events["generation_done"] - 5 * S})
    times = {pt.phase.name: pt for pt in phase_times(longer)}
    assert times["commit"].duration_ns is None and "longer than the whole run" in times["commit"].why
    assert total_ns(longer) is None
    why = "clock mapping broken: x"
    broken = dataclasses.replace(t, unmeasured={"notify": why, "total": why})
    assert summarize_phases([broken])["notify"].count == 0 and total_ns(broken) is None


def with_evidence(t, **ev):
    return dataclasses.replace(t, evidence={**t.evidence, **ev})


def test_a_long_commit_is_storage_only_when_the_fsyncs_took_it():
    slow = make_timeline(slow="commit", extra_ms=20_000)  # 20 s
    on_disk = diagnose([with_evidence(slow, commit_storage_ns=19_900 * MS, commit_fsync_ns=19_800 * MS,
                                      commit_bytes=1_300_000)])
    assert on_disk.verdict.cause == "storage_write"
    assert any("65.7 kB/s" in e for e in on_disk.verdict.evidence), on_disk.verdict.evidence
    stalled = diagnose([with_evidence(slow, commit_storage_ns=40 * MS, commit_fsync_ns=30 * MS,
                                      commit_bytes=1_300_000)])
    assert stalled.verdict.cause == "worker_busy"
    assert not any("while it streamed" in e for e in on_disk.verdict.evidence)  # it synced the whole file


def test_a_commit_that_synced_part_of_the_file_says_the_rest_was_written_while_streaming():
    """The worker writes a WAV back while it streams; its commit counts what was left: the rate is over that."""
    slow = make_timeline(slow="commit", extra_ms=20_000)
    part = slow.file_bytes // 4
    run = diagnose([with_evidence(slow, commit_storage_ns=19_900 * MS, commit_fsync_ns=19_800 * MS,
                                  commit_bytes=part)])
    assert run.verdict.cause == "storage_write"
    (line,) = [e for e in run.verdict.evidence if "made durable" in e]
    assert f"of the {slow.file_bytes / 1e6:.2f} MB file" in line and "while it streamed" in line, line
    assert f"{part / 19.8 / 1e3:.1f} kB/s" in line, line  # the rate over the bytes synced, not the file


def test_a_slow_transfer_is_a_slow_disk_read_a_window_or_the_link_by_its_evidence():
    base = make_timeline(transfer_ms=2000, rtt_ms=40, chunks=SIZE // 16384)
    read = diagnose([with_evidence(base, worker_read_ns=1900 * MS, worker_send_wait_ns=50 * MS, path_queue_ns=5 * MS)])
    assert read.verdict.cause == "storage_read"
    flow = {"worker_read_ns": 5 * MS, "worker_send_wait_ns": 1950 * MS}  # the worker waited on the connection
    window = diagnose([with_evidence(base, **flow, path_queue_ns=45 * MS)])  # ... while nothing queued
    assert window.verdict.cause == "window_limited"
    link = diagnose([with_evidence(base, **flow, path_queue_ns=1500 * MS)])  # ... while bytes queued on the path
    assert link.verdict.cause == "bandwidth"
    starved = diagnose([with_evidence(base, client_cpu_wait_ns=1100 * MS, client_cpu_run_ns=30 * MS)])
    assert starved.verdict.cause == "client_cpu" and "CPU" in starved.verdict.fix
    # a wait that is a large share of the fetch but less than half the transfer does not account for it
    partly = diagnose([with_evidence(base, **flow, path_queue_ns=1500 * MS, client_cpu_wait_ns=600 * MS)])
    assert partly.verdict.cause == "bandwidth", partly.verdict.evidence


def test_a_held_first_byte_is_a_buffer_and_a_slow_one_on_a_slow_path_is_latency():
    held = make_timeline(slow="first_byte_transit", extra_ms=900, transfer_ms=3, rtt_ms=2)
    # the worker sent the response over 890 ms; its first byte arrived after the last was sent, all data within 3 ms
    sent_over = with_evidence(held, data_receive_span_ns=3 * MS,
                              last_byte_sent=held.events["first_byte_sent"] + 890 * MS)
    buffered = diagnose([sent_over])
    assert buffered.verdict.cause == "buffering_intermediary"
    assert any("after the last one was sent" in e for e in buffered.verdict.evidence + buffered.verdict.details)
    assert any("delivered" in e for e in buffered.verdict.evidence + buffered.verdict.details)
    # a response sent at once: nothing shows the rest was held, but 900 ms is far past any one-way delay
    at_once = diagnose([with_evidence(held, data_receive_span_ns=3 * MS)]).verdict
    assert at_once.cause == "buffering_intermediary" and any("held the first message" in e for e in at_once.evidence)
    far = dataclasses.replace(held, rtt_ns=1900 * MS)  # a path whose round trip is that long
    assert diagnose([with_evidence(far, data_receive_span_ns=3 * MS)]).verdict.cause == "network_latency"


def test_a_first_byte_a_little_late_on_a_slow_path_is_latency_not_a_buffer():
    """A loaded machine adds tens of ms to one message's transit; on a 150 ms path a one-chunk response that
    came 60 ms past the round trip was once called a buffer (its data all arrived at once, as one chunk does)."""
    late = make_timeline(slow="first_byte_transit", extra_ms=210, transfer_ms=0.2, rtt_ms=150, chunks=1)
    one_chunk = with_evidence(late, data_receive_span_ns=0, last_byte_sent=late.events["first_byte_sent"] + MS // 5)
    assert diagnose([one_chunk]).verdict.cause == "network_latency"
    waited = with_evidence(one_chunk, client_cpu_wait_ns=40 * MS)  # part of the lateness was the client's CPU wait
    assert diagnose([waited]).verdict.cause == "network_latency"


def test_a_first_byte_far_past_the_round_trip_that_cpu_waits_explain_names_the_side_that_waited():
    """A worker held by a CPU quota sends its messages late from gRPC's own threads, after its handler handed them
    over: its counters see part of that. A first byte 237 ms past a 90 ms round trip, which the waits keep from
    being a buffer's, is the side that waited."""
    late = make_timeline(slow="first_byte_transit", extra_ms=330, transfer_ms=0.2, rtt_ms=90, chunks=1)
    one_chunk = with_evidence(late, data_receive_span_ns=0, last_byte_sent=late.events["first_byte_sent"] + MS // 5)
    d = diagnose([with_evidence(one_chunk, worker_handler_cpu_wait_ns=80 * MS, worker_handler_span_ns=400 * MS,
                                client_cpu_wait_ns=5 * MS)]).verdict
    assert d.cause == "worker_cpu" and any("the worker waited 80.0 ms" in e for e in d.evidence), d.evidence
    d = diagnose([with_evidence(one_chunk, client_cpu_wait_ns=90 * MS)]).verdict
    assert d.cause == "client_cpu" and any("the client waited 90.0 ms" in e for e in d.evidence), d.evidence
    # nobody waited: something on the path held it
    assert diagnose([one_chunk]).verdict.cause == "buffering_intermediary"


@pytest.mark.parametrize("slow,ev", [
    ("commit", {"commit_storage_ns": 400 * MS, "commit_fsync_ns": 390 * MS, "commit_bytes": SIZE}),
    ("first_byte_transit", {}),
    ("client_gap", {}),
])
def test_the_cause_does_not_depend_on_the_number_of_runs(slow, ev):
    runs = [with_evidence(make_timeline(f"r{i}", slow=slow, extra_ms=400 + 5 * i, rtt_ms=900), **ev) for i in range(3)]
    one, three = diagnose(runs[:1]).verdict, diagnose(runs).verdict
    assert one.cause == three.cause and one.fix == three.fix
    assert dict(three.runs_by_cause) == {three.cause: 3}


def test_a_cause_only_several_runs_can_tell_apart_says_so():
    gap = diagnose([make_timeline(slow="client_gap", extra_ms=500)]).verdict
    assert gap.cause == "client_delay" and "-n 3" in gap.needs_runs


def gap_runs(gaps_ms, requests_s=None):
    """Runs whose client gaps are `gaps_ms`, their artifact requests at `requests_s` (default: at 0, 7.3, 19.1 ...
    s, on no common grid)."""
    runs = []
    default = [0.0, 7.3, 19.1, 23.9, 31.7]
    for i, gap in enumerate(gaps_ms):
        t = make_timeline(f"r{i}", slow="client_gap", extra_ms=gap)
        at = int((requests_s or default)[i] * S)
        shift = T0 + at - t.events["request_sent"]
        runs.append(dataclasses.replace(t, events={k: v + shift for k, v in t.events.items()},
                                        evidence={"job_request_sent": t.evidence.get("job_request_sent", 0) + shift}))
    return runs


def test_client_gaps_that_vary_are_polling_and_a_constant_one_an_application_delay():
    varied = diagnose(gap_runs([240, 1800, 900])).verdict
    assert varied.cause == "polling" and varied.needs_runs is None
    assert any("varied from 240.2 ms to 1.80 s" in e for e in varied.evidence), varied.evidence
    assert not any("grid" in e for e in varied.evidence + varied.details)  # requests on no common schedule
    # the same gaps from a loop polling every 2 s: the requests fall on its grid, the final messages do not (three
    # requests 6 s apart cannot tell a 2 s loop from a 3 s or 6 s one: the line says so)
    polled = diagnose(gap_runs([240, 1800, 900], requests_s=[4.0, 10.0, 16.0])).verdict
    assert polled.cause == "polling"
    assert any("whole multiples of 6.00 s apart" in e and "fixed schedule" in e
               for e in polled.evidence + polled.details), polled.evidence
    steady = diagnose(gap_runs([400, 404, 398])).verdict
    assert steady.cause == "client_delay" and steady.needs_runs is None
    assert any("constant offset" in e for e in steady.evidence + steady.details)
    one = diagnose(gap_runs([900])).verdict
    assert one.cause == "client_delay" and "polling" in one.needs_runs


def test_a_client_gap_with_its_connection_set_up_inside_is_a_cold_start_in_one_run():
    (t,) = gap_runs([350])
    final = t.events["final_received"]
    fresh = with_evidence(t, artifact_channel_opened=final + MS, artifact_clock_measured=final + 340 * MS)
    for runs in ([fresh], [fresh] * 3):
        v = diagnose(runs).verdict
        assert v.cause == "cold_start" and v.needs_runs is None
        assert any("opened its artifact channel 1.0 ms after the final message" in e for e in v.evidence)
    warm = with_evidence(t, artifact_channel_opened=final - 5 * S, artifact_clock_measured=final - S)
    assert diagnose([warm]).verdict.cause == "client_delay"
    starved = with_evidence(t, client_gap_cpu_wait_ns=300 * MS)  # the thread that received and requested
    assert diagnose([starved]).verdict.cause == "client_cpu"


def test_a_worker_waiting_for_a_cpu_is_named_and_not_taken_for_its_disk_or_the_path():
    # the commit: 1.95 s "inside fsync", of which the worker's thread waited 1.90 s for a CPU
    commit = make_timeline(slow="commit", extra_ms=1950)
    disk = dict(commit_storage_ns=1952 * MS, commit_fsync_ns=1950 * MS, commit_bytes=46_000)
    held = diagnose([with_evidence(commit, **disk, worker_commit_cpu_wait_ns=1930 * MS,
                                   worker_commit_storage_cpu_wait_ns=1900 * MS,
                                   worker_commit_fsync_cpu_wait_ns=1900 * MS)]).verdict
    assert held.cause == "worker_cpu" and "--artifact-dir" not in held.fix, held.evidence
    assert held.evidence[-1].endswith("the worker is starved of CPU")  # the comparison that named it, in the headline
    on_disk = diagnose([with_evidence(commit, **disk, worker_commit_cpu_wait_ns=2 * MS,
                                      worker_commit_storage_cpu_wait_ns=MS, worker_commit_fsync_cpu_wait_ns=MS)])
    assert on_disk.verdict.cause == "storage_write"  # the same commit, spent in the volume: its rate is the volume's
    assert any("23.6 kB/s" in e for e in on_disk.verdict.evidence), on_disk.verdict.evidence
    # the request: 948 ms to reach the handler, over a path with a 2 ms round trip
    request = make_timeline(slow="request", extra_ms=948, rtt_ms=2)
    assert diagnose([request]).verdict.cause == "network_latency"  # no evidence from the worker: the path
    waited = with_evidence(request, worker_arrival_cpu_wait_ns=930 * MS, worker_handler_cpu_wait_ns=0,
                           worker_handler_span_ns=MS)
    v = diagnose([waited]).verdict
    assert v.cause == "worker_cpu" and any("before the request reached its handler" in e for e in v.evidence)
    # the final message, held after the worker handed it to gRPC (its threads sent it late)
    notify = with_evidence(make_timeline(slow="notify", extra_ms=600), worker_notify_span_ns=MS,
                           worker_notify_cpu_wait_ns=0, worker_arrival_cpu_wait_ns=590 * MS)
    assert diagnose([notify]).verdict.cause == "worker_cpu"


def test_stalls_in_a_different_phase_each_run_are_named_by_what_they_share():
    """Three runs, each held in another phase: no phase's p50 holds the time; each run's longest phase speaks."""
    commit = with_evidence(make_timeline("a", slow="commit", extra_ms=400), commit_storage_ns=MS, commit_fsync_ns=MS,
                           commit_bytes=SIZE, worker_commit_cpu_wait_ns=395 * MS, worker_commit_storage_cpu_wait_ns=0)
    request = with_evidence(make_timeline("b", slow="request", extra_ms=400), worker_arrival_cpu_wait_ns=395 * MS,
                            worker_handler_cpu_wait_ns=0, worker_handler_span_ns=MS)
    first_byte = with_evidence(make_timeline("c", slow="server_first_byte", extra_ms=400), worker_open_ns=MS,
                               worker_open_cpu_wait_ns=398 * MS)
    d = diagnose([commit, request, first_byte])
    v = d.verdict
    assert d.summaries[v.phase].p50_s < 0.1  # no phase holds the time at p50 ...
    assert v.cause == "worker_cpu" and dict(v.runs_by_cause) == {"worker_cpu": 3}, v.evidence  # ... yet all agree
    assert any("each run's longest phase differs" in e for e in v.evidence + v.details)
