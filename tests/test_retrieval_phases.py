"""The retrieval phase model and the verdict: pure functions over synthetic timelines."""

import dataclasses
import hashlib
import time

import pytest

from breeze_client._receive import FetchReceiver
from breeze_client.clock import ClockMapping
from breeze_client.diagnose import with_concurrency
from breeze_client.phases import (
    EVENTS,
    PHASE_NAMES,
    PHASES,
    SERVER_EVENTS,
    format_phase_value,
    map_timeline,
    percentile,
    phase_times,
    summarize_phases,
    total_ns,
    transfer_rate,
)
from breeze_client.verdict import HEALTHY_BUDGET_S, diagnose
from breeze_tts_proto.v1 import artifacts_pb2, common_pb2

MS = 1_000_000
BASE = 1_700_000_000_000_000_000
OFFSET = 987_654_321  # worker clock - client clock
SIZE = 1_244_292


def make_timeline(label="run", *, slow: str | None = None, extra_ms: float = 0.0, uncertainty_ms: float = 0.2,
                  transfer_ms: float = 8.0, size: int = SIZE, chunks: int = 5, wire: int | None = None,
                  rtt_ms: float = 0.4, parallel: int = 1, first_chunk_bytes: int = 0):
    """A plausible loopback retrieval; `slow` adds `extra_ms` to one phase."""
    durations = {"commit": 2.0, "notify": 0.5, "client_gap": 0.2, "request": 0.4, "server_first_byte": 0.5,
                 "first_byte_transit": 0.4, "transfer": transfer_ms, "client_write": 1.5}
    if slow:
        durations[slow] += extra_ms
    t = BASE
    events = {EVENTS[0]: t}
    for phase in PHASES:
        t += int(durations[phase.name] * MS)
        events[phase.end] = t
    client = {k: v for k, v in events.items() if k not in SERVER_EVENTS}
    server = {k: v + OFFSET for k, v in events.items() if k in SERVER_EVENTS}  # on the worker's clock
    return map_timeline(label, client, server, offset_ns=OFFSET, uncertainty_ns=int(uncertainty_ms * MS),
                        file_bytes=size, wire_bytes=size if wire is None else wire, chunk_size=262144,
                        chunks=chunks, rtt_ns=int(rtt_ms * MS), parallel=parallel,
                        first_chunk_bytes=first_chunk_bytes)


def test_phases_chain_the_events_in_order():
    assert len(PHASES) == 8 and PHASES[0].start == EVENTS[0] and PHASES[-1].end == EVENTS[-1]
    for a, b in zip(PHASES, PHASES[1:]):
        assert a.end == b.start
    assert [p.name for p in PHASES if p.crosses_clocks] == ["notify", "request", "first_byte_transit"]


def test_server_events_are_mapped_and_crossing_phases_carry_the_uncertainty():
    t = make_timeline(uncertainty_ms=0.3)
    times = {pt.phase.name: pt for pt in phase_times(t)}
    assert times["commit"].duration_ns == 2 * MS and times["commit"].uncertainty_ns == 0
    assert times["request"].duration_ns == int(0.4 * MS) and times["request"].uncertainty_ns == int(0.3 * MS)
    assert not times["request"].below_uncertainty
    assert times["client_gap"].uncertainty_ns == 0 and not times["client_gap"].below_uncertainty
    assert total_ns(t) == int((2 + .5 + .2 + .4 + .5 + .4 + 8 + 1.5) * MS)
    assert transfer_rate(t) == pytest.approx(SIZE / 0.008)


def test_a_phase_shorter_than_the_mapping_uncertainty_is_labelled():
    t = make_timeline(uncertainty_ms=0.45)
    times = {pt.phase.name: pt for pt in phase_times(t)}
    assert times["request"].below_uncertainty and times["first_byte_transit"].below_uncertainty
    assert not times["notify"].below_uncertainty  # 0.5 ms > 0.45 ms
    assert format_phase_value(0.0004, 0.00045) == "<±450 us"
    assert format_phase_value(0.0005, 0.00045) == "500 us"
    s = summarize_phases([t])
    assert s["request"].below_uncertainty and not s["transfer"].below_uncertainty


def test_wrong_side_events_are_rejected():
    with pytest.raises(ValueError, match="wrong side"):
        map_timeline("x", {"generation_done": 1}, {}, offset_ns=0, uncertainty_ns=0)
    with pytest.raises(ValueError, match="unknown"):
        map_timeline("x", {"downloaded": 1}, {}, offset_ns=0, uncertainty_ns=0)


def test_percentiles():
    assert percentile([5.0], 95) == 5.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([0.0, 10.0], 95) == pytest.approx(9.5)


@pytest.mark.parametrize("phase", PHASE_NAMES)
def test_the_verdict_names_the_phase_that_holds_the_delay(phase):
    runs = [make_timeline(f"r{i}", slow=phase, extra_ms=300.0 + 10 * i) for i in range(3)]
    d = diagnose(runs)
    assert d.verdict.phase == phase
    assert d.summaries[phase].p50_s == pytest.approx(d.summaries[phase].p50_s)
    baseline = {"commit": 2.0, "notify": 0.5, "client_gap": 0.2, "request": 0.4, "server_first_byte": 0.5,
                "first_byte_transit": 0.4, "transfer": 8.0, "client_write": 1.5}[phase]
    assert d.summaries[phase].p50_s == pytest.approx((baseline + 310.0) / 1e3, rel=1e-6)
    assert d.verdict.share > 0.9 and d.verdict.fix and d.verdict.evidence


def test_causes_follow_the_evidence():
    slow_write = diagnose([make_timeline(slow="client_write", extra_ms=200)])
    assert slow_write.verdict.cause == "slow_client_disk"
    storage = diagnose([make_timeline(slow="server_first_byte", extra_ms=200)])  # no open time: presumed storage
    assert storage.verdict.cause == "storage_read"
    # 64 KiB per 50 ms round trip, with 64 KiB chunks: window-limited
    window = diagnose([make_timeline(transfer_ms=SIZE / (65536 / 0.05) * 1e3, rtt_ms=50, chunks=SIZE // 65536)])
    assert window.verdict.phase == "transfer" and window.verdict.cause == "window_limited"
    assert window.verdict.needs_runs and "--parallel" in window.verdict.needs_runs  # BDP probing was on
    # the same rate with ~250 KiB chunks: gRPC lets a whole awaited message in, so the window was not the limit
    whole = diagnose([make_timeline(transfer_ms=SIZE / (65536 / 0.05) * 1e3, rtt_ms=50)])
    assert whole.verdict.cause == "bandwidth"
    # 20 Mbit/s over 50 ms: far more than one window in flight -> bandwidth
    bandwidth = diagnose([make_timeline(transfer_ms=SIZE * 8 / 20e6 * 1e3, rtt_ms=50)])
    assert bandwidth.verdict.cause == "bandwidth"
    assert any("Mbit/s" in e for e in bandwidth.verdict.evidence)
    # three parallel fetches at 1/3 of 20 Mbit/s each: the shared path, not a window, is the limit
    shared = diagnose([make_timeline(transfer_ms=SIZE * 8 / (20e6 / 3) * 1e3, rtt_ms=50, parallel=3)])
    assert shared.verdict.cause == "bandwidth"
    assert any("3 fetches shared the path at once" in e for e in shared.verdict.evidence + shared.verdict.details)
    tiny_chunks = diagnose([make_timeline(transfer_ms=400, chunks=SIZE // 4096)])
    assert tiny_chunks.verdict.cause == "per_message_overhead"
    base64 = diagnose([make_timeline(transfer_ms=400, wire=SIZE * 4 // 3)])
    assert base64.verdict.cause == "payload_encoding"
    notify_late = diagnose([make_timeline(slow="notify", extra_ms=20_000)])
    assert notify_late.verdict.cause == "polling"


def test_nothing_slow_is_reported_as_such():
    runs = [make_timeline(slow="request", extra_ms=3.0, transfer_ms=0.1, uncertainty_ms=5.0)]
    d = diagnose(runs)
    assert d.verdict.phase == "request" and d.verdict.cause == "none"
    assert any("uncertainty" in e for e in d.verdict.evidence)


def test_diagnosis_serializes():
    d = diagnose([make_timeline()])
    out = d.to_dict()
    assert set(out["phases"]) == set(PHASE_NAMES) | {"total", "waited"}
    assert out["verdict"]["phase"] == "transfer"


def test_a_healthy_retrieval_is_not_reported_as_a_fault():
    healthy = diagnose([make_timeline(f"r{i}") for i in range(3)])  # 13.5 ms from generation done to disk
    assert healthy.verdict.phase == "transfer" and healthy.verdict.cause == "none"
    assert "healthy" in healthy.verdict.explanation
    assert any("within the 150.0 ms budget" in e for e in healthy.verdict.evidence)
    # a notify of 5 ms once read as "polling"; inside the budget it is not a fault
    assert diagnose([make_timeline(slow="notify", extra_ms=5.0)]).verdict.cause == "none"
    # just over the budget, the rule's cause stands
    over = (HEALTHY_BUDGET_S * 1e3 - 13.5 + 8.0) + 1.0
    slow = diagnose([make_timeline(transfer_ms=over, rtt_ms=50)])
    assert slow.summaries["total"].p50_s > HEALTHY_BUDGET_S and slow.verdict.cause == "bandwidth"


def test_the_total_carries_the_clock_uncertainty():
    runs = [make_timeline("a", uncertainty_ms=0.3), make_timeline("b", uncertainty_ms=0.7)]
    total = summarize_phases(runs)["total"]
    assert total.uncertainty_s == pytest.approx(0.0007) and not total.below_uncertainty
    assert summarize_phases([make_timeline(transfer_ms=0.0, uncertainty_ms=20.0)])["total"].below_uncertainty
    from breeze_client.phases import phases_dict

    assert phases_dict(runs[1])["total"]["uncertainty_s"] == pytest.approx(0.0007)


def test_a_slow_first_message_with_file_bytes_is_a_rate_not_per_file_overhead():
    # the audit's case: 4 Mbit/s, a whole 175 KB file in the first message, one-way delay 10.8 ms
    size, one_way_ms = 175_000, 10.8
    transit_ms = one_way_ms + size * 8 / 4e6 * 1e3
    runs = [make_timeline(f"r{i}", slow="first_byte_transit", extra_ms=transit_ms, size=size, chunks=1,
                          transfer_ms=0.0, rtt_ms=2 * one_way_ms, first_chunk_bytes=size) for i in range(3)]
    v = diagnose(runs).verdict
    assert v.phase == "first_byte_transit" and v.cause == "bandwidth", v.evidence
    assert any("4.0 Mbit/s" in e for e in v.evidence + v.details), v.evidence
    # the same transit without file bytes in the first message moved no bytes: no rate explains it, and at 17 round
    # trips no path delay does either: something held it
    held = [dataclasses.replace(t, first_chunk_bytes=0) for t in runs]
    assert diagnose(held).verdict.cause == "buffering_intermediary"
    # on a path whose round trip is as long, it is the latency paid per file
    latency = [dataclasses.replace(t, first_chunk_bytes=0, rtt_ns=int(transit_ms * 1.1 * MS)) for t in runs]
    assert diagnose(latency).verdict.cause == "network_latency"


def test_existing_artifacts_say_generation_done_is_unknown():
    runs = [make_timeline(f"r{i}", slow="transfer", extra_ms=300) for i in range(2)]
    runs = [dataclasses.replace(t, events={k: v for k, v in t.events.items()
                                           if k not in ("generation_done", "final_received")}) for t in runs]
    d = diagnose(runs)
    assert d.summaries["total"].p50_s is None and d.verdict.phase == "transfer"
    assert "generation done is unknown for existing artifacts" in d.verdict.evidence[0]
    assert " p50 -" not in d.verdict.evidence[0]


def test_concurrency_counts_the_fetches_that_overlapped():
    a, b, c = (make_timeline(x) for x in "abc")
    def shift(t, ms):
        return dataclasses.replace(t, events={k: v + int(ms * MS) for k, v in t.events.items()})

    out = with_concurrency([a, shift(b, 1.0), shift(c, 100.0)])  # a and b overlap, c comes later
    assert [t.parallel for t in out] == [2, 2, 1]


FILE = bytes(range(256)) * 400  # 102 400 bytes


def _header_first_stream(chunk: int):
    """A Fetch stream as the worker sends it: a header (info, times, no data), data chunks, the last message."""
    info = common_pb2.ArtifactInfo(artifact_id="art-" + "2" * 32, size_bytes=len(FILE),
                                   sha256=hashlib.sha256(FILE).hexdigest())
    header = artifacts_pb2.FetchArtifactResponse(offset=0, info=info, request_received_unix_ns=2_000_000,
                                                 file_opened_unix_ns=2_100_000, first_byte_sent_unix_ns=2_200_000)
    data = [artifacts_pb2.FetchArtifactResponse(data=FILE[p:p + chunk], offset=p,
                                                uncompressed_size=len(FILE[p:p + chunk]))
            for p in range(0, len(FILE), chunk)]
    return [header, *data, artifacts_pb2.FetchArtifactResponse(offset=len(FILE), last=True,
                                                               last_byte_sent_unix_ns=2_900_000)]


class _SlowSink:
    def __init__(self, delay_s: float):
        self.delay_s, self.parts = delay_s, []

    def write(self, data):
        time.sleep(self.delay_s)
        self.parts.append(bytes(data))
        return len(data)

    def flush(self):
        pass


def test_the_sdk_rate_is_the_phase_model_rate():
    clock = ClockMapping(offset_ns=1_000_000, uncertainty_ns=10, rtt_ns=20, samples=3)
    sink = _SlowSink(0.01)
    r = FetchReceiver("art-" + "2" * 32, sink, 0, 0, 25_600, "none", clock, "host:1")
    r.next_request()
    # header, 4 chunks 50 ms apart, last: in the past, after the request (the phases must fit in the fetch)
    base = time.time_ns() - 2_000_000_000
    r._t["request_sent"] = base - 10 * MS
    arrivals = [base + i * 50 * MS for i in range(6)]
    for m, at in zip(_header_first_stream(25_600), arrivals):
        r.on_message(m, at)
    result = r.finish()
    assert b"".join(sink.parts) == FILE and result.verified and result.chunks == 4
    t = result.timing
    assert t.first_byte_received_ns == arrivals[0]  # the header is the response's first byte
    assert result.first_message_bytes == 0
    # every byte is in when the stream's last message arrives: the 4 writes of >= 10 ms all fall before it
    assert t.last_byte_received_ns == arrivals[5] and t.last_message_received_ns == arrivals[5]
    assert 4 * 10 * MS <= t.write_during_transfer_ns == t.write_ns
    timeline = result.timeline()
    assert timeline.first_chunk_bytes == 0 and timeline.events["first_byte_received"] == arrivals[0]
    rate = transfer_rate(timeline)
    expected = len(FILE) / ((arrivals[5] - arrivals[0] - t.write_during_transfer_ns) / 1e9)
    assert rate == pytest.approx(expected) and result.mb_per_s == pytest.approx(rate / 1e6)
    assert result.to_dict()["mb_per_s"] == pytest.approx(rate / 1e6)
