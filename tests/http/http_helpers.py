"""What the HTTP face's tests share: the served worker's token and limits, and a reference WAV maker."""

from __future__ import annotations

import numpy as np
import soundfile

TOKEN = "http-face-token-0123"
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
