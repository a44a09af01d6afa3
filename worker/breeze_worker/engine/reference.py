"""Reference audio intake for voice cloning: decode, check, convert to 24 kHz mono, encode, cache.

`decode_reference_audio(bytes, max_seconds, min_seconds)` accepts WAV, FLAC or OGG (Vorbis/Opus) at 8-192 kHz,
mono or stereo (averaged to mono), as 8-32 bit integers or floats, and returns 24 kHz float32 samples. Every
refusal is an `InvalidRequest` whose message says what to change.

Decoding is bounded before it starts: `read_reference_header` checks the container's header (format,
channels, sample rate, duration) without decoding, and the decode reads at most the frames that duration
limit allows, whatever the header claimed. The engine runs the header check before a request queues for a
slot, and the decode only once the request holds one.

Silence is judged on 20 ms frames with each frame's mean removed (so a DC offset is not sound): a clip
counts as speech only when at least `MIN_ACTIVE_SHARE` of its frames are above -60 dBFS RMS, so one click
in a silent file is refused too. Stereo whose channels cancel when averaged gets its own message.

`ReferenceStore` encodes a reference once: its codes are cached under a content hash of (audio bytes,
transcript), which is also the reference id (`ref-` + 32 hex digits) later requests can name instead of
re-sending the audio. The store is thread-safe; two concurrent intakes of the same reference encode once.
"""

from __future__ import annotations

import hashlib
import io
import logging
import re
import threading
from collections import OrderedDict
from concurrent.futures import Future

import numpy as np

from breeze_worker.engine.types import ResolvedReference
from breeze_worker.errors import InvalidRequest, NotFound
from breeze_worker.model.codec.codec import Codec
from breeze_worker.model.codec.resample import resample

log = logging.getLogger(__name__)

TARGET_RATE = 24000
SUPPORTED_FORMATS = {"WAV": "WAV", "WAVEX": "WAV", "RF64": "WAV", "FLAC": "FLAC", "OGG": "OGG"}
ACTIVE_RMS = 10 ** (-60 / 20)  # a 20 ms frame (its mean removed) above -60 dBFS RMS holds sound
ACTIVE_FRAME_SECONDS = 0.02
MIN_ACTIVE_SHARE = 0.1  # a reference needs at least this share of its 20 ms frames to hold sound
MIN_REFERENCE_SECONDS = 1.0
MAX_REFERENCE_CHANNELS = 2
MIN_REFERENCE_RATE, MAX_REFERENCE_RATE = 8000, 192000
_OBJECT_REPR = re.compile(r"<[^<>]* at 0x[0-9a-fA-F]+>:?\s*")
REFERENCE_ID = re.compile(r"^ref-[0-9a-f]{32}$")


def reference_id(audio: bytes, transcript: str) -> str:
    """The content hash of (audio bytes, transcript): equal inputs give equal ids."""
    digest = hashlib.sha256()
    digest.update(len(audio).to_bytes(8, "little"))
    digest.update(audio)
    digest.update(transcript.encode("utf-8"))
    return "ref-" + digest.hexdigest()[:32]


def read_reference_header(audio: bytes, max_seconds: float):
    """The container header of reference audio (soundfile's info), refused unless decoding it is bounded:
    a supported format, mono or stereo, 8-192 kHz, a known length within `max_seconds`. Decodes nothing."""
    import soundfile  # here, not at module import: the engine imports on hosts without libsndfile

    if not audio:
        raise InvalidRequest("reference audio is empty: send a WAV, FLAC or OGG file with a few seconds of speech")
    try:
        info = soundfile.info(io.BytesIO(audio))
    except Exception as exc:  # libsndfile reports unknown or corrupt data as several error types
        raise InvalidRequest(
            "reference audio could not be decoded: send a WAV, FLAC or OGG file "
            f"(8-32 bit integer or float samples) ({_reason(exc)})"
        ) from exc
    if info.format not in SUPPORTED_FORMATS:
        raise InvalidRequest(
            f"reference audio format {info.format_info or info.format} is not supported: convert it to WAV, FLAC or OGG"
        )
    if info.frames <= 0 or info.samplerate <= 0:
        raise InvalidRequest("reference audio has no samples: send a recording with a few seconds of speech")
    if not 1 <= info.channels <= MAX_REFERENCE_CHANNELS:
        raise InvalidRequest(f"reference audio has {info.channels} channels; at most {MAX_REFERENCE_CHANNELS} are "
                             "accepted: mix it down to mono")
    if not MIN_REFERENCE_RATE <= info.samplerate <= MAX_REFERENCE_RATE:
        raise InvalidRequest(f"reference audio's sample rate is {info.samplerate} Hz; {MIN_REFERENCE_RATE}-"
                             f"{MAX_REFERENCE_RATE} Hz is accepted: resample it (24000 Hz is what the model uses)")
    seconds = info.frames / info.samplerate
    if seconds > max_seconds:
        raise _too_long(seconds, max_seconds)
    return info


def decode_reference_audio(audio: bytes, max_seconds: float,
                           min_seconds: float = MIN_REFERENCE_SECONDS) -> tuple[np.ndarray, float]:
    """Audio file bytes -> (float32 mono samples at 24 kHz, duration in seconds of the original)."""
    import soundfile

    info = read_reference_header(audio, max_seconds)
    most = int(max_seconds * info.samplerate) + 1  # one frame past the limit tells "too long" apart
    try:
        samples, rate = soundfile.read(io.BytesIO(audio), frames=most, dtype="float32", always_2d=True)
    except Exception as exc:
        raise InvalidRequest(
            f"reference audio could not be decoded ({_reason(exc)}): re-export it as 16-bit PCM WAV or FLAC"
        ) from exc
    if samples.shape[0] == 0:
        raise InvalidRequest("reference audio has no samples: send a recording with a few seconds of speech")
    seconds = samples.shape[0] / rate  # the decoded length; the header's may be approximate (OGG)
    if seconds > max_seconds:
        raise _too_long(seconds, max_seconds)
    if not np.isfinite(samples).all():
        raise InvalidRequest("reference audio contains NaN or infinite samples: re-export it as PCM WAV or FLAC")
    if seconds < min_seconds:
        raise InvalidRequest(
            f"reference audio is too short ({seconds:.2f} s, or a truncated file): "
            f"send at least {min_seconds:g} s of speech"
        )
    mono = np.mean(samples.T, axis=0)  # float32, channels summed in librosa.to_mono's order
    share = active_share(mono, rate)
    if share < MIN_ACTIVE_SHARE:
        channels = [active_share(samples[:, c], rate) for c in range(samples.shape[1])]
        if samples.shape[1] > 1 and max(channels) >= MIN_ACTIVE_SHARE:
            raise InvalidRequest(
                "reference audio's channels cancel each other when mixed to mono (one is the other with its "
                "polarity inverted): send a single channel, or fix the polarity"
            )
        raise InvalidRequest(
            f"reference audio is silent: only {100 * share:.0f}% of it is above -60 dBFS (a DC offset or a "
            f"click is not sound; at least {100 * MIN_ACTIVE_SHARE:.0f}% is needed): "
            "send a recording of the speaker's voice"
        )
    return resample(mono, rate, TARGET_RATE), seconds


def active_share(samples: np.ndarray, rate: int) -> float:
    """The share of 20 ms frames whose RMS around their own mean is above -60 dBFS (0 for no frame)."""
    size = max(1, int(round(rate * ACTIVE_FRAME_SECONDS)))
    count = len(samples) // size
    if count == 0:
        return 0.0
    frames = np.asarray(samples[: count * size], dtype=np.float64).reshape(count, size)
    return float((frames.std(axis=1) > ACTIVE_RMS).mean())


def _too_long(seconds: float, max_seconds: float) -> InvalidRequest:
    return InvalidRequest(
        f"reference audio is {seconds:.1f} s long; the limit is {max_seconds:g} s: "
        f"trim it to at most {max_seconds:g} s of speech"
    )


def _reason(exc: Exception) -> str:
    """libsndfile's reason without the Python object it names; the full text goes to the log."""
    log.info("reference audio rejected by libsndfile: %s", exc)
    text = getattr(exc, "error_string", None) or _OBJECT_REPR.sub("", str(exc))
    text = " ".join(text.split()) or type(exc).__name__
    return text if len(text) <= 160 else text[:157] + "..."


class ReferenceStore:
    """Encoded references by content hash, least recently used evicted beyond `max_entries`."""

    def __init__(self, codec: Codec, max_entries: int = 64, max_seconds: float = 30.0,
                 min_seconds: float = MIN_REFERENCE_SECONDS):
        if max_entries < 1 or max_seconds <= 0 or not 0 <= min_seconds <= max_seconds:
            raise ValueError("max_entries must be >= 1, max_seconds > 0 and 0 <= min_seconds <= max_seconds")
        self.codec = codec
        self.max_entries = max_entries
        self.max_seconds = max_seconds
        self.min_seconds = min_seconds
        self._entries: OrderedDict[str, ResolvedReference] = OrderedDict()
        self._in_flight: dict[str, Future[ResolvedReference]] = {}
        self._lock = threading.Lock()
        self._encode_lock = threading.Lock()  # one encode at a time on the codec
        self.encodes = 0  # how many references were actually encoded (cache misses)
        self.decodes = 0  # how many decodes started (each one after its header was checked)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def intake(self, audio: bytes, transcript: str) -> ResolvedReference:
        """Decode, check, encode and cache a reference; a repeated (audio, transcript) is served from cache."""
        audio = bytes(audio)
        transcript = transcript if transcript and transcript.strip() else ""  # kept exactly as sent; blank -> rejected
        if not transcript:
            raise InvalidRequest(
                "reference transcript is empty: send the exact words spoken in the reference audio"
            )
        key = reference_id(audio, transcript)
        with self._lock:
            cached = self._entries.get(key)
            if cached is not None:
                self._entries.move_to_end(key)
                return cached
            pending = self._in_flight.get(key)
            owner = pending is None
            if pending is None:
                pending = self._in_flight[key] = Future()
        if not owner:
            return pending.result()  # another thread is encoding this very reference
        try:
            reference = self._encode(key, audio, transcript)
        except BaseException as exc:
            with self._lock:
                del self._in_flight[key]
            pending.set_exception(exc)
            raise
        with self._lock:
            del self._in_flight[key]
            self._entries[key] = reference
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        pending.set_result(reference)
        return reference

    def cached(self, audio: bytes, transcript: str) -> ResolvedReference | None:
        """The reference already held for exactly this (audio, transcript), or None (nothing is decoded)."""
        key = reference_id(bytes(audio), transcript)
        with self._lock:
            reference = self._entries.get(key)
            if reference is not None:
                self._entries.move_to_end(key)
            return reference

    def get(self, reference_id: str) -> ResolvedReference:
        """The reference held under `reference_id` (as returned by an earlier intake)."""
        if not isinstance(reference_id, str) or not REFERENCE_ID.match(reference_id):
            raise InvalidRequest(
                f"reference id {reference_id!r} is malformed: expected 'ref-' followed by 32 lowercase hex "
                "digits, as returned by an earlier request"
            )
        with self._lock:
            reference = self._entries.get(reference_id)
            if reference is not None:
                self._entries.move_to_end(reference_id)
                return reference
        raise NotFound(
            f"reference {reference_id} is not held by this worker (evicted, or sent to another worker): "
            "send the reference audio and transcript again"
        )

    def _encode(self, key: str, audio: bytes, transcript: str) -> ResolvedReference:
        self.decodes += 1
        samples, seconds = decode_reference_audio(audio, self.max_seconds, self.min_seconds)
        with self._encode_lock:
            encoded = self.codec.encode(samples)
            self.encodes += 1
        codes = np.ascontiguousarray(encoded.numpy(), dtype=np.int64)
        codes.setflags(write=False)
        log.info("reference %s encoded: %.2f s -> %d frames", key, seconds, codes.shape[0])
        return ResolvedReference(reference_id=key, transcript=transcript, codes=codes, seconds=seconds)
