"""The call interceptor on every kind of handler: undecodable bodies are INVALID_ARGUMENT (unary and streaming
requests alike), handlers that yield or write keep working, and the token check looks up no method."""

from __future__ import annotations

import grpc
import pytest
from fake_engine import FakeEngine
from grpc_health.v1 import health_pb2, health_pb2_grpc
from transport_helpers import TOKEN, worker_settings

from breeze_worker.artifacts.store import ArtifactStore
from breeze_worker.transport.server import create_server

NOT_UTF8 = b"\x0a\x02\xff\xfe"  # field 1 (a string in every request used here), two bytes that are not UTF-8


async def _raw(port: int, method: str, kind: str, body: bytes, token: str | None = None):
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            if kind == "unary":
                await channel.unary_unary(method)(body, metadata=metadata, timeout=10)
            elif kind == "server-stream":
                async for _ in channel.unary_stream(method)(body, metadata=metadata, timeout=10):
                    pass
            else:
                async for _ in channel.stream_stream(method)(iter([body]), metadata=metadata, timeout=10):
                    pass
        except grpc.aio.AioRpcError as err:
            return err.code(), err.details()
    return grpc.StatusCode.OK, ""


@pytest.mark.parametrize("method,kind", [
    ("/grpc.health.v1.Health/Check", "unary"),
    ("/grpc.health.v1.Health/Watch", "server-stream"),
    ("/breeze.tts.v1.Artifacts/Fetch", "server-stream"),
    ("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", "bidi"),
])
async def test_an_undecodable_body_is_invalid_argument_for_every_kind_of_call(fake_worker, method, kind):
    servers, _ = fake_worker
    port = servers.artifact_port
    code, details = await _raw(port, method, kind, NOT_UTF8)
    assert code is grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    assert method in details and "not a valid protobuf message" in details and "DecodeError" not in details


async def test_wrapped_handlers_still_answer(fake_worker):
    servers, _ = fake_worker
    async with grpc.aio.insecure_channel(f"127.0.0.1:{servers.synthesis_port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        watch = stub.Watch(health_pb2.HealthCheckRequest(service=""))  # an async-generator handler
        first = await watch.read()
        assert first.status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()


async def test_the_token_check_refuses_unknown_methods_too(tmp_path):
    settings = worker_settings(tmp_path, auth_token=TOKEN)
    store = ArtifactStore(settings.artifacts)
    servers = await create_server(settings, FakeEngine(store), store)
    try:
        port = servers.synthesis_port
        assert (await _raw(port, "/no.such.Service/Method", "unary", b""))[0] is grpc.StatusCode.UNAUTHENTICATED
        code, _ = await _raw(port, "/no.such.Service/Method", "unary", b"", token=TOKEN)
        assert code is grpc.StatusCode.UNIMPLEMENTED
        code, details = await _raw(port, "/grpc.health.v1.Health/Check", "unary", NOT_UTF8)  # health is open
        assert code is grpc.StatusCode.INVALID_ARGUMENT, details
    finally:
        await servers.stop(0)
