"""The official Breeze TTS 2 API, field for field: `POST /v1/audio/speech` and `POST /v1/audio/speech/batch` as
forms (multipart/form-data, or urlencoded when there is no file), `GET /health`.

Fields, defaults and checks are the official server's: `text` (required), `instruction` (optional, trimmed),
`cfg_scale` (1.0; finite and > 0, else 400 "cfg_scale must be greater than 0."), `ref_audio` (a file) and
`ref_text` (trimmed; both or neither, else 400), `seed` (42); the batch takes `texts` (a JSON array of 1 to 128
non-empty strings) and `max_new_tokens` (1500, clamped to 1..1500) instead of `text`. An empty field counts
as absent, and a field that is absent or does not parse is 422 with FastAPI's list of
`{"type", "loc", "msg", "input"}`. Answers: speech streams raw mono 24 kHz s16le PCM (`audio/pcm`,
`X-Sample-Rate`, `X-Sample-Format`, `Cache-Control: no-store`); batch answers every segment's PCM in order
with `X-Segment-Bytes`. Besides those, each answer carries its job and artifact ids.

What differs on purpose: no 409. Requests queue and batch in the engine like gRPC jobs; a full queue is 429
and a loading or draining worker 503, with Retry-After. The engine's own checks apply on top (text length,
control tokens, a CFG scale other than 1 needs an instruction): 400 with a message that says what to change.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math

from aiohttp import web

from breeze_worker.engine.types import ReferenceInput, SynthesisRequest
from breeze_worker.transport.http import errors as he
from breeze_worker.transport.http.errors import HttpError

log = logging.getLogger(__name__)

DEFAULT_CFG_SCALE = 1.0
DEFAULT_SEED = 42
MAX_BATCH_TEXTS = 128
MAX_NEW_TOKENS = 1500


def _value(form, name: str):
    """A form field's value; absent or empty (FastAPI treats an empty form value as absent): None."""
    value = form.get(name)
    return None if value is None or value == "" else value


def _number(form, name: str, kind: str, default, problems: list[dict]):
    raw = _value(form, name)
    if raw is None:
        return default
    if isinstance(raw, web.FileField):
        problems.append(he.unparsable(name, kind, raw.filename or ""))
        return default
    try:
        return int(raw.strip()) if kind == "int" else float(raw.strip())
    except ValueError:
        problems.append(he.unparsable(name, kind, raw))
        return default


def _text(form, name: str, problems: list[dict], required: bool = False) -> str | None:
    raw = _value(form, name)
    if raw is None:
        if required:
            problems.append(he.missing(name))
        return None
    if isinstance(raw, web.FileField):
        problems.append({"type": "string_type", "loc": ["body", name], "msg": "Input should be a valid string",
                         "input": raw.filename})
        return None
    return raw


def _reference(form, problems: list[dict]) -> tuple[web.FileField | None, str]:
    upload = form.get("ref_audio")
    if upload is not None and upload != "" and not isinstance(upload, web.FileField):
        problems.append({"type": "value_error", "loc": ["body", "ref_audio"],
                         "msg": "Value error, Expected UploadFile, received: <class 'str'>", "input": upload})
        upload = None
    ref_text = (_text(form, "ref_text", problems) or "").strip()
    return (upload if isinstance(upload, web.FileField) else None), ref_text


def _check_cfg(cfg_scale: float) -> None:
    if not math.isfinite(cfg_scale) or cfg_scale <= 0:
        raise HttpError(400, "cfg_scale must be greater than 0.", param="cfg_scale")


def _reference_input(upload: web.FileField | None, ref_text: str) -> ReferenceInput | None:
    has_reference = upload is not None and bool(upload.filename)
    if has_reference != bool(ref_text):
        raise HttpError(400, "ref_audio and ref_text must be provided together or both omitted.", param="ref_audio")
    if upload is None or not has_reference:
        return None
    audio = upload.file.read()
    if not audio:
        raise HttpError(400, "Reference audio is empty.", param="ref_audio")
    return ReferenceInput(audio=audio, transcript=ref_text)


def _shared(form, problems: list[dict]) -> dict:
    """The fields speech and batch share, parsed (FastAPI's problems appended to `problems`)."""
    return {"instruction": _text(form, "instruction", problems),
            "cfg_scale": _number(form, "cfg_scale", "float", DEFAULT_CFG_SCALE, problems),
            "reference": _reference(form, problems), "seed": _number(form, "seed", "int", DEFAULT_SEED, problems)}


def _checked(shared: dict) -> dict:
    """The shared fields as SynthesisRequest keywords, after the official checks (cfg_scale, then the reference)."""
    _check_cfg(shared["cfg_scale"])
    instruction = shared["instruction"].strip() if shared["instruction"] else None
    return {"instruction": instruction or None, "cfg_scale": shared["cfg_scale"], "seed": shared["seed"],
            "reference": _reference_input(*shared["reference"])}


def speech_request(form, request_id: str | None) -> SynthesisRequest:
    """The engine request of a speech form; 422 / 400 as the official server answers."""
    problems: list[dict] = []
    text = _text(form, "text", problems, required=True)
    shared = _shared(form, problems)
    if problems:
        raise he.invalid_form(problems)
    assert text is not None  # required: a problem otherwise
    return SynthesisRequest(text=text, request_id=request_id, **_checked(shared))


def _batch_texts(raw: str) -> list[str]:
    try:
        texts = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise HttpError(400, f"texts must be a JSON array of strings: {exc}", param="texts") from None
    if not isinstance(texts, list) or not texts:
        raise HttpError(400, "texts must be a non-empty JSON array.", param="texts")
    if len(texts) > MAX_BATCH_TEXTS:
        raise HttpError(400, f"texts has {len(texts)} entries; the limit is {MAX_BATCH_TEXTS}.", param="texts")
    if not all(isinstance(t, str) and t.strip() for t in texts):
        raise HttpError(400, "Every entry in texts must be a non-empty string.", param="texts")
    return texts


def batch_requests(form, request_id: str | None, model_max_frames: int) -> list[SynthesisRequest]:
    """One engine request per text of a batch form (its shared fields on each), in order."""
    problems: list[dict] = []
    raw_texts = _text(form, "texts", problems, required=True)
    shared = _shared(form, problems)
    max_new_tokens = _number(form, "max_new_tokens", "int", None, problems)
    if problems:
        raise he.invalid_form(problems)
    assert raw_texts is not None  # required: a problem otherwise
    texts = _batch_texts(raw_texts)
    fields = _checked(shared)
    # absent: the engine's limit from each text's length (a runaway tail stops early); given: clamped as the
    # official server clamps it, and to the model's own cap
    max_frames = None if max_new_tokens is None else max(1, min(max_new_tokens, MAX_NEW_TOKENS, model_max_frames))
    return [SynthesisRequest(text=text, max_frames=max_frames, request_id=f"{request_id}#{i}" if request_id else None,
                             **fields)
            for i, text in enumerate(texts)]


async def read_form(request: web.Request, timeout_s: float, limit: int):
    """The request's form (multipart or urlencoded), read within `timeout_s` (408 after, connection closed)."""
    if request.content_type not in ("multipart/form-data", "application/x-www-form-urlencoded"):
        raise HttpError(415, f"this path takes a form (multipart/form-data, as `curl -F` sends it) or a JSON body "
                             f"(application/json, the OpenAI speech API), not {request.content_type!r}", close=True)
    try:
        async with asyncio.timeout(timeout_s):
            return await request.post()
    except TimeoutError:
        raise HttpError(408, f"the request body did not arrive within {timeout_s:g} s (the worker's "
                             "--http-read-timeout-s)", close=True) from None
    except web.HTTPRequestEntityTooLarge:
        from breeze_worker.transport.http.auth import too_large

        raise HttpError(413, too_large(request.content_length or limit + 1, limit), close=True) from None
    except (ValueError, AssertionError, web.HTTPBadRequest) as exc:  # a malformed multipart body
        raise HttpError(400, f"the form does not parse as {request.content_type}: {exc}", close=True) from None
