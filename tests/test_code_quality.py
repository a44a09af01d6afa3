"""The checks pyproject.toml configures run clean: ruff (style, imports, bugbear, pyupgrade) over the tree and
mypy over the worker and client packages. A finding fails the test suite with the tool's own report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=1800)


def test_ruff_finds_nothing():
    result = _run(str(BIN / "ruff"), "check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_finds_nothing():  # ~40 s alone on 2 cores, minutes beside a busy suite (run_layout.LONG_TIMEOUT_S)
    result = _run(str(BIN / "mypy"), "--no-incremental")  # files and options: [tool.mypy]
    assert result.returncode == 0, result.stdout[-20000:] + result.stderr
    assert "Success: no issues found" in result.stdout, result.stdout


def test_the_checks_are_configured_to_catch_something(tmp_path):
    """The same configuration reports an undefined name (ruff) and a wrong return type (mypy)."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f(x: int) -> str:\n    return x\n\n\ndef g() -> int:\n    return undefined_name\n")
    ruff = _run(str(BIN / "ruff"), "check", "--no-cache", "--config", str(ROOT / "pyproject.toml"), str(bad))
    assert ruff.returncode != 0 and "F821" in ruff.stdout, ruff.stdout
    mypy = _run(str(BIN / "mypy"), "--no-incremental", "--config-file", str(ROOT / "pyproject.toml"), str(bad))
    assert mypy.returncode != 0 and "Incompatible return value" in mypy.stdout, mypy.stdout
