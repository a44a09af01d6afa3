"""A helper process of the network-path tools: started with this package importable, it reports itself ready
with one JSON line on stdout, and ends when its stdin closes."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path


def start_reporting_child(args: list[str], what: str) -> tuple[subprocess.Popen, dict]:
    """Start `args` and read its first JSON line; a child that exits first raises, naming `what`."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                        os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    if not line:
        proc.stdin.close()
        proc.wait(30)
        raise RuntimeError(f"the {what} failed to start (exit {proc.returncode})")
    return proc, json.loads(line)
