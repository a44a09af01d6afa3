"""One server interceptor around every handler on both ports: log fields, the request's arrival, and bodies
that do not decode.

- The call's method and peer are bound into the log context (`breeze_worker.logs`), so every line the
  call logs carries them (the synthesis servicer adds the request id, the engine the job id).
- A method that takes one request message gets it within `first_message_timeout_s` of the call's start, or
  the call ends with DEADLINE_EXCEEDED; and one peer address may have at most `max_waiting_per_peer` calls
  waiting for their message (one more is refused at once, RESOURCE_EXHAUSTED). Left to gRPC, a call that opens
  and never sends its message would hold its stream until its own deadline, or for ever without one, whoever
  sent it (health is open to all). So every handler is made request-streaming here, and the one message read
  under those bounds.
- A request body that protobuf cannot parse (a malformed message, invalid UTF-8 in a string field) is
  INVALID_ARGUMENT with a plain message. Left to gRPC, the parser's exception would end the call as
  UNKNOWN with the exception's class name, and the server would log a traceback for it.

- With a token, a peer that failed authentication too often is refused here (`auth.AuthThrottle.gate`), before
  the token check's handler runs, so its calls end alike whatever token they carry.

It sits outside the bearer-token interceptor (`auth.py`), so refused calls are logged with their peer too;
the token check itself never reaches a deserializer.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
from collections.abc import Awaitable, Callable

import grpc

from breeze_worker import logs
from breeze_worker.transport.refusals import RefusalLog, peer_address

log = logging.getLogger(__name__)


class _Undecodable:
    """What the guarded deserializer returns in place of a message it could not parse."""

    __slots__ = ()


_UNDECODABLE = _Undecodable()


def _guarded(deserialize: Callable[[bytes], object] | None) -> Callable[[bytes], object] | None:
    if deserialize is None:
        return None

    def decode(raw: bytes) -> object:
        try:
            return deserialize(raw)
        except Exception:  # noqa: BLE001 - protobuf's DecodeError (and any parser's error) means a bad body
            return _UNDECODABLE

    return decode


def _malformed_message(method: str) -> str:
    return (f"the request body of {logs.clip(method)} is not a valid protobuf message of the expected type "
            "(malformed bytes, or a string field that is not UTF-8): build it with the worker's protos")


class _Waiting:
    """The calls of each peer address that wait for their request message."""

    def __init__(self, first_message_timeout_s: float, max_per_peer: int) -> None:
        self.timeout_s, self.max_per_peer = first_message_timeout_s, max_per_peer
        self.by_peer: collections.Counter[str] = collections.Counter()
        self.refusals = RefusalLog(log)


Gate = Callable[[grpc.aio.ServicerContext, str], Awaitable[None]]  # ends a call it refuses (context.abort)


def _wrap(handler: grpc.RpcMethodHandler, method: str, waiting: _Waiting, gate: Gate | None) -> grpc.RpcMethodHandler:
    """A request-streaming handler that binds the log fields, reads a unary method's message within the bounds
    of `waiting`, refuses undecodable requests and runs `handler`."""

    async def reject_if_undecodable(request, context) -> None:
        if request is _UNDECODABLE:
            log.info("%s rejected: INVALID_ARGUMENT the request body does not decode", logs.clip(method))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, _malformed_message(method))

    def checked(request_iterator, context):
        async def messages():
            async for request in request_iterator:
                await reject_if_undecodable(request, context)
                yield request
        return messages()

    async def first_message(request_iterator, context):
        peer = peer_address(context.peer())
        if waiting.by_peer[peer] >= waiting.max_per_peer:
            waiting.refusals.note("calls refused before their message", peer,
                                  f"{waiting.max_per_peer} calls of this address wait for their request message "
                                  "(--max-waiting-calls-per-peer)")
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"{waiting.max_per_peer} calls from your address are waiting to send their request "
                                "message; send it, or open fewer calls at once")
        waiting.by_peer[peer] += 1
        try:
            async with asyncio.timeout(waiting.timeout_s):
                return await anext(request_iterator)
        except TimeoutError:
            log.debug("%s ended: no request message within %g s", logs.clip(method), waiting.timeout_s)
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                                f"the request message did not arrive within {waiting.timeout_s:g} s of the "
                                "call's start (the worker's --first-message-timeout-s)")
        except StopAsyncIteration:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"{logs.clip(method)} takes one request message; the call ended without one")
        finally:
            waiting.by_peer[peer] -= 1
            if not waiting.by_peer[peer]:
                del waiting.by_peer[peer]

    async def begin(requests, context):
        """Every call's start: its log fields, then the request read and checked (a stream's messages as they
        arrive)."""
        logs.bind(method=method, peer=context.peer())
        if gate is not None:
            await gate(context, method)
        if handler.request_streaming:
            return checked(requests, context)
        request = await first_message(requests, context)
        await reject_if_undecodable(request, context)
        return request

    kind = (handler.request_streaming, handler.response_streaming)
    behavior = {(False, False): handler.unary_unary, (False, True): handler.unary_stream,
                (True, False): handler.stream_unary, (True, True): handler.stream_stream}[kind]
    run: Callable[..., object]  # an async generator function or a coroutine function, as `behavior` is
    if inspect.isasyncgenfunction(behavior):  # a response stream produced by yielding
        async def run_yielding(request, context):
            request = await begin(request, context)
            async for response in behavior(request, context):
                yield response
        run = run_yielding
    else:  # a coroutine: returns the response, or writes a stream with context.write
        async def run_returning(request, context):
            request = await begin(request, context)
            return await behavior(request, context)
        run = run_returning

    factory = grpc.stream_stream_rpc_method_handler if handler.response_streaming else \
        grpc.stream_unary_rpc_method_handler
    return factory(run, request_deserializer=_guarded(handler.request_deserializer),
                   response_serializer=handler.response_serializer)


class CallInterceptor(grpc.aio.ServerInterceptor):
    """Wraps every handler: log fields bound per call, a unary method's message awaited at most
    `first_message_timeout_s` and by at most `max_waiting_per_peer` calls of one address, undecodable bodies
    refused with INVALID_ARGUMENT."""

    def __init__(self, first_message_timeout_s: float, max_waiting_per_peer: int, gate: Gate | None = None) -> None:
        self._waiting = _Waiting(first_message_timeout_s, max_waiting_per_peer)
        self._gate = gate

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:  # an unknown method: gRPC answers UNIMPLEMENTED
            return None
        return _wrap(handler, handler_call_details.method or "", self._waiting, self._gate)
