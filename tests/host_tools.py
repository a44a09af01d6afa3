"""What a test needs from the host beyond Python packages: a system tool, or root.

A test that lacks one is skipped with the reason `needs TOOL (apt-get install PACKAGE)` or `needs root (...)`,
so a developer's machine without them runs every other test (`scripts/test.sh` lists the skipped ones and what
each needs at the end of the run). CI (`.ci/run`) sets BREEZE_TESTS_REQUIRE_HOST=1: there a missing tool or
missing root fails the test instead, so CI never passes by skipping.

    espeak = need_tool("espeak-ng")       # its path, or the test is skipped (fails in CI)
    need_root("network namespaces")       # tests marked @pytest.mark.root get this before their fixtures
"""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest

REQUIRE_ENV = "BREEZE_TESTS_REQUIRE_HOST"  # "1": a missing tool or missing root fails the test (CI)
SKIP_PREFIX = "needs "  # every skip reason given here starts so (conftest.py lists them at the end of a run)

# tool -> the Debian/Ubuntu package that provides it (scripts/test.sh installs these when it runs as root)
PACKAGES = {
    "espeak-ng": "espeak-ng", "sox": "sox", "ip": "iproute2", "tc": "iproute2", "chromium": "chromium",
    "openssl": "openssl", "node": "nodejs", "npm": "npm", "losetup": "mount", "mount": "mount", "umount": "mount",
    "mkfs.ext4": "e2fsprogs", "unshare": "util-linux", "curl": "curl",
}


def required() -> bool:
    return os.environ.get(REQUIRE_ENV) == "1"


def lacking(what: str) -> NoReturn:
    """Skip the running test for `what` the host lacks, or fail it where the host must have everything (CI)."""
    if required():
        pytest.fail(f"{SKIP_PREFIX}{what}, and {REQUIRE_ENV}=1 (CI) requires it", pytrace=False)
    pytest.skip(f"{SKIP_PREFIX}{what}")


def need_tool(tool: str, *alternatives: str) -> str:
    """The path of `tool` (or of the first of `alternatives` present)."""
    for name in (tool, *alternatives):
        path = shutil.which(name)
        if path:
            return path
    lacking(f"{tool} (apt-get install {PACKAGES.get(tool, tool)})")


def need_tools(*tools: str) -> dict[str, str]:
    return {tool: need_tool(tool) for tool in tools}


def need_root(why: str) -> None:
    if os.geteuid() != 0:
        lacking(f"root ({why})")
