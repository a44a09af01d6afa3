"""One served worker with its HTTP face for the tests of this directory (a subprocess, as a user starts it).

It has a token (every client sends it: the OpenAI SDK as its api_key), the FP32 reference copy for the page,
a voices directory with one voice, two stream slots and a queue of one (so a full queue is easy to reach),
small request and stream-buffer limits (so the oversized-upload and slow-reader tests stay small), and a
short read timeout (so the slow-client tests end soon).
"""

from __future__ import annotations

import pytest
from http_helpers import MAX_REQUEST_BYTES, MAX_STREAM_BUFFER_BYTES, READ_TIMEOUT_S, TOKEN, VOICE, reference_wav
from served_http import ServedHttp


@pytest.fixture(scope="session")
def voices_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("voices")
    reference_wav(directory / f"{VOICE}.wav")
    (directory / f"{VOICE}.txt").write_text("A short line read for the reference.\n")
    return directory


@pytest.fixture(scope="session")
def served(tmp_path_factory, voices_dir):
    args = ["--token", TOKEN, "--max-request-bytes", str(MAX_REQUEST_BYTES), "--max-active-streams", "2",
            "--max-queue", "1", "--http-read-timeout-s", str(READ_TIMEOUT_S), "--http-reference-fp32",
            "--http-voices-dir", str(voices_dir), "--metrics-port", "0",
            "--max-stream-buffer-bytes", str(MAX_STREAM_BUFFER_BYTES)]
    with ServedHttp(tmp_path_factory.mktemp("artifacts"), *args) as worker:
        yield worker
