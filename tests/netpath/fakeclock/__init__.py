"""A wall clock the test controls, for a worker or client subprocess (see sitecustomize.py in this directory).

    with FakeClock() as clock, WorkerProcess(env=clock.env(), python_path=[SHIM_DIR]) as worker:
        clock.set(300.0)            # the worker's wall clock runs 300 s ahead
        clock.set(298.0)            # ... and now steps back by 2 s
        clock.set(0.0, rate=0.05)   # ... or runs 5 % fast from now on
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

SHIM_DIR = Path(__file__).resolve().parent


def set_clock_file(path: str | Path, offset_s: float, rate: float = 0.0) -> None:
    """Write what the shim reads (replacing the file atomically): from a test, or from the shimmed process."""
    path = Path(path)
    temp = path.with_suffix(".new")
    temp.write_text(f"{offset_s!r} {rate!r}\n", encoding="ascii")
    os.replace(temp, path)


class FakeClock:
    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="breeze-clock-")
        self.path = Path(self._tmp.name) / "offset"
        self.set(0.0)

    def set(self, offset_s: float, rate: float = 0.0) -> None:
        """The process's wall clock = real + offset_s (+ rate x seconds from now)."""
        set_clock_file(self.path, offset_s, rate)

    def env(self) -> dict[str, str]:
        """Environment for the worker subprocess (with SHIM_DIR first on its PYTHONPATH): the file to read."""
        return {"BREEZE_TEST_CLOCK_FILE": str(self.path)}

    def __enter__(self) -> FakeClock:
        return self

    def __exit__(self, *exc) -> None:
        self._tmp.cleanup()
