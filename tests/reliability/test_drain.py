"""SIGTERM drains in order, against a real worker process and a real signal: NOT_SERVING and new synthesis
refused (UNAVAILABLE, queued requests too; the SDK's health-checked channel does not send it new jobs at
all), running jobs finish within --grace-s, the artifact port serves --artifact-grace-s longer so the
finished job can be fetched, then the worker exits 0."""

from __future__ import annotations

import signal
import time

import grpc
import pytest
from served import ServedWorker
from streams import StreamInThread

from breeze_client.errors import Unavailable
from breeze_client.sdk import BreezeClient
from breeze_tts_proto.v1 import synthesis_pb2, synthesis_pb2_grpc


def _wait(predicate, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def _health(client: BreezeClient) -> str:
    try:
        return client.health()
    except Unavailable:
        return "UNAVAILABLE"


def test_sigterm_finishes_running_jobs_and_keeps_their_artifacts_fetchable(tmp_path):
    worker = ServedWorker(tmp_path, "--max-active-streams", "1", "--grace-s", "120", "--artifact-grace-s",
                          "6").start()
    try:
        with BreezeClient(worker.target, timeout_s=120) as client:
            running = StreamInThread(client, "A job that is running when the signal comes.", max_frames=150,
                                     seed=1, temperature=0.0)
            running.wait_for(2)
            # the worker's own answers, as a client without retries or health checking sees them
            plain = grpc.insecure_channel(worker.target)
            stub = synthesis_pb2_grpc.SynthesisStub(plain)
            raw_queued = stub.Synthesize(synthesis_pb2.SynthesizeRequest(text="Waiting for a slot.", max_frames=4),
                                         timeout=60)
            queued = StreamInThread(client, "A job still waiting for a slot.", max_frames=4, seed=2)
            _wait(lambda: worker.metrics()["breeze_queued_requests"] == 2)
            worker.signal(signal.SIGTERM)
            _wait(lambda: _health(client) == "NOT_SERVING")
            with pytest.raises(grpc.RpcError) as refused:
                for _ in stub.Synthesize(synthesis_pb2.SynthesizeRequest(text="Too late.", max_frames=2), timeout=30):
                    pass
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "shutting down; retry on another worker" in refused.value.details()
            with pytest.raises(grpc.RpcError) as ended:
                for _ in raw_queued:
                    pass
            assert ended.value.code() == grpc.StatusCode.UNAVAILABLE and "had not started" in ended.value.details()
            plain.close()
            # the SDK watches the worker's health: it does not send it new jobs, and its retry of the queued job
            # (refused before JobStarted) finds no other worker: both end UNAVAILABLE, within their deadline
            with pytest.raises(Unavailable, match="every worker the target resolves to reports NOT_SERVING"):
                client.synthesize("Too late.", max_frames=2)
            queued.finish()
            assert queued.error is not None and queued.error.code == "UNAVAILABLE"
            assert "reports NOT_SERVING" in queued.error.message

            result = running.finish()
            assert running.error is None and result.artifact is not None  # it ran to its end
            assert len(running.audio) == result.stats.frames * 1920 * 2
            assert worker.proc.poll() is None  # the artifact port still serves
            fetched = client.fetch(result.artifact, None, endpoint=worker.artifact_target, max_resumes=0)
            assert fetched.verified and fetched.data[44:] == bytes(running.audio)
            assert client.health(target=worker.artifact_target) == "NOT_SERVING"  # the overall status
            assert worker.wait(60) == 0
            with pytest.raises(Unavailable):  # the artifact port closed at the end of the artifact grace
                client.fetch(result.artifact, None, endpoint=worker.artifact_target, max_resumes=0,
                             timeout_s=5)
    finally:
        worker.stop()
    order = ["running jobs get 120.0 s to finish", "the artifact port serves 6.0 s more", "stopped"]
    positions = [next(i for i, line in enumerate(worker.log) if text in line) for text in order]
    assert positions == sorted(positions), worker.log[-20:]


def test_a_job_longer_than_the_grace_ends_unavailable_and_leaves_no_temp_file(tmp_path):
    worker = ServedWorker(tmp_path, "--grace-s", "1", "--artifact-grace-s", "0").start()
    try:
        with BreezeClient(worker.target, timeout_s=120) as client:
            run = StreamInThread(client, "Far too long to finish in a second.", max_frames=1500, seed=3,
                                 temperature=0.0)
            run.wait_for(2)
            worker.signal(signal.SIGTERM)
            run.finish()
            assert run.error is not None and run.error.code == "UNAVAILABLE"
            assert "shut down before this job finished" in run.error.message
            assert worker.wait(60) == 0
    finally:
        worker.stop()
    assert worker.wait_logged("still running after --grace-s 1.0 s end now with UNAVAILABLE")
    assert not list(tmp_path.glob(".art-*")) and not list(tmp_path.glob("art-*"))


def test_active_streams_returns_to_zero_when_the_worker_is_idle(tmp_path):
    worker = ServedWorker(tmp_path, "--max-active-streams", "2").start()
    try:
        with BreezeClient(worker.target, timeout_s=120) as client:
            first = StreamInThread(client, "One.", max_frames=8, seed=4)
            second = StreamInThread(client, "Two.", max_frames=12, seed=5)
            cancelled = StreamInThread(client, "Three, abandoned.", max_frames=400, seed=6, temperature=0.0)
            cancelled.wait_for(2)
            assert worker.metrics()["breeze_active_streams"] >= 1
            cancelled.stream.cancel()
            first.finish(), second.finish(), cancelled.finish()
            assert first.result.artifact and second.result.artifact
        _wait(lambda: worker.metrics()["breeze_active_streams"] == 0, timeout_s=10)
        metrics = worker.metrics()
        assert metrics["breeze_queued_requests"] == 0
        assert metrics['breeze_jobs_total{end_reason="cancelled"}'] == 1
    finally:
        worker.stop()


def test_the_worker_reports_what_its_own_process_costs(tmp_path):
    """The figures that say whether the Python/gRPC side ever limits a stream, read over HTTP: the event
    loop's timer lag, the engine thread's busy and idle time, the messages written and the process's CPU."""
    worker = ServedWorker(tmp_path).start()
    try:
        before = worker.metrics()
        with BreezeClient(worker.target, timeout_s=120) as client:
            result = client.synthesize("Counting messages.", max_frames=5, seed=2)
            time.sleep(0.3)  # a few lag samples and an idle stretch after the job
            # the client ends a job at its final message, which the worker counts once its write returns; the
            # channel stays open until then (closing it would cancel the call and that last write with it)
            want = before.get("breeze_stream_messages_total", 0.0) + result.stats.frames + 2
            deadline = time.monotonic() + 60  # a hang guard only
            while (after := worker.metrics())["breeze_stream_messages_total"] < want and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        worker.stop()
    sent = after["breeze_stream_messages_total"] - before.get("breeze_stream_messages_total", 0.0)
    assert sent == result.stats.frames + 2  # JobStarted, one chunk per frame, JobFinished
    assert after["breeze_event_loop_lag_seconds_count"] > before.get("breeze_event_loop_lag_seconds_count", 0)
    assert after["breeze_engine_busy_seconds_total"] > before.get("breeze_engine_busy_seconds_total", 0.0)
    assert after["breeze_engine_idle_seconds_total"] > before.get("breeze_engine_idle_seconds_total", 0.0)
    assert after["process_cpu_seconds_total"] >= before["process_cpu_seconds_total"] > 0
