"""A hostile but fair client against `breeze-worker serve` as a process, looked at from outside: its log lines,
what it reads of an unauthenticated body (counted by a TCP proxy), what it answers to malformed bodies,
and its metrics listener under raw-socket garbage."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from served_worker import ENV, ServedWorker, worker_command
from tcp_proxy import TcpProxy

from breeze_client.errors import InvalidArgument
from breeze_client.sdk import BreezeClient
from breeze_tts_proto.v1 import synthesis_pb2

TOKEN = "s3cret-token-for-the-tests"
FORGED = "evil\n2026-01-01 00:00:00,000 ERROR breeze_worker.serve forged record"
SYNTHESIZE = "/breeze.tts.v1.Synthesis/Synthesize"
STAT = "/breeze.tts.v1.Artifacts/Stat"
INVALID_UTF8_TEXT = b"\x0a\x04\xff\xfe\xfd\xfc"  # field 1 (text), length 4, bytes that are not UTF-8
BIG_BODY = 33_000_000


@pytest.fixture(scope="module")
def json_worker(tmp_path_factory):
    with ServedWorker(tmp_path_factory.mktemp("json-artifacts"), "--log-format", "json", "--token", TOKEN,
                      "--metrics-port", "0", "--metrics-host", "127.0.0.2") as worker:
        yield worker


@pytest.fixture(scope="module")
def text_worker(tmp_path_factory):
    with ServedWorker(tmp_path_factory.mktemp("text-artifacts")) as worker:
        yield worker


def _raw_call(target: str, method: str, body: bytes, token: str | None, streaming: bool = True):
    """Send `body` as the request message, byte for byte (no serializer): (code, details)."""
    options = [("grpc.max_send_message_length", 64 << 20)]
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    with grpc.insecure_channel(target, options=options) as channel:
        try:
            if streaming:
                list(channel.unary_stream(method)(body, metadata=metadata, timeout=60))
            else:
                channel.unary_unary(method)(body, metadata=metadata, timeout=60)
        except grpc.RpcError as err:
            return err.code(), err.details()
    return grpc.StatusCode.OK, ""


def _json_records(worker: ServedWorker) -> list[dict]:
    return [json.loads(line) for line in worker.stderr_lines()]  # every line must be one JSON object


def _wait_for(predicate, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.05)
    return predicate()


# ---- logs ----

def test_json_log_lines_carry_job_request_method_and_peer(json_worker):
    with BreezeClient(json_worker.target, token=TOKEN, timeout_s=60) as client:
        result = client.synthesize("Hello there.", max_frames=2, seed=1, request_id="req-json-1")
    job_id = result.job.job_id

    def queued():
        return [r for r in _json_records(json_worker) if r.get("request_id") == "req-json-1" and "queued" in
                r["message"]]
    (record,) = _wait_for(queued)
    assert record["job_id"] == job_id and record["method"] == SYNTHESIZE
    assert record["peer"].startswith("ipv4:127.0.0.1:") and record["level"] == "INFO"
    # the engine thread's line about the same job carries its job id too
    assert _wait_for(lambda: [r for r in _json_records(json_worker) if r.get("job_id") == job_id and
                              "committed" in r["message"]])


def test_a_request_id_cannot_forge_a_log_line_or_flood_the_log(json_worker):
    with BreezeClient(json_worker.target, token=TOKEN, timeout_s=60) as client:
        with pytest.raises(InvalidArgument, match="control character U\\+000A"):
            client.synthesize("Hello.", max_frames=2, request_id=FORGED)
        before = json_worker.stderr_bytes()
        with pytest.raises(InvalidArgument, match="more than the limit of 128"):
            client.synthesize("Hello.", max_frames=2, request_id="x" * (4 << 20))
        assert _wait_for(lambda: any("4,194,304 characters" in r["message"] for r in _json_records(json_worker)))
        grown = json_worker.stderr_bytes() - before
        assert grown < 8 * 1024, f"a 4 MB request id wrote {grown} bytes of log"
        # an id at the limit is fine
        assert client.synthesize("Hello.", max_frames=2, request_id="r" * 128).stats.frames >= 1
    records = _json_records(json_worker)  # still one JSON object per line: no line was forged
    (rejected,) = [r for r in records if r.get("request_id", "").startswith("evil")]
    assert rejected["request_id"] == FORGED.replace("\n", "\\n")
    assert not any(r["message"].startswith("2026-01-01") for r in records)


def test_text_log_lines_cannot_be_forged_either(text_worker):
    with BreezeClient(text_worker.target, timeout_s=60) as client:
        with pytest.raises(InvalidArgument):
            client.synthesize("Hello.", max_frames=2, request_id=FORGED)
        result = client.synthesize("Hello.", max_frames=2, seed=3, request_id="req-text-1")
    assert _wait_for(lambda: "request_id=evil\\n2026-01-01" in text_worker.stderr_text())
    assert _wait_for(lambda: f"job_id={result.job.job_id} request_id=req-text-1" in text_worker.stderr_text())
    record_start = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ ")
    for line in text_worker.stderr_lines():  # a record's first line, or an indented traceback line
        assert record_start.match(line) or line.startswith("    "), line
    assert not any(line.startswith("2026-01-01 00:00:00,000") for line in text_worker.stderr_lines())


# ---- authentication before parsing, malformed bodies ----

def test_an_unauthenticated_33_mb_body_is_refused_before_it_is_read(json_worker):
    garbage = os.urandom(1024) * (BIG_BODY // 1024)  # not even a protobuf message
    with TcpProxy(json_worker.target) as proxy:
        code, details = _raw_call(proxy.address, SYNTHESIZE, garbage, token=None)
        assert code is grpc.StatusCode.UNAUTHENTICATED and "missing bearer token" in details
        refused_bytes = proxy.bytes_to_target
    with TcpProxy(json_worker.target) as proxy:  # the control: with the token the worker reads it all
        code, details = _raw_call(proxy.address, SYNTHESIZE, garbage, token=TOKEN)
        assert code is grpc.StatusCode.INVALID_ARGUMENT and "not a valid protobuf message" in details
        accepted_bytes = proxy.bytes_to_target
    print(f"33 MB body: {refused_bytes:,} bytes reached the worker without a token, {accepted_bytes:,} with it")
    assert accepted_bytes >= BIG_BODY
    assert refused_bytes < BIG_BODY // 4  # HTTP/2 flow control's window, not the body
    # a wrong token on the artifact port is refused the same way; health needs no token
    assert _raw_call(json_worker.artifact_target, STAT, INVALID_UTF8_TEXT, token="wrong",
                     streaming=False)[0] is grpc.StatusCode.UNAUTHENTICATED
    for target in (json_worker.target, json_worker.artifact_target):
        with grpc.insecure_channel(target) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("method,streaming", [(SYNTHESIZE, True), (STAT, False)])
def test_a_malformed_body_is_invalid_argument_without_internals(json_worker, method, streaming):
    target = json_worker.target if method == SYNTHESIZE else json_worker.artifact_target
    code, details = _raw_call(target, method, INVALID_UTF8_TEXT, token=TOKEN, streaming=streaming)
    assert code is grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    assert "not a valid protobuf message" in details and "UTF-8" in details
    for internal in ("DecodeError", "Traceback", "Exception", "<class", "Unexpected"):
        assert internal not in details
    time.sleep(0.2)
    assert not any("exception" in r or "Traceback" in r["message"] for r in _json_records(json_worker))
    # a valid request still gets through
    ok = synthesis_pb2.SynthesizeRequest(text="Still here.", max_frames=2, seed=1).SerializeToString()
    assert _raw_call(json_worker.target, SYNTHESIZE, ok, token=TOKEN)[0] is grpc.StatusCode.OK


# ---- exposure ----

def test_a_non_loopback_listener_without_authentication_is_refused(tmp_path):
    proc = subprocess.run(worker_command("serve", "--host", "0.0.0.0", "--port", "0", "--artifact-port", "0",
                                         "--artifact-dir", str(tmp_path)),
                          capture_output=True, text=True, timeout=120, env={**ENV, "BREEZE_SERVER_AUTH_TOKEN": ""})
    assert proc.returncode == 2, proc.stderr
    assert "refusing to listen on 0.0.0.0 without authentication" in proc.stderr
    assert "--allow-insecure" in proc.stderr and "BREEZE_SERVER_AUTH_TOKEN" in proc.stderr


@pytest.mark.parametrize("args,warning", [
    (("--token", TOKEN), "with a bearer token but without TLS"),
    (("--allow-insecure",), "with NO authentication (--allow-insecure)"),
])
def test_an_exposed_listener_warns_about_what_it_leaves_open(tmp_path, args, warning):
    proc = subprocess.Popen(worker_command("serve", "--host", "0.0.0.0", "--port", "0", "--artifact-port", "0",
                                           "--artifact-dir", str(tmp_path), "--artifact-grace-s", "0", *args),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        seen = []
        for line in proc.stderr:
            seen.append(line)
            if "listening:" in line:
                break
        assert any("WARNING" in line and warning in line for line in seen + [proc.stderr.readline()]), seen
    finally:
        proc.terminate()
        proc.wait(60)


# ---- the metrics listener ----

def _exchange(port: int, data: bytes, host: str = "127.0.0.2") -> bytes:
    with socket.create_connection((host, port), timeout=10) as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except OSError:  # the worker may answer and close before it read everything
            pass
        reply = b""
        try:
            while chunk := s.recv(65536):
                reply += chunk
        except ConnectionResetError:
            pass
        return reply


def _scrape(host: str, port: int) -> str:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        return response.read().decode()


def test_metrics_listener_binds_the_configured_host_and_survives_garbage(json_worker):
    host, port = json_worker.metrics_host, json_worker.metrics_port
    assert host == "127.0.0.2" and port
    with pytest.raises(OSError):  # bound to --metrics-host only
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    assert "breeze_frames_total" in _scrape(host, port)

    long_line = _exchange(port, b"GET /" + b"a" * (70 * 1024) + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert long_line.startswith(b"HTTP/1.1 431 ")
    for size in (20_000, 200_000):  # random bytes: answered with a 4xx, or closed once they end
        reply = _exchange(port, b"\x16\x03\x01" + os.urandom(size))
        assert reply == b"" or reply.startswith(b"HTTP/1.1 4"), reply[:80]
    assert _exchange(port, b"\x00\xff garbage \r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert _exchange(port, b"GET /healthz HTTP/1.1\r\n" + b"X-Filler: y\r\n" * 5000 + b"\r\n").startswith(
        b"HTTP/1.1 431 ")
    half_open = [socket.create_connection((host, port), timeout=5) for _ in range(3)]
    half_open[0].sendall(b"GET /metr")  # a request that never ends; the others send nothing at all
    try:
        text = _scrape(host, port)  # answered while those connections hang
        assert "# TYPE breeze_active_streams gauge" in text and "breeze_jobs_total" in text
        assert _exchange(port, b"GET /healthz HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 200 ")
        assert _exchange(port, b"POST /metrics HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 405 ")
    finally:
        for s in half_open:
            s.close()
    assert "breeze_frames_total" in _scrape(host, port)
    assert not any("exception" in r or r["level"] == "ERROR" for r in _json_records(json_worker))
