"""The HTTP face's gate: the gRPC ports' rules (a bearer token; client certificates are the TLS layer's), and
the size limit, decided from the request head before a byte of the body is read.

- With --token, every route but `GET /health` and the page itself (static; it asks for the token and sends it
  with each call) needs `Authorization: Bearer <token>` (the OpenAI SDKs send their api_key so). A refused
  request gets 401 and its connection is closed: its body is never read (a client that sent
  `Expect: 100-continue`, as curl does for uploads, is never told to send it).
- Failed tokens count against the same per-address budget as the gRPC ports' (`auth.AuthThrottle`, shared):
  an address that has used it up gets 429 on every route but the open ones, whatever token it sends, and the
  refusals are logged in aggregate.
- A body whose Content-Length is over --max-request-bytes gets 413 the same way; a chunked body is counted
  as it is read (`read_limited`).
- Client certificates (--tls-client-ca) are checked by the TLS handshake, before HTTP begins.

aiohttp answers `Expect: 100-continue` before its middlewares run, so the same checks run in the routes'
expect handler (`expect_handler`) as in the middleware (`gate`).
"""

from __future__ import annotations

import hmac
import logging

from aiohttp import web

from breeze_worker import logs
from breeze_worker.transport.auth import AuthThrottle
from breeze_worker.transport.http.errors import HttpError

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/health", "/", "/favicon.ico"})


class Gate:
    def __init__(self, token: str | None, max_request_bytes: int, throttle: AuthThrottle) -> None:
        self._expected = f"Bearer {token}".encode() if token else None
        self.max_request_bytes = max_request_bytes
        self.throttle = throttle

    def refusal(self, request: web.Request) -> HttpError | None:
        """Why the request may not go on (401, 413, 429 after too many failed tokens), or None; from its head
        alone."""
        if self._expected is not None and request.path not in OPEN_PATHS:
            peer = request.remote or ""
            route = f"HTTP {request.method} {logs.clip(request.path)}"
            wait_s = self.throttle.refused_for_s(peer, route)
            if wait_s is not None:
                return HttpError(429, f"too many requests from your address failed authentication; retry in "
                                      f"{wait_s:.0f} s with the worker's token", close=True)
            presented = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(presented, self._expected):
                reason = "missing" if not presented else "wrong"
                self.throttle.failed(peer, route, reason)
                return HttpError(401, f"{reason} bearer token: send 'Authorization: Bearer <token>' with the "
                                      "worker's token (the OpenAI SDKs send their api_key so)", close=True)
        length = request.content_length
        if length is not None and length > self.max_request_bytes:
            return HttpError(413, too_large(length, self.max_request_bytes), close=True)
        return None


def too_large(size: int, limit: int) -> str:
    return (f"the request body is {size:,} bytes; this worker accepts at most {limit:,} (its --max-request-bytes): "
            "send a shorter reference audio clip, or start the worker with a larger --max-request-bytes")


async def read_limited(request: web.Request, limit: int) -> bytes:
    """The whole body, refused with 413 (connection closed) once it passes `limit` bytes."""
    body = bytearray()
    while True:
        chunk = await request.content.readany()
        if not chunk:
            return bytes(body)
        body += chunk
        if len(body) > limit:
            raise HttpError(413, too_large(len(body), limit) + " (counted as it arrived)", close=True)
