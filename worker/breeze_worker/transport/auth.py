"""Bearer-token authentication: one server interceptor, UNAUTHENTICATED without the right token.

Health checks stay open (load balancers and Kubernetes probes carry no token); everything else,
reflection included, needs `authorization: Bearer <token>` when the worker has a token.

The decision is made from the call's metadata alone, before the method's handler is looked up: a refused
call gets a handler that ends it at once and never reads its request, so an unauthenticated body is neither
received past HTTP/2's flow-control window nor parsed (a 33 MB body costs the worker a few MB of reads).
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable

import grpc

from breeze_worker import logs

log = logging.getLogger(__name__)

OPEN_METHOD_PREFIXES = ("/grpc.health.v1.Health/",)


def _refusal(method: str, reason: str) -> grpc.RpcMethodHandler:
    """A handler that fails the call with UNAUTHENTICATED without reading the request.

    It is stream-request and stream-response whatever the method is: on the wire every gRPC call is the
    same HTTP/2 stream, and a stream-request handler is not handed the request until it asks for it.
    No deserializer: nothing is parsed even if a byte is read.
    """
    message = (f"{reason} bearer token: pass the worker's token (breeze-client --token, or metadata "
               "'authorization: Bearer <token>')")

    async def refuse(request_iterator, context):
        del request_iterator  # never read
        log.warning("rejected %s: %s bearer token", logs.clip(method), reason)
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    return grpc.stream_stream_rpc_method_handler(refuse)


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    """Refuses calls whose `authorization` metadata is not `Bearer <token>` (constant-time compare)."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("the bearer token must not be empty")
        self._expected = f"Bearer {token}".encode()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method or ""
        if method.startswith(OPEN_METHOD_PREFIXES):
            return await continuation(handler_call_details)
        presented = b""
        for key, value in handler_call_details.invocation_metadata or ():
            if key == "authorization":
                presented = value.encode() if isinstance(value, str) else bytes(value)
                break
        if hmac.compare_digest(presented, self._expected):
            return await continuation(handler_call_details)
        return _refusal(method, "missing" if not presented else "wrong")
