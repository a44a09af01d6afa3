"""The official API as its own examples call it: `curl -F` (a client we did not write, in another language) and
`requests` (multipart and urlencoded, as FastAPI's test client sends a form without files); the fields, defaults,
validation errors and headers of the official server; batch and health; and concurrency instead of its 409."""

from __future__ import annotations

import json
import subprocess
import threading
import time

import numpy as np
import pytest
import requests
from http_helpers import AUTH, TOKEN, reference_wav

from breeze_client.sdk import BreezeClient

TEXT = "Good morning, all."


def curl(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["curl", "-sS", *args], capture_output=True, timeout=timeout)


def artifact_pcm(served, artifact_id: str) -> bytes:
    with BreezeClient(served.target, token=TOKEN, timeout_s=120) as client:
        fetched = client.fetch(artifact_id)
    assert fetched.verified
    return fetched.data[44:]


def headers_of(dump: bytes) -> dict[str, str]:
    lines = dump.decode().split("\r\n")
    return {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if ":" in line)}


def test_curl_as_the_official_readme_streams_raw_pcm(served, tmp_path):
    out, head = tmp_path / "voice.pcm", tmp_path / "head.txt"
    result = curl("-X", "POST", served.url("/v1/audio/speech"), "-H", f"Authorization: Bearer {TOKEN}",
                  "-F", f"text={TEXT}", "-F", "seed=42", "-D", str(head), "--output", str(out))
    assert result.returncode == 0, result.stderr
    h = headers_of(head.read_bytes())
    assert head.read_bytes().startswith(b"HTTP/1.1 200")
    assert h["content-type"] == "audio/pcm" and h["x-sample-rate"] == "24000" and h["x-sample-format"] == "s16le"
    assert h["cache-control"] == "no-store" and h["transfer-encoding"] == "chunked"
    pcm = out.read_bytes()
    assert len(pcm) > 0 and pcm == artifact_pcm(served, h["x-artifact-id"])


def test_a_reference_upload_clones_and_the_defaults_are_the_official_ones(served, tmp_path):
    wav = tmp_path / "me.wav"
    reference_wav(wav)
    result = curl("-X", "POST", served.url("/v1/audio/speech"), "-H", f"Authorization: Bearer {TOKEN}",
                  "-F", f"ref_audio=@{wav}", "-F", "ref_text=The words of the reference.", "-F", f"text={TEXT}",
                  "-D", "-", "--output", str(tmp_path / "out.pcm"))
    assert result.returncode == 0, result.stderr
    job = headers_of(result.stdout)["x-job-id"]
    params = requests.get(served.url(f"/v1/jobs/{job}"), headers=AUTH, timeout=60).json()["params"]
    assert params["template"] == "clone" and params["seed"] == 42 and params["cfg_scale"] == 1.0
    assert params["reference_id"].startswith("ref-")


def test_requests_multipart_and_urlencoded_forms_give_the_same_audio(served):
    multipart = requests.post(served.url("/v1/audio/speech"), headers=AUTH, timeout=300,
                              files={"text": (None, TEXT), "seed": (None, "7")})
    urlencoded = requests.post(served.url("/v1/audio/speech"), headers=AUTH, timeout=300,
                               data={"text": TEXT, "seed": "7"})
    assert multipart.status_code == urlencoded.status_code == 200
    assert multipart.content == urlencoded.content and len(multipart.content) > 0


def form_error(served, data=None, files=None):
    reply = requests.post(served.url("/v1/audio/speech"), headers=AUTH, data=data, files=files, timeout=120)
    return reply.status_code, reply.json()["detail"]


def test_missing_and_unparsable_fields_are_fastapis_422(served):
    status, detail = form_error(served, data={"seed": "x", "cfg_scale": "1.0"})
    assert status == 422
    assert detail == [{"type": "missing", "loc": ["body", "text"], "msg": "Field required", "input": None},
                      {"type": "int_parsing", "loc": ["body", "seed"],
                       "msg": "Input should be a valid integer, unable to parse string as an integer", "input": "x"}]
    status, detail = form_error(served, data={"text": TEXT, "cfg_scale": "loud"})
    assert status == 422 and detail[0]["type"] == "float_parsing" and detail[0]["loc"] == ["body", "cfg_scale"]
    status, detail = form_error(served, data={"text": ""})  # an empty form value counts as absent
    assert status == 422 and detail[0]["type"] == "missing"


@pytest.mark.parametrize("data, files, message", [
    ({"text": TEXT, "cfg_scale": "0"}, None, "cfg_scale must be greater than 0."),
    ({"text": TEXT, "cfg_scale": "nan"}, None, "cfg_scale must be greater than 0."),
    ({"text": TEXT, "ref_text": "words"}, None, "ref_audio and ref_text must be provided together or both omitted."),
    ({"text": TEXT}, {"ref_audio": ("me.wav", b"RIFF", "audio/wav")},
     "ref_audio and ref_text must be provided together or both omitted."),
    ({"text": TEXT, "ref_text": "words"}, {"ref_audio": ("me.wav", b"", "audio/wav")}, "Reference audio is empty."),
])
def test_the_official_400s_word_for_word(served, data, files, message):
    assert form_error(served, data=data, files=files) == (400, message)


def test_the_engines_own_checks_answer_400_with_what_to_change(served):
    status, detail = form_error(served, data={"text": TEXT, "cfg_scale": "2"})
    assert status == 400 and "needs a negative prompt" in detail
    status, detail = form_error(served, data={"text": TEXT, "seed": "-1"})
    assert status == 400 and "seed must be an integer in [0, 2**63)" in detail
    status, detail = form_error(served, data={"text": TEXT, "ref_text": "words"},
                                files={"ref_audio": ("me.wav", b"RIFF-not-a-wav-file", "audio/wav")})
    assert status == 400 and "reference" in detail.lower()


def test_batch_answers_every_segment_in_order_with_its_artifact(served):
    texts = ["One small line.", "A second line, a little longer.", "Three."]
    reply = requests.post(served.url("/v1/audio/speech/batch"), headers=AUTH, timeout=600,
                          data={"texts": json.dumps(texts), "seed": "3", "max_new_tokens": "20"})
    assert reply.status_code == 200, reply.text
    h = reply.headers
    assert h["Content-Type"] == "application/octet-stream" and h["X-Sample-Format"] == "s16le"
    sizes = [int(n) for n in h["X-Segment-Bytes"].split(",")]
    artifacts = h["X-Artifact-Ids"].split(",")
    assert len(sizes) == len(artifacts) == len(h["X-Job-Ids"].split(",")) == 3
    assert sum(sizes) == len(reply.content) and all(s == 20 * 1920 * 2 for s in sizes)  # max_new_tokens frames
    at = 0
    for size, artifact in zip(sizes, artifacts, strict=True):
        assert reply.content[at:at + size] == artifact_pcm(served, artifact)
        at += size


@pytest.mark.parametrize("texts, message", [
    ("not json", "texts must be a JSON array of strings"),
    (json.dumps([]), "texts must be a non-empty JSON array."),
    (json.dumps(["hello", "  "]), "Every entry in texts must be a non-empty string."),
    (json.dumps(["hello", 3]), "Every entry in texts must be a non-empty string."),
    (json.dumps(["hello"] * 129), "texts has 129 entries; the limit is 128."),
])
def test_batch_validation_as_the_official_server(served, texts, message):
    reply = requests.post(served.url("/v1/audio/speech/batch"), headers=AUTH, data={"texts": texts}, timeout=60)
    assert reply.status_code == 400 and reply.json()["detail"].startswith(message)


def test_health_is_the_official_answer_without_a_token(served):
    reply = requests.get(served.url("/health"), timeout=60)
    assert reply.status_code == 200 and reply.json() == {"status": "ok", "sample_rate": 24000}


def test_two_requests_at_once_both_stream_no_409(served):
    """The official server answers a second concurrent request with 409; here both are jobs of one batched step."""
    replies: list[requests.Response] = []

    def post(seed: str) -> None:
        replies.append(requests.post(served.url("/v1/audio/speech"), headers=AUTH, timeout=300,
                                     data={"text": TEXT, "seed": seed}))

    threads = [threading.Thread(target=post, args=(str(s),)) for s in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.status_code for r in replies) == [200, 200]
    assert all(len(r.content) > 0 for r in replies)


def queued_requests(served) -> float:
    text = requests.get(served.metrics_url, timeout=60).text
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith("breeze_queued_requests ")))


def test_a_full_queue_answers_429_with_retry_after(served):
    """Two slots and a queue of one: two long streams run, a third waits in the queue, a fourth is refused."""
    long = {"input": " ".join(["A long passage that keeps its stream slot busy for a while."] * 4),
            "response_format": "pcm", "stream": True, "max_frames": 1200}
    holders = [requests.post(served.url("/v1/audio/speech"), headers=AUTH, json={**long, "seed": s}, stream=True,
                             timeout=300) for s in (1, 2)]
    try:
        assert [r.status_code for r in holders] == [200, 200]  # both started: both slots taken
        waiting = threading.Thread(target=lambda: holders.append(requests.post(
            served.url("/v1/audio/speech"), headers=AUTH, json={**long, "seed": 3}, stream=True, timeout=300)))
        waiting.start()
        deadline = time.monotonic() + 120
        while queued_requests(served) < 1:
            assert time.monotonic() < deadline, "the third request never queued"
            time.sleep(0.05)
        refused = requests.post(served.url("/v1/audio/speech"), headers=AUTH, json={**long, "seed": 4}, timeout=60)
        assert refused.status_code == 429 and refused.headers["Retry-After"] == "1"
        assert "queue" in refused.json()["error"]["message"]
    finally:
        for r in holders:
            r.close()  # hanging up cancels the running jobs; the queued one then starts and is hung up on too
        waiting.join(300)
        for r in holders:
            r.close()
    assert np.isfinite(queued_requests(served))
