"""A full artifact disk costs artifacts, never audio: a real worker process whose artifact directory is a
small tmpfs, filled from outside the worker while jobs stream; and a kill -9 mid-write, then a restart."""

from __future__ import annotations

import hashlib
import time

import pytest
from disk import fill, small_tmpfs
from served import ServedWorker
from streams import StreamInThread

from breeze_client.sdk import BreezeClient

pytestmark = pytest.mark.root
MIB = 1024 * 1024
HEADROOM = 512 * 1024


def _degraded(client: BreezeClient) -> str:
    return client.worker_info(refresh=True).artifact_store_degraded


def _wait(predicate, timeout_s: float = 30, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _assert_whole_stream(run: StreamInThread, width: int) -> None:
    result = run.result
    assert run.error is None and result is not None, run.error
    assert result.stats.end_reason in ("frame_limit", "end_of_speech")
    assert result.stats.frames >= 1 and len(run.audio) == result.stats.frames * 1920 * width


def _assert_fetched(client: BreezeClient, worker: ServedWorker, run: StreamInThread) -> None:
    artifact = run.result.artifact
    assert artifact is not None, run.result.artifact_unavailable
    fetched = client.fetch(artifact.artifact_id, None, endpoint=worker.artifact_target)
    assert fetched.verified and fetched.data[-len(run.audio):] == bytes(run.audio)
    assert hashlib.sha256(fetched.data).hexdigest() == artifact.sha256


def test_a_disk_that_fills_mid_stream_costs_the_writing_jobs_their_artifacts_only(tmp_path):
    with small_tmpfs(tmp_path / "disk", 3 * MIB) as disk:
        worker = ServedWorker(disk, "--max-active-streams", "4", "--artifact-min-free-bytes", str(HEADROOM)).start()
        try:
            with BreezeClient(worker.target, timeout_s=300) as client:
                writing_f32 = StreamInThread(client, "A long text written frame by frame.", max_frames=200,
                                             seed=1, temperature=0.0, encoding="f32le")
                writing_s16 = StreamInThread(client, "Another long text.", max_frames=200, seed=2, temperature=0.0)
                # one chunk of 50 frames at its end: it writes nothing while the disk is full
                quiet = StreamInThread(client, "A quiet one.", max_frames=50, frames_per_chunk=50, seed=3,
                                       temperature=0.0)
                quiet.wait_for(0)
                writing_f32.wait_for(3)
                writing_s16.wait_for(3)
                hog = fill(disk)  # from outside the worker: the next writes get ENOSPC from the kernel
                _wait(lambda: sum("given up" in line for line in worker.log) >= 2, what="two artifacts given up")
                reason = _degraded(client)
                assert "artifact disk" in reason
                assert worker.metrics()["breeze_artifact_store_degraded"] == 1
                assert worker.wait_logged("artifact store DEGRADED")
                # a job starting now cannot have the headroom: it streams without an artifact
                refused = client.synthesize("No room.", max_frames=4, seed=4)
                assert refused.artifact is None and "headroom" in refused.artifact_unavailable
                assert len(refused.audio) == refused.stats.frames * 1920 * 2
                hog.unlink()

                for run, width in ((writing_f32, 4), (writing_s16, 2), (quiet, 2)):
                    run.finish()
                    _assert_whole_stream(run, width)  # every stream ran to its end
                for run in (writing_f32, writing_s16):
                    assert run.result.artifact is None
                    assert "disk is full" in run.result.artifact_unavailable
                _assert_fetched(client, worker, quiet)  # it wrote after the disk had room again

                _wait(lambda: _degraded(client) == "", what="the degraded state to clear")
                after = StreamInThread(client, "Room again.", max_frames=6, seed=5)
                after.finish()
                _assert_fetched(client, worker, after)
                assert not list(disk.glob(".art-*"))  # no temp file left behind
                metrics = worker.metrics()
                assert metrics["breeze_artifact_store_degraded"] == 0
                assert metrics['breeze_artifacts_unavailable_total{cause="no_space"}'] == 2
                assert metrics['breeze_artifacts_unavailable_total{cause="headroom"}'] == 1
                assert 'breeze_jobs_total{end_reason="error"}' not in metrics  # no job failed
        finally:
            worker.stop()


def test_a_restart_after_kill_9_mid_write_sweeps_the_temp_file(tmp_path):
    disk = tmp_path / "artifacts"
    disk.mkdir()
    worker = ServedWorker(disk).start()
    try:
        with BreezeClient(worker.target, timeout_s=300) as client:
            run = StreamInThread(client, "Cut off by a crash.", max_frames=400, seed=6, temperature=0.0)
            run.wait_for(4)
            assert list(disk.glob(".art-*.partial"))  # mid-write
            worker.kill9()
            run.finish()
            assert run.error is not None and run.error.code == "UNAVAILABLE"
        assert list(disk.glob(".art-*.partial"))  # what the crash left
        worker.start()  # the same directory and ports
        assert worker.wait_logged("removed 1 unfinished artifact file")
        assert not list(disk.glob(".art-*.partial"))
        with BreezeClient(worker.target, timeout_s=300) as client:
            again = StreamInThread(client, "After the restart.", max_frames=4, seed=7)
            again.finish()
            _assert_fetched(client, worker, again)
    finally:
        worker.stop()


def test_eio_while_writing_costs_that_artifact_only(tmp_path):
    """EIO through the test-only setting (no real EIO source on this machine: see docs/operations.md)."""
    worker = ServedWorker(tmp_path, "--max-active-streams", "2", "--fault-eio-after-bytes", "40000").start()
    try:
        with BreezeClient(worker.target, timeout_s=300) as client:
            failing = StreamInThread(client, "Long enough to pass the fault.", max_frames=40, seed=8)
            fitting = StreamInThread(client, "Short.", max_frames=5, seed=9)  # 19 200 bytes: under it
            for run in (failing, fitting):
                run.finish()
                _assert_whole_stream(run, 2)
            assert failing.result.artifact is None
            assert "I/O error (EIO" in failing.result.artifact_unavailable
            _assert_fetched(client, worker, fitting)
            assert worker.metrics()['breeze_artifacts_unavailable_total{cause="io_error"}'] == 1
        assert worker.wait_logged("TEST-ONLY FAULT INJECTION IS ON (fault_eio_after_bytes=40000)")
        assert not list(tmp_path.glob(".art-*"))
    finally:
        worker.stop()
