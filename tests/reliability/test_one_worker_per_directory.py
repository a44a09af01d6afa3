"""One worker per artifact directory, against real worker processes.

A second `breeze-worker serve` started on a directory a running worker holds, with the same ports and with
ports of its own, refuses at once, naming the directory and the holder's pid and ports, and touches nothing
there: the first worker's job, kept in flight throughout (the first worker is stopped from outside with
SIGSTOP while the others start, and continued after), commits its artifact whole, with the SHA-256 of the
audio it streamed. A worker killed with kill -9 leaves its lock file behind but not its lock: the next worker
takes the directory over, says whose it was, and sweeps what the dead one left."""

from __future__ import annotations

import hashlib
import signal
import subprocess
import threading
from pathlib import Path

import grpc
from served import ENV, ServedWorker

from breeze_client.sdk import BreezeClient
from breeze_tts_proto.v1 import synthesis_pb2, synthesis_pb2_grpc


class StockStream(threading.Thread):
    """A Synthesize call read to its end by a stock grpcio stub (no keepalive pings: a worker stopped with
    SIGSTOP is waited for, not declared dead)."""

    def __init__(self, target: str, text: str, max_frames: int) -> None:
        super().__init__(daemon=True)
        self.channel = grpc.insecure_channel(target)
        request = synthesis_pb2.SynthesizeRequest(text=text, max_frames=max_frames, seed=3,
                                                  sampling=synthesis_pb2.SamplingOverrides(temperature=0.0))
        self.call = synthesis_pb2_grpc.SynthesisStub(self.channel).Synthesize(request, timeout=600)
        self.started = threading.Event()
        self.artifact_id = ""
        self.audio = bytearray()
        self.finished: synthesis_pb2.JobFinished | None = None
        self.error: grpc.RpcError | None = None
        self.start()

    def run(self) -> None:
        try:
            for message in self.call:
                kind = message.WhichOneof("event")
                if kind == "started":
                    self.artifact_id = message.started.artifact_id
                elif kind == "chunk":
                    self.audio += message.chunk.pcm
                    self.started.set()
                elif kind == "finished":
                    self.finished = message.finished
        except grpc.RpcError as exc:
            self.error = exc
        finally:
            self.started.set()
            self.channel.close()


def _refused(worker: ServedWorker) -> str:
    """Run `worker`'s command line to its end; it must exit 1 at once. Returns its log."""
    done = subprocess.run(worker.command(), env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "breeze-worker ready" not in done.stdout
    return done.stderr


def _stop_mid_job(worker: ServedWorker, text: str) -> tuple[StockStream, Path]:
    """Start a job on `worker`, then stop the worker (SIGSTOP) while the job writes: (the job, its temp file)."""
    job = StockStream(worker.target, text, max_frames=200)
    assert job.started.wait(300) and job.error is None, job.error
    worker.signal(signal.SIGSTOP)  # the job is in flight for as long as its worker is stopped
    partial = worker.artifact_dir / f".{job.artifact_id}.partial"
    assert partial.exists(), "the job ended before its worker was stopped"
    return job, partial


def test_a_second_worker_on_the_directory_refuses_and_the_first_keeps_its_job(tmp_path):
    directory = tmp_path / "artifacts"
    first = ServedWorker(directory).start()
    try:
        job, partial = _stop_mid_job(first, "A job in flight while a second worker is started.")
        try:
            same_ports = ServedWorker(directory, port=first.port, artifact_port=first.artifact_port)
            own_ports = ServedWorker(directory)
            for second in (same_ports, own_ports):
                message = _refused(second)
                assert f"the artifact directory {directory} is in use by another worker" in message
                assert f"pid {first.proc.pid}" in message
                assert f"synthesis 127.0.0.1:{first.port}" in message
                assert f"artifacts 127.0.0.1:{first.artifact_port}" in message
                assert f"metrics 127.0.0.1:{first.metrics_port}" in message
                assert partial.exists()  # nothing of the first worker's was touched
        finally:
            first.signal(signal.SIGCONT)
        job.join(600)
        assert not job.is_alive() and job.error is None, job.error
        assert job.finished is not None and job.finished.HasField("artifact"), job.finished
        artifact = job.finished.artifact
        assert artifact.artifact_id == job.artifact_id
        with BreezeClient(first.target, timeout_s=120) as client:
            fetched = client.fetch(artifact.artifact_id, None, endpoint=first.artifact_target)
        assert fetched.verified and hashlib.sha256(fetched.data).hexdigest() == artifact.sha256
        assert fetched.data[44:] == bytes(job.audio)  # the artifact is the audio the job streamed
        assert not partial.exists()
    finally:
        first.stop()


def test_a_dead_workers_lock_is_taken_over_and_what_it_left_is_swept(tmp_path):
    directory = tmp_path / "artifacts"
    first = ServedWorker(directory).start()
    try:
        job, partial = _stop_mid_job(first, "A job cut off by kill -9.")  # surely mid-write when killed
        first.kill9()
        job.join(120)
        assert job.error is not None and job.error.code() == grpc.StatusCode.UNAVAILABLE
        assert f'"pid": {first.proc.pid}' in (directory / ".breeze-worker.lock").read_text()  # left, unlocked
        second = ServedWorker(directory, port=first.port, artifact_port=first.artifact_port).start()
        try:
            assert second.logged(f"the previous worker (pid {first.proc.pid} on host")
            assert second.logged("ended without releasing it; its lock is taken over")
            assert not partial.exists()  # swept: its worker is gone
            with BreezeClient(second.target, timeout_s=300) as client:
                result = client.synthesize("The directory serves again.", max_frames=8, seed=1)
            assert result.artifact is not None
        finally:
            second.stop()
        assert (directory / ".breeze-worker.lock").read_text() == ""  # a clean stop empties the record
    finally:
        first.stop()
