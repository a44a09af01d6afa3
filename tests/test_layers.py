"""The layer rules of docs/ARCHITECTURE.md, enforced by import-linter's contracts in pyproject.toml."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_hold():
    lint = Path(sys.executable).parent / "lint-imports"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(ROOT / d) for d in ("worker", "client", "protos")))
    result = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout, result.stdout
