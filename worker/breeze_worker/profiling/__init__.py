"""Profiling tools of the worker: the host-sync audit, request traces and the precision check
(`breeze-worker audit-syncs | trace | precision-check`). The engine-side instruments they use live in
`engine/tracing.py` and `engine/syncaudit.py`; the timing benchmark is `breeze_worker.bench`."""
