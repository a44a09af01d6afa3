"""The one mapping from the worker's error taxonomy to gRPC status codes.

Servicers wrap their work in `mapped_errors(context)`; a `BreezeError` becomes its status with the
error's message (written to say what to change), anything else becomes INTERNAL with a logged
traceback and a message that names the job or call but reveals no internals. A caller that went away is
a cancellation, not an error: the send that found its call over (gRPC's own error) is logged at INFO,
without a traceback, and ends the handler as a hang-up does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc

from breeze_worker import errors

log = logging.getLogger(__name__)

STATUS_OF: dict[type[errors.BreezeError], grpc.StatusCode] = {
    errors.InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.OutOfRange: grpc.StatusCode.OUT_OF_RANGE,
    errors.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
    errors.Cancelled: grpc.StatusCode.CANCELLED,
    errors.CheckpointError: grpc.StatusCode.FAILED_PRECONDITION,
    errors.NumericalError: grpc.StatusCode.INTERNAL,
    errors.CodeOutOfRange: grpc.StatusCode.INTERNAL,
}


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """(code, message) for an exception; unknown exceptions map to INTERNAL (the caller logs them)."""
    for cls in type(exc).__mro__:
        code = STATUS_OF.get(cls)
        if code is not None:
            return code, str(exc) or cls.__name__
    if isinstance(exc, errors.BreezeError):
        return grpc.StatusCode.INTERNAL, str(exc) or type(exc).__name__
    return grpc.StatusCode.INTERNAL, f"internal error in the worker ({type(exc).__name__}); see the worker log"


@contextlib.asynccontextmanager
async def mapped_errors(context: grpc.aio.ServicerContext, what: str):
    """Turn errors raised inside the block into the call's status; `what` names the call for the log."""
    try:
        yield
    except errors.BreezeError as exc:
        code, message = status_of(exc)
        if code is grpc.StatusCode.INTERNAL:
            log.error("%s failed: %s", what, message, exc_info=exc)
        else:
            log.info("%s rejected: %s %s", what, code.name, message)
        await context.abort(code, message)
    except (grpc.aio.AbortError, GeneratorExit):
        raise
    except grpc.aio.BaseError as exc:  # gRPC's own: a send on a call that is over, its peer gone
        log.info("%s ended: the caller went away (%s)", what, type(exc).__name__)
        raise asyncio.CancelledError from exc  # what a hang-up is; gRPC ends the call quietly
    except Exception as exc:  # noqa: BLE001 - the one place that turns surprises into INTERNAL
        code, message = status_of(exc)
        log.exception("%s failed with an unexpected error", what)
        await context.abort(code, message)
