"""Measurement of the engine: the engine benchmark and the concurrency sweep, the host-sync audit, request
traces, precision agreement, memory peaks (`breeze-worker bench | trace | audit-syncs | precision-check`, the
doctor's probes, benchmarks/). The engine, the model and the artifact store never import it; the transport only
for the listening page's FP32 comparison (rendering.py). The span recorder it reads is `engine/tracing.py`."""
