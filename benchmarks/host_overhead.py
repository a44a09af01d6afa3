#!/usr/bin/env python
"""Host overhead: what the worker process's own Python side adds to every engine step, measured on any CPU.

The real worker (gRPC server and servicers, the engine thread and its scheduler, the sessions, the artifact
store, its log at INFO into a file) serves requests whose device work is simulated: a frame step takes --step-ms
and a codec call --codec-ms, during which the interpreter lock is free, as on a GPU where the host waits for the
device. Work the scheduler does while a step "runs" (its `while_running` callback) overlaps that time, as it does
on CUDA. A client process
(`breeze-client bench`, every 2nd request with CFG) loads it at each concurrency. The figure is the engine
thread's step period at full load against the simulated device time per step (step + codec): the difference is
what the host adds (the engine thread's per-stream work, the event loop's per-message work, and the waits for the
interpreter lock between the two). The model and codec are not run: only the frames' count and shapes matter.

    python benchmarks/host_overhead.py --streams 32,64 --step-ms 20 --codec-ms 4 --frames 96 --json host.json
    python benchmarks/host_overhead.py --tree ../older-checkout ...   # another source tree's worker, same device

On a small host the client process competes with the worker for cores: compare trees or settings in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_env import describe, pythonpath_for, use_source_tree, write_json

FRAME_MS = 80.0
SAMPLES_PER_FRAME = 1920
CODES = 16


# ---- the simulated device (runs inside the worker process) ----
class SimulatedDevice:
    """One in-order queue of device work, as one CUDA stream: work queued now starts when the work before it
    has finished."""

    def __init__(self) -> None:
        self.free_at = 0.0

    def queue(self, seconds: float) -> float:
        """Queue `seconds` of work; returns when it will have finished (perf_counter time)."""
        self.free_at = max(time.perf_counter(), self.free_at) + seconds
        return self.free_at


def _wait_until(t: float) -> None:
    time.sleep(max(0.0, t - time.perf_counter()))  # the interpreter lock is free meanwhile, as in a device wait


class SimulatedStepper:
    """The engine thread's stepper with the device's time simulated: a step queues `step_s` of device work
    (behind the codec call queued before it), calls `while_running` (as the fast path does once the step's
    work is queued) and returns when the work is done."""

    def __init__(self, device: SimulatedDevice, step_s: float, join_s_per_stream: float, trace,
                 join_fixed_s: float = 0.0, join_ops: int = 0):
        self.max_streams = 1 << 16
        self.device = device
        self.step_s, self.join_s = step_s, join_s_per_stream
        self.join_fixed_s, self.join_ops = join_fixed_s, join_ops
        self._streams: dict[object, list[int]] = {}
        self._trace = trace

    def __len__(self) -> int:
        return len(self._streams)

    def join(self, joiners):
        """`join_ops` small tensor operations on the host, then the join's device time (`join_fixed_s` +
        `join_s` a joiner). The operations stand for an eager join's launches (a full-size prefill is ~400):
        each call of a torch operation lets go of the interpreter lock and takes it back, and while the event
        loop is busy (a burst being received) each take-back may wait a whole switch interval."""
        self._trace.write(f"join {time.perf_counter():.6f} {len(joiners)}\n")
        if self.join_ops:
            import torch

            x = torch.zeros(1)
            for _ in range(self.join_ops):
                x = torch.add(x, 1.0)
        time.sleep(self.join_fixed_s + self.join_s * len(joiners))
        for key, params in joiners:
            self._streams[key] = [0, params.max_frames]
        return {}

    def leave(self, key) -> None:
        self._streams.pop(key, None)

    def forget(self, key) -> None:
        pass

    def stream_info(self, key) -> dict:
        return {}

    def step(self, while_running=None):
        import torch

        from breeze_worker.engine.stepper import StepOutcome
        from breeze_worker.engine.types import EndReason

        started = time.perf_counter()
        self._trace.write(f"{started:.6f} {len(self._streams)}\n")
        done = self.device.queue(self.step_s)
        if while_running is not None:
            while_running()
        _wait_until(done)
        codes = torch.zeros(len(self._streams), CODES, dtype=torch.long)  # one host read for all streams
        out = {}
        for i, (key, state) in enumerate(list(self._streams.items())):
            state[0] += 1
            last = state[0] >= state[1]
            out[key] = StepOutcome(frame=codes[i], end_reason=EndReason.FRAME_LIMIT if last else None)
            if last:
                self.leave(key)
        return out


class SimulatedAudio:
    """A launched codec call: ready once the device has run it."""

    queued_on_device = False

    def __init__(self, keys: list, ready_at: float):
        self._slots = {key: i for i, key in enumerate(keys)}
        self._ready_at = ready_at

    @property
    def keys(self) -> list:
        return list(self._slots)

    def device_ms(self) -> None:
        return None

    def wait_rows(self):
        import numpy as np

        _wait_until(self._ready_at)
        return np.zeros((len(self._slots), SAMPLES_PER_FRAME), dtype=np.float32), dict(self._slots)

    def wait(self) -> dict:  # what a --tree from before wait_rows reads
        rows, slots = self.wait_rows()
        return {key: rows[row] for key, row in slots.items()}


class SimulatedCodec:
    """The scheduler's codec rows: one batched call per step for every active stream."""

    def __init__(self, device: SimulatedDevice, codec_s: float):
        self.device = device
        self.codec_s = codec_s
        self._keys: dict[object, None] = {}
        try:  # the codes' one host upload, stacked as the codec's rows stack them
            from breeze_worker.engine.codec_rows import stack_frames
        except ImportError:  # a --tree from before stack_frames
            import torch

            def stack_frames(frames):
                return torch.stack([torch.as_tensor(f).reshape(-1) for f in frames])
        self._stack = stack_frames

    def __len__(self) -> int:
        return len(self._keys)

    def add(self, key) -> None:
        self._keys[key] = None

    def add_all(self, keys) -> None:
        for key in keys:
            self.add(key)

    def remove(self, key) -> None:
        self._keys.pop(key, None)

    def remove_all(self, keys) -> None:
        for key in keys:
            self.remove(key)

    def launch(self, frames: dict, timed: bool = False) -> SimulatedAudio:
        self._stack(frames.values())
        return SimulatedAudio(list(frames), self.device.queue(self.codec_s))


async def _serve(args: argparse.Namespace) -> None:
    from breeze_worker import logs
    from breeze_worker.artifacts.store import ArtifactStore
    from breeze_worker.config import WorkerSettings
    from breeze_worker.engine.service import Engine
    from breeze_worker.transport.server import create_server

    logs.configure("INFO", "text")  # as `breeze-worker serve` logs by default: its lines cost the event loop too
    settings = WorkerSettings.load(environ={
        "BREEZE_SERVER_PORT": "0", "BREEZE_SERVER_ARTIFACT_PORT": "0", "BREEZE_ENGINE_DEVICE": "cpu",
        "BREEZE_ARTIFACTS_DIRECTORY": args.artifacts, "BREEZE_ENGINE_MAX_ACTIVE_STREAMS": str(args.max_streams),
        "BREEZE_ENGINE_MAX_QUEUE": str(args.max_streams), **dict(kv.split("=", 1) for kv in args.env)}).validate()
    store = ArtifactStore(settings.artifacts)
    engine = Engine(settings.engine, store)
    servers = await create_server(settings, engine, store)
    await engine.start()
    from breeze_worker.commands import serve

    tune = getattr(serve, "tune_interpreter", None)
    if tune is not None:  # as `breeze-worker serve` does once warm (trees before it had no such step)
        tune(settings.server, engine.metrics)
    trace = open(args.trace, "w", buffering=1 << 16)
    scheduler = engine.scheduler
    assert scheduler is not None
    device = SimulatedDevice()
    scheduler._stepper = SimulatedStepper(device, args.step_ms / 1e3, args.join_ms / 1e3, trace,
                                          join_fixed_s=args.join_fixed_ms / 1e3, join_ops=args.join_ops)
    scheduler._codec = SimulatedCodec(device, args.codec_ms / 1e3)
    await servers.set_serving(True)
    print(f"READY 127.0.0.1:{servers.synthesis_port}", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    trace.close()
    await servers.stop(0.5)
    await engine.stop()


# ---- the driver ----
def _periods(trace: Path, streams: int) -> list[float]:
    """Seconds between consecutive steps that both stepped `streams` streams (full load)."""
    lines = [line.split() for line in trace.read_text().splitlines() if line]
    rows = [(float(t), int(n)) for t, n in (parts for parts in lines if len(parts) == 2)]
    return [b[0] - a[0] for a, b in zip(rows, rows[1:]) if a[1] == b[1] == streams]


def _join_sizes(trace: Path) -> list[int]:
    """The number of joiners of each join, in order (a burst onto an idle worker: one join, or the first
    request alone and the rest after it)."""
    return [int(parts[2]) for parts in (line.split() for line in trace.read_text().splitlines())
            if len(parts) == 3 and parts[0] == "join"]


def _level(args: argparse.Namespace, streams: int, work: Path) -> dict:
    trace, artifacts = work / f"steps-{streams}.txt", work / f"artifacts-{streams}"
    log_path = work / f"worker-{streams}.log"  # the worker's log, as a served worker's would go
    env = dict(os.environ)
    if args.tree:
        env["PYTHONPATH"] = pythonpath_for(Path(args.tree), env.get("PYTHONPATH"))
    cmd = [sys.executable, __file__, "--serve", "--trace", str(trace), "--artifacts", str(artifacts),
           "--max-streams", str(streams), "--step-ms", str(args.step_ms), "--codec-ms", str(args.codec_ms),
           "--join-ms", str(args.join_ms), "--join-fixed-ms", str(args.join_fixed_ms), "--join-ops",
           str(args.join_ops), *[f"--env={kv}" for kv in args.env]]
    with open(log_path, "w") as log:
        worker = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    try:
        assert worker.stdout is not None
        line = worker.stdout.readline()
        if not line.startswith("READY "):
            raise RuntimeError(f"the simulated worker did not start (exit {worker.poll()})")
        target = line.split()[1]
        bench = subprocess.run([sys.executable, "-m", "breeze_client.cli", "bench", "--target", target, "--labels",
                                "chunk-7.36s", "--frames", str(args.frames), "--warmup", "1", "--iterations",
                                str(args.iterations), "--concurrency", str(streams), "--cfg-every", "2", "--json", "-"],
                               capture_output=True, text=True, timeout=1800)
        if bench.returncode != 0:
            raise RuntimeError(f"breeze-client bench failed: {bench.stderr[-2000:]}")
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
    label = json.loads(bench.stdout)["labels"][0]
    periods = _periods(trace, streams)
    device_ms = args.step_ms + args.codec_ms
    period_ms = 1e3 * statistics.median(periods) if periods else None
    return {"streams": streams, "steps_at_full_load": len(periods), "step_period_ms_median": period_ms,
            "step_period_ms_p90": 1e3 * statistics.quantiles(periods, n=10)[-1] if len(periods) > 1 else None,
            "simulated_device_ms": device_ms,
            "host_ms_per_step": period_ms - device_ms if period_ms is not None else None,
            "aggregate_x_realtime": label["aggregate_x_realtime"]["mean"],
            "device_bound_x_realtime": streams * FRAME_MS / device_ms,
            "join_sizes": _join_sizes(trace), "worker_log": str(log_path),
            "ttfa_ms_p50": label["ttfa_ms"]["p50"], "ttfa_ms_p95": _p95(label["per_request"], "ttfa_ms"),
            "worker_ttfa_ms_mean": label["worker_ttfa_ms"]["mean"],
            "worker_ttfa_ms_p95": _p95(label["per_request"], "worker_ttfa_ms"),
            "ttfa_split_ms": label.get("ttfa_split_ms"), "end_split_ms": label.get("end_split_ms")}


def _p95(requests: list[dict], key: str) -> float | None:
    values = [r[key] for r in requests if r.get(key) is not None]
    return statistics.quantiles(values, n=20)[-1] if len(values) > 1 else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", default="32,64", type=lambda s: [int(x) for x in s.split(",") if x])
    p.add_argument("--step-ms", type=float, default=20.0, help="simulated frame step (the language model)")
    p.add_argument("--codec-ms", type=float, default=4.0, help="simulated codec call")
    p.add_argument("--join-ms", type=float, default=1.0, help="simulated join time per joining stream")
    p.add_argument("--join-fixed-ms", type=float, default=0.0, help="simulated join time, whatever the joiners")
    p.add_argument("--join-ops", type=int, default=0,
                   help="host tensor operations per join (an eager full-size prefill launches ~400)")
    p.add_argument("--frames", type=int, default=96)
    p.add_argument("--iterations", type=int, default=2)
    p.add_argument("--tree", default=None, help="run the worker from this source tree (a baseline checkout)")
    p.add_argument("--env", action="append", default=[], help="a worker setting as BREEZE_...=VALUE")
    p.add_argument("--json", default=None)
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--trace", default=None, help=argparse.SUPPRESS)
    p.add_argument("--artifacts", default=None, help=argparse.SUPPRESS)
    p.add_argument("--max-streams", type=int, default=64, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        asyncio.run(_serve(args))
        return 0
    use_source_tree()
    work = Path(tempfile.mkdtemp(prefix="host-overhead-"))
    doc = {"schema": "breeze-host-overhead/1", "meta": describe(), "tree": args.tree or "this checkout",
           "settings": args.env, "levels": []}
    for streams in args.streams:
        row = _level(args, streams, work)
        doc["levels"].append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        write_json(args.json, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
