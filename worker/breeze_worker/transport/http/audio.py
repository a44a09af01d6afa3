"""Response formats: the engine's s16le PCM as pcm, wav, flac, mp3 or opus, whole or as it is generated.

`pcm` is the engine's bytes as they are; `wav` is those bytes behind the artifacts' RIFF header (a streamed
one says "length unknown", 0xFFFFFFFF, as streaming WAV players expect). `flac`, `mp3` and `opus` (Ogg) are encoded by
libsndfile through soundfile, where the host's build has the encoder: each is probed once by encoding a
moment of silence, and a format the host lacks is a 400 that names the ones it has. aac has no encoder in
libsndfile.

libsndfile writes a file front to back and, at the end, goes back to fill in lengths and checksums (FLAC's
STREAMINFO, the MP3 header, WAV sizes). `Encoder` hands out each byte once it lies past what was already
handed out: a streamed file is the whole file less those late fill-ins, which these formats allow a stream
to lack (FLAC's "total samples: unknown", an MP3 without its length header); a whole file (`encode_whole`)
has them.
"""

from __future__ import annotations

import functools
import io

import numpy as np
import soundfile

from breeze_worker.artifacts.wav import wav_header
from breeze_worker.engine.types import PcmEncoding
from breeze_worker.transport.http.errors import HttpError

CONTENT_TYPES = {"pcm": "audio/pcm", "wav": "audio/wav", "flac": "audio/flac", "mp3": "audio/mpeg",
                 "opus": "audio/ogg; codecs=opus", "aac": "audio/aac"}
_SNDFILE = {"flac": ("FLAC", "PCM_16"), "mp3": ("MP3", "MPEG_LAYER_III"), "opus": ("OGG", "OPUS")}
UNKNOWN_SIZE = b"\xff\xff\xff\xff"


def streaming_wav_header(sample_rate: int) -> bytes:
    """The artifact's s16le header with both sizes "unknown" (0xFFFFFFFF): a WAV streamed before its length is
    known, as streaming WAV readers (browsers, ffmpeg, sox) take it."""
    header = wav_header(PcmEncoding.S16LE, sample_rate, 0)
    return header[:4] + UNKNOWN_SIZE + header[8:-4] + UNKNOWN_SIZE


class _Sink(io.RawIOBase):
    """The file libsndfile writes: every byte kept, and how many were already handed out."""

    def __init__(self) -> None:
        super().__init__()
        self.data = bytearray()
        self.pos = 0
        self.handed_out = 0

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:  # libsndfile reads nothing back when writing these formats
        return b""

    def write(self, b) -> int:
        data = bytes(b)
        end = self.pos + len(data)
        if end > len(self.data):
            self.data.extend(bytes(end - len(self.data)))
        self.data[self.pos:end] = data
        self.pos = end
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: len(self.data)}[whence]
        self.pos = base + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def take(self) -> bytes:
        new = bytes(self.data[self.handed_out:])
        self.handed_out = len(self.data)
        return new


class Encoder:
    """`feed(pcm)` -> the bytes of the file that are ready; `finish()` -> the rest. Mono s16le input."""

    def __init__(self, fmt: str, sample_rate: int) -> None:
        self.format, self.sample_rate = fmt, sample_rate
        self._started = False
        self._sink: _Sink | None = None
        self._file: soundfile.SoundFile | None = None
        if fmt in _SNDFILE:
            container, subtype = _SNDFILE[fmt]
            self._sink = _Sink()
            self._file = soundfile.SoundFile(self._sink, "w", sample_rate, 1, subtype, format=container)

    def feed(self, pcm: bytes) -> bytes:
        if self._file is None:
            head = b""
            if self.format == "wav" and not self._started:
                head = streaming_wav_header(self.sample_rate)
            self._started = True
            return head + pcm
        assert self._sink is not None  # made with the file
        if pcm:
            self._file.write(np.frombuffer(pcm, dtype="<i2"))
        return self._sink.take()

    def finish(self) -> bytes:
        if self._file is None:
            return self.feed(b"") if self.format == "wav" and not self._started else b""
        assert self._sink is not None
        self._file.close()
        return self._sink.take()


def encode_whole(fmt: str, pcm: bytes, sample_rate: int) -> bytes:
    """The complete file (lengths and checksums filled in) of `pcm`."""
    if fmt == "pcm":
        return pcm
    if fmt == "wav":
        return wav_header(PcmEncoding.S16LE, sample_rate, len(pcm)) + pcm
    container, subtype = _SNDFILE[fmt]
    sink = _Sink()
    with soundfile.SoundFile(sink, "w", sample_rate, 1, subtype, format=container) as out:
        out.write(np.frombuffer(pcm, dtype="<i2"))
    return bytes(sink.data)


@functools.cache
def _encodes(fmt: str) -> bool:
    """Whether this host's libsndfile writes `fmt` (tried once on 80 ms of silence at 24 kHz)."""
    if fmt not in _SNDFILE:
        return fmt in ("pcm", "wav")
    try:
        return len(encode_whole(fmt, bytes(2 * 1920), 24000)) > 0
    except (RuntimeError, TypeError, ValueError, soundfile.LibsndfileError):
        return False


def available() -> list[str]:
    return [fmt for fmt in CONTENT_TYPES if _encodes(fmt)]


def check_format(fmt: object, param: str = "response_format") -> str:
    """`fmt` if this host can produce it, else a 400 that says which formats it can."""
    if not isinstance(fmt, str) or fmt not in CONTENT_TYPES:
        raise HttpError(400, f"{param} must be one of {', '.join(CONTENT_TYPES)}, not {fmt!r}", param=param)
    if not _encodes(fmt):
        raise HttpError(400, f"{fmt} is not available on this worker: its audio library (libsndfile "
                             f"{soundfile.__libsndfile_version__}) has no {fmt} encoder; ask for one of "
                             f"{', '.join(available())}", param=param)
    return fmt
