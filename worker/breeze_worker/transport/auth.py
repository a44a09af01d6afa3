"""Bearer-token authentication: one server interceptor, UNAUTHENTICATED without the right token.

Health checks stay open (load balancers and Kubernetes probes carry no token); everything else,
reflection included, needs `authorization: Bearer <token>` when the worker has a token.
"""

from __future__ import annotations

import hmac
import logging
from typing import Awaitable, Callable

import grpc

log = logging.getLogger(__name__)

OPEN_METHOD_PREFIXES = ("/grpc.health.v1.Health/",)


def _denied_handler(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind as `handler` that fails the call with UNAUTHENTICATED."""

    async def deny_unary(request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def deny_stream(request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # pragma: no cover - makes this an async generator

    kw = dict(request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(deny_stream, **kw)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(deny_unary, **kw)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(deny_stream, **kw)
    return grpc.unary_unary_rpc_method_handler(deny_unary, **kw)


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    """Rejects calls whose `authorization` metadata is not `Bearer <token>` (constant-time compare)."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("the bearer token must not be empty")
        self._expected = f"Bearer {token}".encode()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method or ""
        if handler is None or method.startswith(OPEN_METHOD_PREFIXES):
            return handler
        metadata = dict(handler_call_details.invocation_metadata or ())
        presented = metadata.get("authorization", "")
        if isinstance(presented, str):
            presented = presented.encode()
        if hmac.compare_digest(presented, self._expected):
            return handler
        reason = "missing" if not presented else "wrong"
        log.warning("rejected %s: %s bearer token", method, reason)
        return _denied_handler(
            handler, f"{reason} bearer token: pass the worker's token (breeze-client --token, "
                     "or metadata 'authorization: Bearer <token>')")
