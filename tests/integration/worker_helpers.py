"""What the integration tests share besides their worker (tests/inprocess_worker.py): the request size
limit their workers take, the check that a worker still serves after a rejected request, and a reference
clip."""

from __future__ import annotations

import io

import numpy as np
import soundfile as sf

from breeze_client.sdk import BreezeClient

MAX_REQUEST_BYTES = 256 * 1024


def assert_still_serving(client: BreezeClient) -> None:
    """The worker answers health and runs a short job after a rejected request."""
    assert client.health() == "SERVING"
    result = client.synthesize("Still here.", max_frames=2, seed=1)
    assert result.stats.frames >= 1 and result.artifact is not None


def tone_wav(seconds: float) -> bytes:
    """A 220 Hz tone at 24 kHz as 16-bit WAV bytes: a reference clip with sound in every frame (not speech)."""
    t = np.arange(round(seconds * 24000)) / 24000
    buffer = io.BytesIO()
    sf.write(buffer, (0.4 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 24000, format="WAV")
    return buffer.getvalue()
