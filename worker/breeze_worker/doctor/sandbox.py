"""Keeping the doctor's footprint on the host to its `--json` file.

torch.compile, Triton and the CUDA driver cache compiled kernels on disk (by default under /tmp and the home
directory). While the doctor runs they are pointed at a temporary directory that is removed afterwards, and
the process environment is restored, so a run leaves nothing behind and cannot change what a worker on the
same host later loads from its own cache.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator

CACHE_VARIABLES = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton", "CUDA_CACHE_PATH": "cuda"}


@contextlib.contextmanager
def private_caches() -> Iterator[str]:
    """Inside the block the compilers' caches live under a fresh temporary directory (yielded)."""
    saved = {name: os.environ.get(name) for name in CACHE_VARIABLES}
    root = tempfile.mkdtemp(prefix="breeze-doctor-")
    try:
        for name, sub in CACHE_VARIABLES.items():
            os.environ[name] = os.path.join(root, sub)
        yield root
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(root, ignore_errors=True)
