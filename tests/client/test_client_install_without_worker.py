"""The client installs and runs without the worker's dependencies (`pip install .` has no torch).

pyproject.toml keeps torch, transformers and the rest of the model stack in the `worker` extra. This test
imports every client module in a fresh interpreter in which those packages (every module that comes
only from an optional extra, found through the installed distributions) and `breeze_worker` cannot be
imported, then parses each subcommand's flags, so an import that would pull the worker side in fails here.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _dist(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].strip().lower().replace("_", "-")


def _optional_only_modules() -> list[str]:
    base = {_dist(r) for r in PYPROJECT["dependencies"]}
    optional = {_dist(r) for group in PYPROJECT["optional-dependencies"].values() for r in group} - base
    modules = set()
    for module, dists in packages_distributions().items():
        names = {d.lower().replace("_", "-") for d in dists}
        if names & optional and not names & base:
            modules.add(module)
    return sorted(modules)


CHILD = r"""
import importlib, importlib.abc, json, pkgutil, sys

blocked = set(json.loads(sys.argv[1]))

class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ImportError(f"{name} is not installed (a worker-only dependency)")
        return None

sys.meta_path.insert(0, Blocker())
import breeze_client
modules = [m.name for m in pkgutil.walk_packages(breeze_client.__path__, "breeze_client.")]
for name in modules:
    importlib.import_module(name)
from breeze_client import cli
for command in cli.COMMANDS:
    cli.build_parser([command])
leaked = sorted(m for m in sys.modules if m.split(".")[0] in blocked)
print(json.dumps({"modules": modules, "leaked": leaked}))
"""


def test_base_dependencies_hold_no_model_stack():
    base = {_dist(r) for r in PYPROJECT["dependencies"]}
    worker = {_dist(r) for r in PYPROJECT["optional-dependencies"]["worker"]}
    assert not base & {"torch", "transformers", "tokenizers", "safetensors", "soundfile", "numpy"}, base
    assert {"torch", "transformers", "tokenizers", "safetensors", "soundfile"} <= worker


def test_every_client_module_imports_without_the_worker_dependencies():
    blocked = [*_optional_only_modules(), "breeze_worker"]
    assert {"torch", "transformers", "numpy", "soundfile"} <= set(blocked), blocked  # the blocker bites
    paths = [str(ROOT / d) for d in ("client", "protos")]
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(blocked)], capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": ":".join(paths), "PATH": "/usr/bin:/bin"},
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"breeze_client.sdk", "breeze_client.aio", "breeze_client.cli",
            "breeze_client.commands.synth", "breeze_client.commands.fetch"} <= set(report["modules"])
    assert report["leaked"] == []


WORKER_CHILD = r"""
import importlib.abc, json, sys

blocked = set(json.loads(sys.argv[1]))

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:  # as Python reports a package that is not installed
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
from breeze_worker.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("argv", [
    ["serve", "--device", "cpu", "--port", "0", "--artifact-port", "0"],
    ["doctor", "--device", "cpu"],
    ["make-checkpoint", "--size", "tiny", "out"],
    ["bench", "--help"],
])
def test_breeze_worker_without_the_worker_extra_says_what_to_install(argv, tmp_path):
    """`pip install .` also installs the `breeze-worker` script: without the worker extra each command ends in
    one line naming the missing package and the extra to install, not a traceback."""
    blocked = _optional_only_modules()
    paths = [str(ROOT / d) for d in ("worker", "client", "protos")]
    proc = subprocess.run([sys.executable, "-c", WORKER_CHILD, json.dumps(blocked), *argv], capture_output=True,
                          text=True, timeout=120, env={"PYTHONPATH": ":".join(paths), "PATH": "/usr/bin:/bin"},
                          cwd=tmp_path)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "breeze-tts-serving[worker]" in proc.stderr and "no module named" in proc.stderr
    assert not (tmp_path / "out").exists()
