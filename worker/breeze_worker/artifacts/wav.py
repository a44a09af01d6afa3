"""WAV headers for artifacts: 16-bit PCM for s16le, IEEE float for f32le, mono.

The data chunk holds the job's PCM exactly as it was streamed, so the header is the only part the
store writes itself. Its length depends only on the encoding, which lets the writer reserve it up
front and fill it in at commit, once the data size is known.
"""

from __future__ import annotations

import struct

from breeze_worker.engine.types import PcmEncoding

_FORMAT_PCM = 1
_FORMAT_IEEE_FLOAT = 3


def header_size(encoding: PcmEncoding) -> int:
    """Bytes before the first sample: 44 for PCM, 58 for float (fmt with cbSize + a fact chunk)."""
    return 44 if encoding is PcmEncoding.S16LE else 58


def wav_header(encoding: PcmEncoding, sample_rate: int, data_bytes: int) -> bytes:
    """The RIFF/WAVE header of a mono file whose data chunk is `data_bytes` long."""
    width = encoding.sample_width
    if data_bytes % width:
        raise ValueError(f"{data_bytes} PCM bytes is not a whole number of {width}-byte samples")
    block_align = width
    byte_rate = sample_rate * block_align
    if encoding is PcmEncoding.S16LE:
        fmt = struct.pack("<HHIIHH", _FORMAT_PCM, 1, sample_rate, byte_rate, block_align, 16)
        extra = b""
    else:
        fmt = struct.pack("<HHIIHHH", _FORMAT_IEEE_FLOAT, 1, sample_rate, byte_rate, block_align, 32, 0)
        extra = b"fact" + struct.pack("<II", 4, data_bytes // width)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + extra + b"data" + struct.pack("<I", data_bytes)
    # the RIFF size counts everything after its own 8 bytes
    header = b"RIFF" + struct.pack("<I", len(body) + data_bytes) + body
    assert len(header) == header_size(encoding)
    return header
