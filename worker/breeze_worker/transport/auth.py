"""Bearer-token authentication: one server interceptor, UNAUTHENTICATED without the right token, and a budget of
failed attempts per peer address.

Health checks stay open (load balancers and Kubernetes probes carry no token); everything else,
reflection included, needs `authorization: Bearer <token>` when the worker has a token.

The decision is made from the call's metadata alone, before the method's handler is looked up: a refused
call gets a handler that ends it at once and never reads its request, so an unauthenticated body is neither
received past HTTP/2's flow-control window nor parsed (a 33 MB body costs the worker a few MB of reads).

Guessing is throttled (`AuthThrottle`): each peer address may fail `max_failures` times, then once every
`refill_s`; while it has no failure left, every call from it but health ends at once with RESOURCE_EXHAUSTED,
whatever token it carries, so a right guess is not told apart from a wrong one. The gate is applied by the call
interceptor (`calls.py`), the first code that sees a call's peer. Refusals are logged in aggregate
(`refusals.RefusalLog`), not a line each.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable

import grpc

from breeze_worker import logs
from breeze_worker.transport.refusals import FailureBudget, RefusalLog, peer_address

log = logging.getLogger(__name__)

OPEN_METHOD_PREFIXES = ("/grpc.health.v1.Health/",)


class AuthThrottle:
    """Failed authentications per peer address, and the gate that refuses a peer that has used them up."""

    def __init__(self, max_failures: int, refill_s: float) -> None:
        self.budget = FailureBudget(max_failures, refill_s)
        self._refusals = RefusalLog(log)

    def failed(self, peer: str, method: str, reason: str) -> None:
        self.budget.fail(peer)
        self._refusals.note("calls refused without a valid token", peer,
                            f"{reason} bearer token on {logs.clip(method)}")

    def refused_for_s(self, peer: str, method: str) -> float | None:
        """None when `peer` (an address) may try; else the seconds until it may again (the refusal is logged in
        aggregate). Both faces ask this before they look at a token."""
        del method  # the same budget whatever the call
        if not self.budget.exhausted(peer):
            return None
        self._refusals.note("calls refused after too many failed authentications", peer,
                            f"over {self.budget.burst} failed attempts; one more allowed every "
                            f"{self.budget.per_s:g} s (--auth-max-failures, --auth-failure-refill-s)")
        return self.budget.retry_after_s(peer)

    async def gate(self, context: grpc.aio.ServicerContext, method: str) -> None:
        """End the call with RESOURCE_EXHAUSTED when its peer has no failed attempt left (health is open)."""
        if method.startswith(OPEN_METHOD_PREFIXES):
            return
        wait_s = self.refused_for_s(peer_address(context.peer()), method)
        if wait_s is None:
            return
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                            f"too many calls from your address failed authentication; retry in {wait_s:.0f} s with "
                            "the worker's token")


def _refusal(method: str, reason: str, throttle: AuthThrottle) -> grpc.RpcMethodHandler:
    """A handler that fails the call with UNAUTHENTICATED without reading the request.

    It is stream-request and stream-response whatever the method is: on the wire every gRPC call is the
    same HTTP/2 stream, and a stream-request handler is not handed the request until it asks for it.
    No deserializer: nothing is parsed even if a byte is read.
    """
    message = (f"{reason} bearer token: pass the worker's token (breeze-client --token, or metadata "
               "'authorization: Bearer <token>')")

    async def refuse(request_iterator, context):
        del request_iterator  # never read
        throttle.failed(peer_address(context.peer()), method, reason)
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    return grpc.stream_stream_rpc_method_handler(refuse)


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    """Refuses calls whose `authorization` metadata is not `Bearer <token>` (constant-time compare); each refusal
    counts against its peer in `throttle`."""

    def __init__(self, token: str, throttle: AuthThrottle) -> None:
        if not token:
            raise ValueError("the bearer token must not be empty")
        self._expected = f"Bearer {token}".encode()
        self.throttle = throttle

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
        return _refusal(method, "missing" if not presented else "wrong", self.throttle)
