"""A worker whose log nobody reads keeps serving. `breeze-worker serve --log-level debug` writes its log to a
4 KiB pipe that the test does not read while it serves requests: a log driver that stopped reading, made
from outside the process. A worker that wrote each line from the thread that logs it stopped at the first
line that did not fit (its start-up alone writes about 4 KB at debug level, a request about 1.5 KB). Then
the test reads the pipe: nothing was lost, only held (10,000 lines fit before any is dropped)."""

from __future__ import annotations

import fcntl
import os
import threading

from served import ServedWorker

from breeze_client.sdk import BreezeClient

F_SETPIPE_SZ = 1031  # Linux fcntl: a pipe's capacity in bytes (4096, one page, is the least)


def _read_all(fd: int, into: list[bytes]) -> None:
    with os.fdopen(fd, "rb") as pipe:
        into.extend(iter(lambda: pipe.read(65536), b""))


def test_a_worker_whose_log_is_not_read_keeps_serving(tmp_path):
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, F_SETPIPE_SZ, 4096)
    worker = ServedWorker(tmp_path / "artifacts", "--log-level", "debug", stderr=write_end)
    try:
        worker.start()
        jobs = []
        with BreezeClient(worker.target, timeout_s=60) as client:
            for i in range(8):  # ~12 KB of log lines behind a full 4 KiB pipe
                result = client.synthesize(f"Line number {i}.", seed=i, max_frames=3)
                assert result.stats.frames >= 1 and result.artifact is not None
                jobs.append(result.job.job_id)
            assert client.health() == "SERVING"
        assert worker.metrics()["breeze_log_records_dropped_total"] == 0  # held, not dropped
    finally:
        chunks: list[bytes] = []
        reader = threading.Thread(target=_read_all, args=(read_end, chunks), daemon=True)
        reader.start()  # now the log drains
        worker.stop()
        reader.join(60)
    log = b"".join(chunks).decode()
    assert worker.proc.returncode == 0, log[-3000:]
    assert "breeze_worker.serve" in log and "engine ready" in log
    for job_id in jobs:  # every request's lines came out once the pipe was read
        assert f"job {job_id} queued" in log
    assert "log records dropped" not in log
