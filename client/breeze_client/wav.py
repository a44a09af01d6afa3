"""A WAV file written while audio streams in: header reserved first, sizes filled in at `close`.

s16le becomes 16-bit PCM, f32le IEEE float (fmt with cbSize and a fact chunk), mono. The data chunk is
the PCM exactly as received.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from breeze_client.clock import now_ns


def wav_header(encoding: str, sample_rate: int, data_bytes: int) -> bytes:
    width = 2 if encoding == "s16le" else 4
    if encoding == "s16le":
        fmt, extra = struct.pack("<HHIIHH", 1, 1, sample_rate, sample_rate * width, width, 16), b""
    else:
        fmt = struct.pack("<HHIIHHH", 3, 1, sample_rate, sample_rate * width, width, 32, 0)
        extra = b"fact" + struct.pack("<II", 4, data_bytes // width)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + extra + b"data" + struct.pack("<I", data_bytes)
    return b"RIFF" + struct.pack("<I", len(body) + data_bytes) + body


class StreamingWavWriter:
    """Append PCM as it arrives; `close()` fixes the header and fsyncs, returning the time it finished (ns)."""

    def __init__(self, path: str | Path, encoding: str, sample_rate: int) -> None:
        self.path, self.encoding, self.sample_rate = Path(path), encoding, sample_rate
        self._file = open(self.path, "wb")
        self._file.write(wav_header(encoding, sample_rate, 0))
        self.data_bytes = 0

    def write(self, pcm: bytes) -> None:
        self._file.write(pcm)
        self._file.flush()  # readers (players) see audio as it arrives
        self.data_bytes += len(pcm)

    def close(self) -> int:
        if self._file.closed:
            return now_ns()
        self._file.seek(0)
        self._file.write(wav_header(self.encoding, self.sample_rate, self.data_bytes))
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        return now_ns()


def write_wav(path: str | Path, pcm: bytes, encoding: str, sample_rate: int) -> int:
    """Write a whole WAV at once; returns the time (ns) it was fsynced."""
    writer = StreamingWavWriter(path, encoding, sample_rate)
    writer.write(pcm)
    return writer.close()
