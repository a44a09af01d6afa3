"""The client benchmark's labels and statistics (breeze_client/bench.py)."""

from __future__ import annotations

import pytest

from breeze_client.bench import LABELS, percentile, spread


def test_labels_have_the_promised_sizes_and_frame_limits():
    words = {name: label.words for name, label in LABELS.items()}
    assert words == {"short": 13, "medium": 53, "long": 115, "chunk-13.76s": 34, "chunk-7.36s": 18,
                     "chunk-4.80s": 12}
    limits = {name: label.frame_limit for name, label in LABELS.items()}
    assert limits == {"short": 65, "medium": 265, "long": 575, "chunk-13.76s": 172, "chunk-7.36s": 92,
                      "chunk-4.80s": 60}  # 5 frames per word; a chunk: its seconds x 12.5
    assert all(label.sized_by for label in LABELS.values())


def test_percentile_interpolates_and_spread_uses_the_sample_stddev():
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile(list(map(float, range(101))), 90) == pytest.approx(90.0)
    assert percentile([10.0, 0.0], 100) == 10.0
    s = spread([1.0, 3.0])
    assert s == {"mean": 2.0, "stddev": pytest.approx(1.4142135), "min": 1.0, "max": 3.0}
    assert spread([5.0])["stddev"] == 0.0
