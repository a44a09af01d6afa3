"""A client that stops reading cannot make the worker hold unbounded audio, nor lose its job's artifact: a
stock grpcio stub (HTTP/2 window not grown by BDP probing, so the worker's own buffer is what fills) reads the
start message, then stops. Past --max-stream-buffer-bytes the stream ends with RESOURCE_EXHAUSTED naming the
artifact; the job runs on and its artifact is whole: the audio received is its prefix. A client process
stopped from outside (SIGSTOP) while it streams takes nothing at all: after --reader-stall-s its stream ends
the same way, and its job commits its artifact while the client is still stopped."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from served import ENV, ServedWorker

from breeze_client.sdk import BreezeClient
from breeze_tts_proto.v1 import artifacts_pb2, artifacts_pb2_grpc, synthesis_pb2, synthesis_pb2_grpc

BOUND = 64 * 1024


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    served = ServedWorker(tmp_path_factory.mktemp("artifacts"), "--max-stream-buffer-bytes", str(BOUND),
                          "--reader-stall-s", "600", "--keepalive-timeout-s", "700").start()  # the bytes bound ends it
    yield served
    served.stop()


def _wait_for_artifact(worker: ServedWorker, artifact_id: str) -> artifacts_pb2.ArtifactInfo:
    """Stat the artifact until the job that runs on commits it."""
    artifacts = artifacts_pb2_grpc.ArtifactsStub(grpc.insecure_channel(worker.artifact_target))
    deadline = time.monotonic() + 300
    while True:
        try:
            return artifacts.Stat(artifacts_pb2.StatArtifactRequest(artifact_id=artifact_id), timeout=10)
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.NOT_FOUND and time.monotonic() < deadline
            time.sleep(0.2)


def test_a_client_that_stops_reading_gets_resource_exhausted_and_the_artifact_completes(worker):
    channel = grpc.insecure_channel(worker.target, options=[("grpc.http2.bdp_probe", 0)])
    stub = synthesis_pb2_grpc.SynthesisStub(channel)
    request = synthesis_pb2.SynthesizeRequest(text="A job whose caller stops reading.", max_frames=300, seed=1,
                                              sampling=synthesis_pb2.SamplingOverrides(temperature=0.0))
    call = stub.Synthesize(request, timeout=300)
    started = next(call).started
    artifact_id = started.artifact_id
    assert artifact_id.startswith("art-")
    assert worker.wait_logged("the client stopped reading", timeout_s=120)  # while this client reads nothing
    received = bytearray()
    with pytest.raises(grpc.RpcError) as ended:
        for message in call:  # what gRPC's own buffers held, then the status
            received += message.chunk.pcm
    assert ended.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "read the audio more slowly than it was generated" in ended.value.details()
    assert artifact_id in ended.value.details()
    channel.close()

    info = _wait_for_artifact(worker, artifact_id)  # the job runs on; its artifact appears once committed
    with BreezeClient(worker.target, timeout_s=120) as client:
        fetched = client.fetch(artifact_id, None, endpoint=worker.artifact_target)
    assert fetched.verified and fetched.size_bytes == info.size_bytes
    pcm = fetched.data[44:]
    assert len(received) < len(pcm) and pcm.startswith(bytes(received))
    assert worker.wait_logged("ended without a listener")
    metrics = worker.metrics()
    assert metrics.get('breeze_jobs_total{end_reason="cancelled"}', 0) == 0  # it was not cancelled


def test_a_client_that_reads_along_is_not_cut_off_by_the_bound(worker):
    with BreezeClient(worker.target, timeout_s=300) as client:
        result = client.synthesize("A caller that reads every chunk as it comes.", max_frames=300, seed=2,
                                   temperature=0.0)
    assert len(result.audio) > 4 * BOUND and result.artifact is not None


def test_a_client_process_stopped_mid_stream_loses_its_stream_not_its_artifact(tmp_path):
    worker = ServedWorker(tmp_path / "artifacts", "--reader-stall-s", "3").start()
    client = subprocess.Popen([sys.executable, str(Path(__file__).with_name("stalled_client.py")), worker.target,
                               "300"], stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        artifact_id = client.stdout.readline().strip()
        assert artifact_id.startswith("art-")
        client.send_signal(signal.SIGSTOP)  # it takes nothing more, not even from its socket
        assert worker.wait_logged("it took nothing for 3 s (the worker's --reader-stall-s)", timeout_s=300)
        info = _wait_for_artifact(worker, artifact_id)  # committed while its client is still stopped
        assert client.poll() is None
        client.send_signal(signal.SIGCONT)
        outcome = json.loads(client.stdout.readline())
        assert client.wait(60) == 0
        assert outcome["code"] == "RESOURCE_EXHAUSTED" and artifact_id in outcome["details"]
        with BreezeClient(worker.target, timeout_s=120) as sdk:
            fetched = sdk.fetch(artifact_id, None, endpoint=worker.artifact_target)
        assert fetched.verified and fetched.size_bytes == info.size_bytes
        received = bytes.fromhex(outcome["audio"])
        assert len(received) < len(fetched.data) - 44 and fetched.data[44:].startswith(received)
        assert worker.metrics().get('breeze_jobs_total{end_reason="cancelled"}', 0) == 0
    finally:
        if client.poll() is None:
            client.send_signal(signal.SIGCONT)
            client.kill()
        client.wait(30)
        worker.stop()
