"""One retrieval diagnosis in a child process, run when the parent says go.

    python -m netpath.client_proc --target H:P --artifact-target H:P --jobs 1 --max-frames 40 --chunk-size 16384

The child imports the SDK, connects, and runs one warm-up diagnosis (so nothing is imported or connected
for the first time later), then prints {"ready": PID} and waits for a line on its stdin: the parent
moves it into a cgroup meanwhile (a CPU quota, say). Then it runs the diagnosis and prints one JSON line,
`DiagnoseRun.to_dict()` plus "text" (`format_text`). `ClientProcess` is the context manager around it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True)
    p.add_argument("--artifact-target", required=True)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--max-frames", type=int, default=12)
    p.add_argument("--chunk-size", type=int, default=0)
    p.add_argument("--timeout", type=float, default=120.0)
    args = p.parse_args()

    from breeze_client.diagnose import DiagnoseSettings, FetchConfig, format_text, run_diagnosis
    from breeze_client.sdk import BreezeClient

    settings = DiagnoseSettings(jobs=args.jobs, max_frames=args.max_frames,
                                configs=(FetchConfig(chunk_size=args.chunk_size),))
    with BreezeClient(args.target, artifact_target=args.artifact_target, timeout_s=args.timeout) as client:
        run_diagnosis(client, DiagnoseSettings(jobs=1, max_frames=args.max_frames, configs=settings.configs))
        print(json.dumps({"ready": os.getpid()}), flush=True)
        sys.stdin.readline()
        run = run_diagnosis(client, settings)
    print(json.dumps({**run.to_dict(), "text": format_text(run)}), flush=True)


class ClientProcess:
    """Start the child, wait until it is ready (`pid`), then `go()` runs the diagnosis and returns its JSON."""

    def __init__(self, *args: str, timeout_s: float = 300.0) -> None:
        self.args = [sys.executable, "-m", "netpath.client_proc", *args]
        self.timeout_s = timeout_s
        self.proc: subprocess.Popen | None = None
        self.pid = 0

    def __enter__(self) -> ClientProcess:
        root = Path(__file__).resolve().parents[2]
        path = [str(root / "tests")] + [str(root / d) for d in ("client", "protos")]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
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
