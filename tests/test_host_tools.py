"""Tests that need what a host may lack (a system tool, root) are skipped there and listed at the end of the run
with what each needs; with BREEZE_TESTS_REQUIRE_HOST=1, which CI sets, they fail instead. scripts/test.sh and
tests/host_tools.py name the same Debian package for each tool."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import host_tools

ROOT = Path(__file__).resolve().parents[1]

NEEDY = '''
import os
import pytest
from host_tools import need_tool

def test_needs_a_tool_no_host_has():
    need_tool("breeze-no-such-tool")

@pytest.mark.root
def test_needs_root():
    pass

def test_needs_nothing():
    pass
'''


def _run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    for name in ("conftest.py", "host_tools.py", "run_layout.py"):
        shutil.copy(ROOT / "tests" / name, tmp_path / name)
    (tmp_path / "test_needy.py").write_text(NEEDY)
    (tmp_path / "not_root.py").write_text("import os\nos.geteuid = lambda: 1000\n")  # as an ordinary user
    environ = {k: v for k, v in os.environ.items() if k != host_tools.REQUIRE_ENV}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "not_root", "-p", "no:cacheprovider", "-q",
                           "test_needy.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**environ, "PYTHONPATH": str(tmp_path), **env})


def test_what_the_host_lacks_is_skipped_and_listed(tmp_path):
    run = _run(tmp_path)
    assert run.returncode == 0, run.stdout
    assert "1 passed, 2 skipped" in run.stdout
    assert "2 test(s) skipped for what this host lacks" in run.stdout
    assert ("test_needy.py::test_needs_a_tool_no_host_has: needs breeze-no-such-tool (apt-get install "
            "breeze-no-such-tool)") in run.stdout
    assert "test_needy.py::test_needs_root: needs root" in run.stdout


def test_ci_fails_what_the_host_lacks(tmp_path):
    run = _run(tmp_path, **{host_tools.REQUIRE_ENV: "1"})
    assert run.returncode == 1, run.stdout
    assert "FAILED test_needy.py::test_needs_a_tool_no_host_has" in run.stdout  # root is checked at setup:
    assert "ERROR test_needy.py::test_needs_root" in run.stdout  # an error, still a red run
    assert (ROOT / ".ci" / "run").read_text().count(f"export {host_tools.REQUIRE_ENV}=1") == 1


def test_the_installer_and_the_skips_name_the_same_packages():
    script = (ROOT / "scripts" / "test.sh").read_text()
    pairs = dict(re.findall(r"([\w.-]+):([\w.-]+)", script.split("for pair in", 1)[1].split("; do", 1)[0]))
    assert pairs and all(host_tools.PACKAGES[tool] == package for tool, package in pairs.items()), pairs
