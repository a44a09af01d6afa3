"""The OpenAI speech API's JSON body on `POST /v1/audio/speech`: what the OpenAI SDKs and the tools built on them
send.

Fields: `input` (the text, required), `model` (any name: this worker serves one model), `voice` (voices.py),
`instructions` (the instruction: voice design, or voice direction with a voice), `response_format` (pcm, wav,
flac, mp3, opus where the host's audio library encodes them; aac never; default mp3 as OpenAI's, or wav where
the host has no MP3 encoder), `speed` (1.0 only: the model has no rate control, ask for a pace in
`instructions`), `stream` (true: the audio as it is generated, chunked) and `stream_format` ("audio", or "sse":
server-sent events `speech.audio.delta` with base64 audio, then `speech.audio.done`). This worker's extras:
`seed`, `cfg_scale`, `reference_id` (a reference the worker holds, as gRPC's reference_id) with an optional
`reference_text`, `max_frames`. Any other field is a 400 that names it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from breeze_worker.engine.types import ReferenceInput, SynthesisRequest
from breeze_worker.transport.http import audio
from breeze_worker.transport.http.errors import HttpError
from breeze_worker.transport.http.voices import Voices

FIELDS = ("input", "model", "voice", "instructions", "response_format", "speed", "stream", "stream_format",
          "seed", "cfg_scale", "reference_id", "reference_text", "max_frames")


@dataclass(frozen=True)
class SpeechBody:
    request: SynthesisRequest
    response_format: str
    stream: bool
    sse: bool


def _typed(body: dict, name: str, kinds: tuple[type, ...], what: str):
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        raise HttpError(400, f"{name} must be {what}, not {value!r}", param=name)
    return value


def default_format() -> str:
    return "mp3" if "mp3" in audio.available() else "wav"


def parse(raw: bytes, voices: Voices, request_id: str | None) -> SpeechBody:
    """The engine request and the response's form; 400 naming the field at fault."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HttpError(400, f"the body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise HttpError(400, f"the body must be a JSON object with at least `input`, not {type(body).__name__}")
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise HttpError(400, f"unknown field(s) {', '.join(unknown)}: this endpoint takes {', '.join(FIELDS)}",
                        param=unknown[0])
    text = _typed(body, "input", (str,), "the text to speak (a string)")
    if text is None:
        raise HttpError(400, "input is required: the text to speak", param="input")
    _typed(body, "model", (str,), "a model name (a string)")
    instructions = _typed(body, "instructions", (str,), "a string") or None
    fmt = audio.check_format(body.get("response_format") or default_format())
    speed = _typed(body, "speed", (int, float), "a number")
    if speed is not None and speed != 1.0:
        raise HttpError(400, f"speed {speed} is not available: the model has no speaking-rate control (only 1.0); "
                             "ask for a pace in `instructions` instead, e.g. \"Speak slowly.\"", param="speed")
    stream = _typed(body, "stream", (bool,), "true or false") or False
    stream_format = _typed(body, "stream_format", (str,), "\"audio\" or \"sse\"")
    if stream_format not in (None, "audio", "sse"):
        raise HttpError(400, f"stream_format must be \"audio\" or \"sse\", not {stream_format!r}",
                        param="stream_format")
    seed = _typed(body, "seed", (int,), "an integer")
    cfg_scale = _typed(body, "cfg_scale", (int, float), "a number")
    if cfg_scale is not None and not math.isfinite(cfg_scale):
        raise HttpError(400, f"cfg_scale must be a finite number, not {cfg_scale!r}", param="cfg_scale")
    max_frames = _typed(body, "max_frames", (int,), "a positive integer")
    reference_id = _typed(body, "reference_id", (str,), "a reference id (a string)")
    reference_text = _typed(body, "reference_text", (str,), "a string")
    voice_reference = voices.reference_for(body.get("voice"))
    if reference_id is not None:
        if voice_reference is not None:
            raise HttpError(400, "give either a voice from the voices directory or a reference_id, not both",
                            param="reference_id")
        reference: ReferenceInput | None = ReferenceInput(reference_id=reference_id, transcript=reference_text)
    elif reference_text is not None:
        raise HttpError(400, "reference_text goes with reference_id: name the reference it transcribes",
                        param="reference_text")
    else:
        reference = voice_reference
    request = SynthesisRequest(text=text, instruction=instructions, cfg_scale=cfg_scale, seed=seed,
                               reference=reference, max_frames=max_frames, request_id=request_id)
    return SpeechBody(request, fmt, stream=stream or stream_format == "sse", sse=stream_format == "sse")
