"""The retrieval phase model and the verdict: pure functions over synthetic timelines."""

import pytest

from breeze_client.phases import (
    EVENTS, PHASES, PHASE_NAMES, SERVER_EVENTS, format_phase_value, map_timeline, percentile, phase_times,
    summarize_phases, total_ns, transfer_rate,
)
from breeze_client.verdict import diagnose

MS = 1_000_000
BASE = 1_700_000_000_000_000_000
OFFSET = 987_654_321  # worker clock - client clock
SIZE = 1_244_292


def make_timeline(label="run", *, slow: str | None = None, extra_ms: float = 0.0, uncertainty_ms: float = 0.2,
                  transfer_ms: float = 8.0, size: int = SIZE, chunks: int = 5, wire: int | None = None,
                  rtt_ms: float = 0.4, parallel: int = 1):
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
                        chunks=chunks, rtt_ns=int(rtt_ms * MS), parallel=parallel)


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
    storage = diagnose([make_timeline(slow="server_first_byte", extra_ms=200)])
    assert storage.verdict.cause == "storage_lag"
    # 64 KiB per 50 ms round trip: window-limited
    window = diagnose([make_timeline(transfer_ms=SIZE / (65536 / 0.05) * 1e3, rtt_ms=50)])
    assert window.verdict.phase == "transfer" and window.verdict.cause == "window_limited"
    # 20 Mbit/s over 50 ms: far more than one window in flight -> bandwidth
    bandwidth = diagnose([make_timeline(transfer_ms=SIZE * 8 / 20e6 * 1e3, rtt_ms=50)])
    assert bandwidth.verdict.cause == "bandwidth"
    assert any("Mbit/s" in e for e in bandwidth.verdict.evidence)
    # three parallel fetches at 1/3 of 20 Mbit/s each: the shared path, not a window, is the limit
    shared = diagnose([make_timeline(transfer_ms=SIZE * 8 / (20e6 / 3) * 1e3, rtt_ms=50, parallel=3)])
    assert shared.verdict.cause == "bandwidth"
    assert any("3 fetches shared the path at once" in e for e in shared.verdict.evidence)
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
    assert "uncertainty" in d.verdict.evidence[-1]


def test_diagnosis_serializes():
    d = diagnose([make_timeline()])
    out = d.to_dict()
    assert set(out["phases"]) == set(PHASE_NAMES) | {"total"}
    assert out["verdict"]["phase"] == "transfer"
