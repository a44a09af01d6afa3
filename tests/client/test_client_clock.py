"""Clock exchange arithmetic: offset, round trip, minimum-RTT selection, uncertainty = rtt / 2."""

from __future__ import annotations

import pytest

from breeze_client.clock import ClockMapping, ClockSample, best_mapping


def _sample(t0, offset, out_ns, server_ns, back_ns):
    """A sample where the worker clock is ahead by `offset` and the legs take out/back ns."""
    t1 = t0 + out_ns + offset
    t2 = t1 + server_ns
    t3 = t2 - offset + back_ns
    return ClockSample(t0, t1, t2, t3)


def test_symmetric_legs_recover_the_offset_exactly():
    s = _sample(1_000_000, offset=5_000_000_000, out_ns=300, server_ns=50, back_ns=300)
    assert s.offset_ns == 5_000_000_000 and s.rtt_ns == 600


def test_asymmetric_legs_err_by_at_most_half_the_round_trip():
    s = _sample(0, offset=-123_456, out_ns=1_000, server_ns=10, back_ns=9_000)
    assert abs(s.offset_ns - -123_456) <= s.rtt_ns / 2


def test_best_mapping_keeps_the_fastest_sample():
    samples = [_sample(0, 777, 5_000, 10, 1_000), _sample(10, 777, 100, 10, 100), _sample(20, 777, 50_000, 0, 10)]
    m = best_mapping(samples)
    assert m.rtt_ns == 200 and m.offset_ns == 777 and m.uncertainty_ns == 100 and m.samples == 3


def test_to_client_maps_and_keeps_unset_timestamps_unknown():
    m = ClockMapping(offset_ns=1_000, uncertainty_ns=5)
    assert m.to_client(5_000) == 4_000 and m.to_client(0) is None
    with pytest.raises(ValueError):
        best_mapping([])
