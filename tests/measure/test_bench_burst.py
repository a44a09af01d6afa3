"""The concurrency bench's burst loop says where a stall sits: a join or step past `stall_dump_s` dumps the
Python stacks, and steps far above the median are listed with their device parts."""

from __future__ import annotations

import time

import torch

from breeze_worker.engine.stepper import StepOutcome
from breeze_worker.engine.types import EndReason
from breeze_worker.measure import concurrency


class _SlowJoin:
    """A stepper whose join takes `join_s`; every stream then ends at its first step without a frame."""

    def __init__(self, join_s: float):
        self.join_s = join_s
        self.keys: list = []

    def join(self, joiners):
        time.sleep(self.join_s)
        self.keys = [key for key, _ in joiners]
        return {}

    def step(self, while_running=None):
        if while_running is not None:
            while_running()
        return {key: StepOutcome(end_reason=EndReason.FRAME_LIMIT) for key in self.keys}


def test_a_join_past_the_limit_dumps_the_stacks(capfd):
    out = concurrency.run_burst(_SlowJoin(0.6), None, [object(), object()], torch.device("cpu"), stall_dump_s=0.1)
    err = capfd.readouterr().err
    assert "in join" in err and "test_bench_burst.py" in err
    assert out["join_s"] >= 0.6


def test_no_dump_when_the_burst_is_quick(capfd):
    concurrency.run_burst(_SlowJoin(0.0), None, [object()], torch.device("cpu"), stall_dump_s=2.0)
    time.sleep(0.1)
    assert "in join" not in capfd.readouterr().err


def test_slow_steps_are_listed_with_their_device_parts():
    burst = {"step_times_s": [0.010, 0.011, 0.012, 0.200, 0.010], "lm_ms": [9.0, 9.5, 9.0, 190.0, 9.0],
             "codec_ms": [1.0, 1.0, 1.0, 1.0]}
    slow = concurrency._slow_steps(burst, median_ms=11.0)
    assert slow == [{"step": 3, "ms": 200.0, "lm_ms": 190.0, "codec_ms": 1.0}]
    assert concurrency._slow_steps(burst, median_ms=50.0) == []
