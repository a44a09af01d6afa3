"""One server interceptor around every handler on both ports: log fields, and bodies that do not decode.

- The call's method and peer are bound into the log context (`breeze_worker.logs`), so every line the
  call logs carries them (the synthesis servicer adds the request id, the engine the job id).
- A request body that protobuf cannot parse (a malformed message, invalid UTF-8 in a string field) is
  INVALID_ARGUMENT with a plain message. Left to gRPC, the parser's exception would end the call as
  UNKNOWN with the exception's class name, and the server would log a traceback for it.

It sits outside the bearer-token interceptor (`auth.py`), so refused calls are logged with their peer too;
the token check itself never reaches a deserializer.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable

import grpc

from breeze_worker import logs

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


def _wrap(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind that binds the log fields and refuses undecodable requests."""

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

    async def begin(request, context):
        """Every call's start: its log fields, then the request checked (a stream's messages as they arrive)."""
        logs.bind(method=method, peer=context.peer())
        if handler.request_streaming:
            return checked(request, context)
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

    factory = {(False, False): grpc.unary_unary_rpc_method_handler,
               (False, True): grpc.unary_stream_rpc_method_handler,
               (True, False): grpc.stream_unary_rpc_method_handler,
               (True, True): grpc.stream_stream_rpc_method_handler}[kind]
    return factory(run, request_deserializer=_guarded(handler.request_deserializer),
                   response_serializer=handler.response_serializer)


class CallInterceptor(grpc.aio.ServerInterceptor):
    """Wraps every handler: log fields bound per call, undecodable bodies refused with INVALID_ARGUMENT."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:  # an unknown method: gRPC answers UNIMPLEMENTED
            return None
        return _wrap(handler, handler_call_details.method or "")
