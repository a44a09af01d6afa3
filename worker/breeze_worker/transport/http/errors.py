"""The one mapping from the worker's error taxonomy to HTTP statuses, and the two error bodies.

Each API answers errors in the shape its clients parse: the official API's routes as FastAPI does
(`{"detail": "message"}`, and for a form field that is missing or does not parse, 422 with a list of
`{"type", "loc", "msg", "input"}`), the OpenAI body as OpenAI does (`{"error": {"message", "type", "param",
"code"}}`), which the OpenAI SDKs raise as their own exceptions. A full queue is 429 and a worker that is
loading or draining is 503, both with Retry-After: the official server's 409 for a second request is gone,
requests queue and batch as gRPC jobs do.
"""

from __future__ import annotations

import json
import logging

from aiohttp import web

from breeze_worker import errors

log = logging.getLogger(__name__)

OFFICIAL, OPENAI = "official", "openai"
RETRY_AFTER_S = {429: 1, 503: 5}  # a queue slot frees within a few frames; a load or a drain takes longer

STATUS_OF: dict[type[errors.BreezeError], int] = {
    errors.InvalidRequest: 400,
    errors.NotFound: 404,
    errors.OutOfRange: 416,
    errors.ResourceExhausted: 429,
    errors.Unavailable: 503,
    errors.DeadlineExceeded: 504,
    errors.Cancelled: 499,
    errors.CheckpointError: 500,
    errors.NumericalError: 500,
    errors.CodeOutOfRange: 500,
}
_OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                 408: "timeout_error", 413: "invalid_request_error", 415: "invalid_request_error",
                 422: "invalid_request_error", 429: "rate_limit_error", 501: "not_supported_error",
                 503: "service_unavailable_error"}


class HttpError(Exception):
    """An answer other than 200, with the message the client reads (it says what to change). `param` names the
    field at fault; `detail` replaces the official body's message (FastAPI's list for 422)."""

    def __init__(self, status: int, message: str, *, param: str | None = None, detail: object = None,
                 close: bool = False) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.detail = message if detail is None else detail
        self.close = close  # the connection is closed after the answer (a body left unread)


def from_breeze(exc: errors.BreezeError) -> HttpError:
    """A BreezeError as its status (an unknown subclass: 500) with its message."""
    for cls in type(exc).__mro__:
        status = STATUS_OF.get(cls)
        if status is not None:
            return HttpError(status, str(exc) or cls.__name__)
    return HttpError(500, str(exc) or type(exc).__name__)


def unexpected(exc: BaseException, what: str) -> HttpError:
    log.error("%s failed with an unexpected error", what, exc_info=exc)
    return HttpError(500, f"internal error in the worker ({type(exc).__name__}); see the worker log")


def style_of(request: web.Request) -> str:
    """Which API's error body a request gets: the OpenAI one for a JSON body, the official one otherwise."""
    return OPENAI if request.content_type == "application/json" else OFFICIAL


def response(error: HttpError, style: str) -> web.Response:
    if style == OPENAI:
        body: dict = {"error": {"message": error.message, "type": _OPENAI_TYPES.get(error.status, "server_error"),
                                "param": error.param, "code": error.status}}
    else:
        body = {"detail": error.detail}
    headers = {"Cache-Control": "no-store"}
    if error.status in RETRY_AFTER_S:
        headers["Retry-After"] = str(RETRY_AFTER_S[error.status])
    if error.status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="breeze-worker"'
    if error.close:
        headers["Connection"] = "close"
    reply = web.Response(status=error.status, text=json.dumps(body), content_type="application/json",
                         headers=headers)
    if error.close:
        reply.force_close()
    return reply


def missing(field: str) -> dict:
    """FastAPI's entry for a required form field that is absent (or empty, which it treats alike)."""
    return {"type": "missing", "loc": ["body", field], "msg": "Field required", "input": None}


def unparsable(field: str, kind: str, value: str) -> dict:
    """FastAPI's entry for a form field that does not parse as `kind` (int or float)."""
    what = {"int": ("int_parsing", "a valid integer, unable to parse string as an integer"),
            "float": ("float_parsing", "a valid number, unable to parse string as a number")}[kind]
    return {"type": what[0], "loc": ["body", field], "msg": f"Input should be {what[1]}", "input": value}


def invalid_form(entries: list[dict]) -> HttpError:
    names = ", ".join(str(e["loc"][-1]) for e in entries)
    return HttpError(422, f"the form has missing or malformed fields: {names}", param=str(entries[0]["loc"][-1]),
                     detail=entries)
