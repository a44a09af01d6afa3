"""One retrieval diagnosis in a child process, run when the parent says go.

    python -m netpath.client_proc --target H:P --artifact-target H:P --jobs 1 --max-frames 40 --chunk-size 16384

The child imports the SDK, connects, and runs one warm-up diagnosis (so nothing is imported or connected
for the first time later), then prints {"ready": PID} and waits for a line on its stdin: the parent
moves it into a cgroup meanwhile (a CPU quota, say). Then it runs the diagnosis and prints one JSON line,
`DiagnoseRun.to_dict()` plus "text" (`format_text`). `ClientProcess` is the context manager around it. In
the diagnosed run the fetched file can be slow to write (`--write-delay`), and its first write can step the
process's wall clock (`--step-clock`, with the fake-clock shim on the child's path).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True)
    p.add_argument("--artifact-target", required=True)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--max-frames", type=int, default=12)
    p.add_argument("--chunk-size", type=int, default=0)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--write-delay", type=float, default=0.0,
                   help="seconds each write of the fetched file takes (a slow disk), in the diagnosed run")
    p.add_argument("--step-clock", type=float, default=None,
                   help="step this process's wall clock by this many seconds at the diagnosed fetch's first write "
                        "(the fake-clock shim must be on its path: netpath.fakeclock)")
    args = p.parse_args()

    from breeze_client.diagnose import DiagnoseSettings, FetchConfig, format_text, run_diagnosis
    from breeze_client.sdk import BreezeClient

    settings = DiagnoseSettings(jobs=args.jobs, max_frames=args.max_frames,
                                configs=(FetchConfig(chunk_size=args.chunk_size),))
    with BreezeClient(args.target, artifact_target=args.artifact_target, timeout_s=args.timeout) as client:
        run_diagnosis(client, DiagnoseSettings(jobs=1, max_frames=args.max_frames, configs=settings.configs))
        print(json.dumps({"ready": os.getpid()}), flush=True)
        sys.stdin.readline()
        run = run_diagnosis(client, settings, dest_factory=_dest(args.write_delay, args.step_clock))
    print(json.dumps({**run.to_dict(), "text": format_text(run)}), flush=True)


class _Dest:
    """The fetched file: each write takes `delay` s; the first steps the wall clock by `step` s (if given)."""

    def __init__(self, path, delay: float, step: float | None) -> None:
        self._f, self.delay, self.step = open(path, "wb"), delay, step

    def write(self, data):
        if self.step is not None:
            from netpath.fakeclock import set_clock_file

            set_clock_file(os.environ["BREEZE_TEST_CLOCK_FILE"], self.step)
            self.step = None
        time.sleep(self.delay)
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)


def _dest(delay: float, step: float | None):
    if not delay and step is None:
        return None
    return lambda _artifact_id, path: _Dest(path, delay, step)


class ClientProcess:
    """Start the child, wait until it is ready (`pid`), then `go()` runs the diagnosis and returns its JSON."""

    def __init__(self, *args: str, timeout_s: float = 300.0, env: dict[str, str] | None = None,
                 python_path: list[str | Path] = ()) -> None:
        self.args = [sys.executable, "-m", "netpath.client_proc", *args]
        self.timeout_s = timeout_s
        self.env, self.python_path = dict(env or {}), [str(p) for p in python_path]
        self.proc: subprocess.Popen | None = None
        self.pid = 0

    def __enter__(self) -> ClientProcess:
        root = Path(__file__).resolve().parents[2]
        path = self.python_path + [str(root / "tests")] + [str(root / d) for d in ("client", "protos")]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), **self.env)
        self.proc = subprocess.Popen(self.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        line = self._line()
        if not line:
            raise RuntimeError(f"the client process exited ({self.proc.wait()}) before it was ready")
        self.pid = json.loads(line)["ready"]
        return self

    def _line(self) -> str:
        timer = threading.Timer(self.timeout_s, self.proc.kill)  # a stuck child fails the test, not hangs it
        timer.start()
        try:
            return self.proc.stdout.readline()
        finally:
            timer.cancel()

    def go(self) -> dict:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        line = self._line()
        if not line:
            raise RuntimeError(f"the client process exited ({self.proc.wait()}) without a result")
        return json.loads(line)

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(timeout=30)


if __name__ == "__main__":
    main()
