"""Bad input at the HTTP face, from outside the process: wrong content types, missing fields, oversized uploads,
unauthenticated bodies (refused from the head: curl's Expect: 100-continue means the body is never sent), a
client that trickles its request and one that stops reading the audio. After each, the worker still serves."""

from __future__ import annotations

import socket
import subprocess
import time

import pytest
import requests
from http_helpers import AUTH, MAX_REQUEST_BYTES, MAX_STREAM_BUFFER_BYTES, TOKEN

from breeze_client.errors import BreezeClientError
from breeze_client.sdk import BreezeClient

TEXT = "Still serving."


def still_serves(served) -> None:
    reply = requests.post(served.url("/v1/audio/speech"), headers=AUTH, data={"text": TEXT}, timeout=300)
    assert reply.status_code == 200 and len(reply.content) > 0


@pytest.mark.parametrize("content_type, body", [("text/plain", b"hello"), ("application/xml", b"<a/>"),
                                                ("", b"text=hello")])
def test_a_body_that_is_neither_a_form_nor_json_is_415(served, content_type, body):
    headers = dict(AUTH, **({"Content-Type": content_type} if content_type else {}))
    reply = requests.post(served.url("/v1/audio/speech"), headers=headers, data=body, timeout=60)
    assert reply.status_code == 415 and "multipart/form-data" in reply.json()["detail"]


def test_json_to_the_batch_route_is_415(served):
    reply = requests.post(served.url("/v1/audio/speech/batch"), headers=AUTH, json={"texts": ["a"]}, timeout=60)
    assert reply.status_code == 415


@pytest.mark.parametrize("body, status, message", [
    (b"{not json", 400, "not valid JSON"),
    (b"[1, 2]", 400, "must be a JSON object"),
    (b"{}", 400, "input is required"),
    (b'{"input": 5}', 400, "input must be the text to speak"),
    (b'{"input": "hi", "stream": "yes"}', 400, "stream must be true or false"),
])
def test_malformed_json_bodies_are_400_in_openais_shape(served, body, status, message):
    reply = requests.post(served.url("/v1/audio/speech"), headers=dict(AUTH, **{"Content-Type": "application/json"}),
                          data=body, timeout=60)
    assert reply.status_code == status and message in reply.json()["error"]["message"]


def test_a_multipart_body_that_does_not_parse_is_400(served):
    headers = dict(AUTH, **{"Content-Type": "multipart/form-data; boundary=xyz"})
    reply = requests.post(served.url("/v1/audio/speech"), headers=headers, data=b"--abc\r\ngarbage", timeout=60)
    assert reply.status_code in (400, 422)
    still_serves(served)


def curl_upload(served, path, *extra: str) -> tuple[int, int, str]:
    """(status, bytes curl uploaded, body) of a curl -F upload of `path` (curl sends Expect: 100-continue)."""
    result = subprocess.run(["curl", "-sS", "-X", "POST", served.url("/v1/audio/speech"), "-F", f"ref_audio=@{path}",
                             "-F", "ref_text=words", "-F", "text=hi", "-H", "Expect: 100-continue", *extra,
                             "-w", "\n%{http_code} %{size_upload}"], capture_output=True, text=True, timeout=120)
    body, _, tail = result.stdout.rpartition("\n")
    status, uploaded = tail.split()
    return int(status), int(uploaded), body


def test_an_oversized_upload_is_413_before_its_body_is_sent(served, tmp_path):
    big = tmp_path / "big.wav"
    big.write_bytes(b"\0" * (4 * MAX_REQUEST_BYTES))
    status, uploaded, body = curl_upload(served, big, "-H", f"Authorization: Bearer {TOKEN}")
    assert status == 413 and "--max-request-bytes" in body
    assert uploaded < MAX_REQUEST_BYTES  # refused from the head: the body was never sent
    still_serves(served)


def test_an_unauthenticated_upload_is_401_before_its_body_is_sent(served, tmp_path):
    big = tmp_path / "ref.wav"
    big.write_bytes(b"\0" * (MAX_REQUEST_BYTES // 2))
    for extra in ((), ("-H", "Authorization: Bearer wrong")):
        status, uploaded, body = curl_upload(served, big, *extra)
        assert status == 401 and "bearer token" in body and uploaded == 0


def test_a_chunked_body_over_the_limit_is_413_counted_as_it_arrives(served):
    def chunks():
        for _ in range(8):
            yield b'{"input": "' + b"a" * (MAX_REQUEST_BYTES // 4)
    headers = dict(AUTH, **{"Content-Type": "application/json"})
    try:
        reply = requests.post(served.url("/v1/audio/speech"), headers=headers, data=chunks(), timeout=60)
        assert reply.status_code == 413 and "counted as it arrived" in reply.json()["error"]["message"]
    except requests.ConnectionError:  # the worker closed the connection while more was being sent
        pass
    still_serves(served)


def raw_request(served, head: bytes, timeout_s: float = 120) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", served.port), timeout=timeout_s)
    sock.sendall(head)
    return sock


def read_all(sock: socket.socket) -> bytes:
    data = b""
    while True:
        try:
            part = sock.recv(65536)
        except ConnectionResetError:
            return data
        if not part:
            return data
        data += part


def test_a_client_that_trickles_its_body_gets_408_and_others_are_served_meanwhile(served):
    body = b'{"input": "hello there"}'
    head = (f"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    slow = raw_request(served, head + body[:3])
    still_serves(served)  # while the slow body is pending
    answer = read_all(slow)  # the worker answers and closes once --http-read-timeout-s has passed
    slow.close()
    assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive within" in answer


def test_a_client_that_never_finishes_its_head_is_disconnected(served):
    slow = raw_request(served, b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\n")
    still_serves(served)
    assert read_all(slow) == b""  # closed without an answer: the head never ended
    slow.close()


def test_a_client_that_stops_reading_loses_its_stream_and_the_job_keeps_its_artifact(served):
    """Past --max-stream-buffer-bytes of audio waiting for it, the response is cut off (a broken connection, never a
    clean end of a short file), and the job runs on: its artifact is committed and fetched over gRPC."""
    body = (b'{"input": "A reader that stops reading.", "response_format": "pcm", "stream": true, '
            b'"max_frames": 400, "seed": 8}')
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window: the worker's buffers fill
    sock.settimeout(120)
    sock.connect(("127.0.0.1", served.port))
    sock.sendall((f"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body)
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    artifact = next(line.split(b": ")[1].decode() for line in head.split(b"\r\n")
                    if line.lower().startswith(b"x-artifact-id"))
    assert 400 * 1920 * 2 > 4 * MAX_STREAM_BUFFER_BYTES  # the job makes far more than the bound
    with BreezeClient(served.target, token=TOKEN, timeout_s=120) as client:
        deadline = time.monotonic() + 600
        while True:  # the condition: the artifact exists (the job ran to its end without a reader)
            try:
                ref = client.stat(artifact)
                break
            except BreezeClientError:
                assert time.monotonic() < deadline, "the job's artifact was never committed"
                time.sleep(0.2)
        assert ref.size_bytes == 44 + 400 * 1920 * 2
    received = read_all(sock)  # what the worker had sent before it cut the stream
    sock.close()
    assert len(received) < 400 * 1920 * 2 and not received.endswith(b"0\r\n\r\n")  # never a clean chunked end
    still_serves(served)


def test_routes_other_than_health_and_the_page_need_the_token(served):
    for method, path in (("GET", "/v1/info"), ("GET", "/v1/jobs/job-x"), ("POST", "/v1/compare"),
                         ("POST", "/v1/audio/speech/batch")):
        reply = requests.request(method, served.url(path), timeout=60)
        assert reply.status_code == 401 and reply.headers["WWW-Authenticate"].startswith("Bearer")
    assert requests.get(served.url("/"), timeout=60).status_code == 200
    assert requests.get(served.url("/health"), timeout=60).status_code == 200


def test_token_guessing_over_http_uses_the_addresses_one_budget_with_the_grpc_ports(tmp_path):
    """An address that failed the token `--auth-max-failures` times over HTTP gets 429 (with Retry-After)
    whatever token it sends next, on HTTP and on the gRPC ports alike: one budget per address for both faces."""
    import grpc
    from served_http import ServedHttp

    with ServedHttp(tmp_path, "--token", TOKEN, "--auth-max-failures", "3", "--auth-failure-refill-s", "600") as w:
        wrong = {"Authorization": "Bearer not-the-token-at-all"}
        for _ in range(3):
            assert requests.post(w.url("/v1/audio/speech"), headers=wrong, data={"text": TEXT},
                                 timeout=60).status_code == 401
        reply = requests.post(w.url("/v1/audio/speech"), headers=AUTH, data={"text": TEXT}, timeout=60)
        assert reply.status_code == 429 and int(reply.headers["Retry-After"]) > 0
        assert "failed authentication" in reply.json()["detail"]
        assert requests.get(w.url("/health"), timeout=60).status_code == 200  # open routes stay open
        with BreezeClient(w.target, token=TOKEN, timeout_s=60) as client, pytest.raises(BreezeClientError) as err:
            client.worker_info()
        assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED.name
