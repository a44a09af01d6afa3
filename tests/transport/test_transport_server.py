"""The servers around an engine double: health, reflection, auth, TLS, cancellation, INTERNAL mapping."""

from __future__ import annotations

import asyncio
import logging
import subprocess

import grpc
import pytest
from fake_engine import FakeEngine
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from host_tools import need_tool
from transport_helpers import TOKEN, worker_settings

from breeze_client.aio import AsyncBreezeClient
from breeze_client.errors import Internal, InvalidArgument, Unauthenticated
from breeze_tts_proto.v1 import synthesis_pb2, synthesis_pb2_grpc
from breeze_worker.artifacts.dirlock import LOCK_NAME
from breeze_worker.artifacts.store import ArtifactStore
from breeze_worker.transport.server import create_server

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def _health(port: int, service: str) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        reply = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service))
        return reply.status


async def test_health_is_not_serving_until_the_engine_is_ready(tmp_path):
    settings = worker_settings(tmp_path)
    store = ArtifactStore(settings.artifacts)
    engine = FakeEngine(store, ready=False)
    servers = await create_server(settings, engine, store)
    try:
        for port in (servers.synthesis_port, servers.artifact_port):
            assert await _health(port, "") == NOT_SERVING
        assert await _health(servers.synthesis_port, "breeze.tts.v1.Synthesis") == NOT_SERVING
        assert await _health(servers.artifact_port, "breeze.tts.v1.Artifacts") == SERVING
        await engine.start()
        await servers.set_serving(True)
        for port in (servers.synthesis_port, servers.artifact_port):
            assert await _health(port, "") == SERVING
    finally:
        await servers.stop(0)


async def test_reflection_lists_the_services_on_both_ports(fake_worker):
    servers, _ = fake_worker
    for port, expected in ((servers.synthesis_port, "breeze.tts.v1.Synthesis"),
                           (servers.artifact_port, "breeze.tts.v1.Artifacts")):
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            call = reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
            names = set()
            async for reply in call:
                names |= {s.name for s in reply.list_services_response.service}
        assert {expected, "breeze.tts.v1.Clock", "grpc.health.v1.Health"} <= names


async def test_bearer_token_is_required_except_for_health(tmp_path):
    settings = worker_settings(tmp_path, auth_token=TOKEN)
    store = ArtifactStore(settings.artifacts)
    servers = await create_server(settings, FakeEngine(store), store)
    target = f"127.0.0.1:{servers.synthesis_port}"
    try:
        assert await _health(servers.synthesis_port, "") == SERVING
        for token, word in ((None, "missing"), ("wrong", "wrong")):
            async with AsyncBreezeClient(target, token=token) as client:
                with pytest.raises(Unauthenticated, match=word):
                    await client.worker_info()
                with pytest.raises(Unauthenticated):
                    await client.synthesize("hello")
        async with AsyncBreezeClient(target, token=TOKEN) as client:
            result = await client.synthesize("hello")
            fetched = await client.fetch(result.artifact)
            assert fetched.verified and fetched.data.endswith(result.audio)
    finally:
        await servers.stop(0)


async def test_tls_on_both_ports(tmp_path):
    need_tool("openssl")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    settings = worker_settings(tmp_path, tls_cert=cert, tls_key=key)
    store = ArtifactStore(settings.artifacts)
    servers = await create_server(settings, FakeEngine(store), store)
    try:
        async with AsyncBreezeClient(f"localhost:{servers.synthesis_port}", tls_ca=cert,
                                     artifact_target=f"localhost:{servers.artifact_port}") as client:
            result = await client.synthesize("over TLS")
            fetched = await client.fetch(result.artifact)
            assert fetched.verified and fetched.data.endswith(result.audio)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{servers.synthesis_port}") as ch:  # plaintext is refused
            with pytest.raises(grpc.aio.AioRpcError):
                await synthesis_pb2_grpc.SynthesisStub(ch).GetWorkerInfo(synthesis_pb2.GetWorkerInfoRequest(),
                                                                         timeout=2)
    finally:
        await servers.stop(0)


async def test_cancelling_the_call_cancels_the_engine_job(fake_worker):
    servers, engine = fake_worker
    engine.frames = 1000  # ~10 s at 10 ms per frame
    async with AsyncBreezeClient(f"127.0.0.1:{servers.synthesis_port}") as client:
        stream = await client.stream("a long text")
        async for chunk in stream:
            if chunk.sequence == 2:
                stream.cancel()
                break
        for _ in range(100):
            if engine.cancelled:
                break
            await asyncio.sleep(0.02)
        assert engine.cancelled == [stream.job.job_id] and engine.active == 0 and not engine.finished
        assert [p.name for p in servers.store.directory.iterdir()] == [LOCK_NAME]  # the unfinished artifact is gone
        result = await client.synthesize("the next job", max_frames=3)  # the worker keeps serving
        assert result.stats.frames == 3


async def test_engine_errors_keep_their_status_and_surprises_become_internal(fake_worker, caplog):
    servers, _ = fake_worker
    async with AsyncBreezeClient(f"127.0.0.1:{servers.synthesis_port}") as client:
        with pytest.raises(InvalidArgument, match="cfg_scale must be > 0"):
            await client.synthesize("hello", cfg_scale=-1.0)
        with caplog.at_level(logging.ERROR):
            with pytest.raises(Internal, match="worker log") as info:
                await client.synthesize("boom")
        assert "unexpected bug" not in str(info.value)
        assert any(r.exc_info and "unexpected bug" in str(r.exc_info[1]) for r in caplog.records)
        assert (await client.synthesize("still serving", max_frames=2)).stats.frames == 2


async def test_fault_first_byte_delay_shows_between_file_opened_and_first_byte(tmp_path):
    from dataclasses import replace

    settings = worker_settings(tmp_path)
    settings = replace(settings, artifacts=replace(settings.artifacts, fault_first_byte_delay_s=0.3))
    store = ArtifactStore(settings.artifacts)
    servers = await create_server(settings, FakeEngine(store), store)
    try:
        async with AsyncBreezeClient(f"127.0.0.1:{servers.synthesis_port}") as client:
            result = await client.synthesize("slow first byte")
            t = (await client.fetch(result.artifact)).timing
        assert t.server_first_byte_sent_ns - t.server_file_opened_ns >= 0.3e9
        assert t.first_byte_received_ns - t.request_sent_ns >= 0.3e9
        assert t.server_file_opened_ns - t.server_request_received_ns < 0.3e9
    finally:
        await servers.stop(0)
