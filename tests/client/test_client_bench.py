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


def _done(client: int, sent: int, wall_s: float, frames: int) -> dict:
    return {"client": client, "sent_ns": sent, "final_ns": sent + int(wall_s * 1e9), "wall_s": wall_s,
            "audio_s": frames / 12.5, "frames": frames, "end_reason": "frame_limit", "ttfa_ms": 50.0,
            "worker_ttfa_ms": 40.0, "worker_rtf": 0.5, "gaps_ms": [10.0] * (frames - 1),
            "stages_s": {"text_encode_s": 0.01, "prefill_s": 0.02, "generate_s": 0.1, "codec_s": 0.05},
            "queue_wait_s": 0.0}


def test_failed_requests_are_counted_by_code_and_left_out_of_the_statistics():
    from breeze_client.bench import summarize
    from breeze_client.commands.bench import table

    rounds = [[_done(0, 0, 1.0, 5), {"client": 1, "code": "RESOURCE_EXHAUSTED", "message": "queue full"},
               _done(2, 10, 3.0, 5)],
              [{"client": 0, "code": "RESOURCE_EXHAUSTED", "message": "queue full"},
               {"client": 1, "code": "DEADLINE_EXCEEDED", "message": "late"}, _done(2, 0, 2.0, 5)]]
    s = summarize(LABELS["short"], 5, [r for batch in rounds for r in batch], rounds)
    assert s["requests"] == 3 and s["attempted"] == 6
    assert s["errors"] == {"RESOURCE_EXHAUSTED": 2, "DEADLINE_EXCEEDED": 1}
    assert [(f["round"], f["client"], f["code"]) for f in s["failures"]] == [
        (0, 1, "RESOURCE_EXHAUSTED"), (1, 0, "RESOURCE_EXHAUSTED"), (1, 1, "DEADLINE_EXCEEDED")]
    assert s["wall_s"] == {"mean": 2.0, "stddev": 1.0, "min": 1.0, "max": 3.0}  # the three that completed
    assert s["inter_chunk_ms"]["count"] == 12 and len(s["per_request"]) == 3
    assert [t["audio_s"] for t in s["rounds"]] == [0.8, 0.4]
    all_failed = summarize(LABELS["short"], 5, rounds[1][:2], [rounds[1][:2]])
    assert all_failed["requests"] == 0 and all_failed["wall_s"]["mean"] is None
    assert all_failed["rounds"] == [{"elapsed_s": None, "audio_s": 0.0, "x_realtime": None, "rtf": None}]
    doc = {"meta": {"target": "t", "worker_model": "m", "concurrency": 3, "warmup": 0, "iterations": 2,
                    "frame_limit_note": "n"}, "labels": [s, {**all_failed, "label": "medium"}]}
    text = table(doc)
    assert "short: 3 of 6 requests failed (DEADLINE_EXCEEDED x1, RESOURCE_EXHAUSTED x2)" in text
    assert "medium: 2 of 2 requests failed" in text
