"""What every benchmark result records about where it ran: the GPU and its driver, the torch and Triton
versions, Python, the host, the date and the commit. Also puts the repository's packages on the import
path, so each tool runs from a checkout as `python benchmarks/NAME.py` without an install (the GPU hosts
run them that way).

The commit is `--commit` or $BREEZE_COMMIT when given (a copied working tree may carry no .git, or a stale
one), else `git rev-parse HEAD` of this checkout with a `dirty` flag, else "unknown".
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import logging
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE_DIRS = ("worker", "client", "protos")


def pythonpath_for(root: Path, existing: str | None = None) -> str:
    """A PYTHONPATH with the packages of the source tree `root` (worker/, client/, protos/) ahead of `existing`."""
    paths = [str(Path(root).resolve() / d) for d in SOURCE_DIRS]
    return os.pathsep.join(paths + ([existing] if existing else []))


def use_source_tree() -> None:
    """The checkout's packages first on sys.path (and for child processes, on PYTHONPATH)."""
    for path in reversed([str(ROOT / d) for d in SOURCE_DIRS]):
        if path not in sys.path:
            sys.path.insert(0, path)
    os.environ["PYTHONPATH"] = pythonpath_for(ROOT, os.environ.get("PYTHONPATH"))


def _run(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def gpus() -> list[dict]:
    """The GPUs nvidia-smi lists (name, driver, memory); empty where there is none."""
    out = _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
    rows = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3:
            rows.append({"name": parts[0], "driver": parts[1], "memory": parts[2]})
    return rows


def commit(explicit: str | None = None) -> dict:
    if explicit or os.environ.get("BREEZE_COMMIT"):
        return {"commit": explicit or os.environ["BREEZE_COMMIT"], "source": "given"}
    head = _run(["git", "rev-parse", "HEAD"])
    if not head:
        return {"commit": "unknown", "source": "no git checkout here"}
    dirty = bool(_run(["git", "status", "--porcelain", "--untracked-files=no"]))
    return {"commit": head, "source": "git", "dirty": dirty}


def start_run(args) -> None:
    """What a bench built on `breeze-worker bench`'s arguments does first: logging at `args.log_level`, and the
    commit to record (`args.commit`, else this checkout's)."""
    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.WARNING),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    args.commit = args.commit or commit()["commit"]


def describe(explicit_commit: str | None = None) -> dict:
    """The environment record every tool's JSON carries under "meta"."""
    listed = gpus()
    return {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            **commit(explicit_commit),
            "gpu": listed[0]["name"] if listed else None, "driver": listed[0]["driver"] if listed else None,
            "gpus": listed, "torch": _version("torch"), "triton": _version("triton"),
            "python": platform.python_version(), "host": socket.gethostname(), "platform": platform.platform()}


def write_json(path: str | Path, doc: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")


def child_json(script: str | Path, argv: list[str], tree: Path | None = None) -> dict:
    """Run `script` with `argv` in a child Python, with the packages of source tree `tree` (a baseline
    checkout; None: this checkout's) on its path, and parse the JSON object its last output line holds."""
    env = dict(os.environ, PYTHONPATH=pythonpath_for(tree if tree is not None else ROOT, None))
    done = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{Path(script).name} {' '.join(argv)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def take_turns(tree: str | None, rounds: int, turn) -> dict[str, list]:
    """`turn(source_tree)` `rounds` times for this checkout (None) and, with `tree`, for that source tree,
    alternated so that both see the same drift of a shared host: {"this checkout": [...], "other tree": [...]}."""
    trees = {"this checkout": None, **({"other tree": Path(tree)} if tree else {})}
    turns: dict[str, list] = {name: [] for name in trees}
    for _ in range(rounds):
        for name, path in trees.items():
            turns[name].append(turn(path))
    return turns


def compare_trees(summary: dict, key: str, what: str) -> None:
    """Where `summary` has both trees: the other tree's `key` over this checkout's, printed and kept as
    `other_over_this`."""
    if "other tree" in summary:
        ratio = summary["other tree"][key] / summary["this checkout"][key]
        summary["other_over_this"] = ratio
        print(f"other tree / this checkout: {ratio:.2f}x {what}")
