"""One served worker with its HTTP face for the tests of this directory (a subprocess, as a user starts it).

It has a token (every client sends it: the OpenAI SDK as its api_key), the FP32 reference copy for the page,
a voices directory with one voice, two stream slots and a queue of one (so a full queue is easy to reach),
small request and stream-buffer limits (so the oversized-upload and slow-reader tests stay small), and a
short read timeout (so the slow-client tests end soon).
"""

from __future__ import annotations

import numpy as np
import pytest
import soundfile
from served_http import ServedHttp

TOKEN = "http-face-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MAX_REQUEST_BYTES = 256 * 1024
MAX_STREAM_BUFFER_BYTES = 64 * 1024
READ_TIMEOUT_S = 5
VOICE = "narrator"


def reference_wav(path, seconds: float = 2.0, seed: int = 3) -> bytes:
    """A real 24 kHz s16 WAV file: a tone with a little noise (the tiny model takes any sound as a reference)."""
    t = np.arange(int(24000 * seconds)) / 24000
    rng = np.random.default_rng(seed)
    samples = 0.3 * np.sin(2 * np.pi * 220 * t) + 0.02 * rng.standard_normal(t.size)
    soundfile.write(path, samples.astype(np.float32), 24000, subtype="PCM_16")
    return path.read_bytes()


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
