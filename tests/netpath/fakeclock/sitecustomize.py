"""Test-only: this process's wall clock in nanoseconds (time.time_ns) shifted as a file says.

Python imports `sitecustomize` at start-up from its path; the clock fault tests put this directory on a
worker subprocess's PYTHONPATH (`netpath.fakeclock.FakeClock`), nothing else does. The file named by
BREEZE_TEST_CLOCK_FILE holds "OFFSET_S [RATE]": the wall clock then reads
real + OFFSET_S + RATE * (real - when the file last changed). Replacing the file steps the clock; a
RATE makes it run fast (or slow, if negative). Every worker timestamp the protocol carries comes from
time.time_ns; time.time (which gRPC's Python layer reads for deadlines) and the monotonic clocks are left
alone. (libfaketime 0.9.10 shifted the clock from outside, but made Python's time.sleep fail with EINVAL
here.)
"""

import os
import time

_PATH = os.environ.get("BREEZE_TEST_CLOCK_FILE")

if _PATH:
    _real_ns = time.time_ns
    _seen = [None, 0, 0.0, 0]  # (inode, mtime), offset ns, rate, anchor ns

    def _load() -> None:
        try:
            st = os.stat(_PATH)
        except FileNotFoundError:
            return
        key = (st.st_ino, st.st_mtime_ns)
        if key != _seen[0]:
            with open(_PATH, encoding="ascii") as f:
                parts = f.read().split()
            _seen[:] = [key, int(float(parts[0]) * 1e9) if parts else 0,
                        float(parts[1]) if len(parts) > 1 else 0.0, _real_ns()]

    def _time_ns() -> int:
        _load()
        real = _real_ns()
        return real + _seen[1] + int(_seen[2] * (real - _seen[3]))

    time.time_ns = _time_ns
