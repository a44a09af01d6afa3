"""status.py: every error class has its status; anything else is INTERNAL with a logged traceback."""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest

from breeze_worker import errors
from breeze_worker.transport.status import STATUS_OF, mapped_errors, status_of

EXPECTED = {
    errors.InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.OutOfRange: grpc.StatusCode.OUT_OF_RANGE,
    errors.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
    errors.Cancelled: grpc.StatusCode.CANCELLED,
    errors.NumericalError: grpc.StatusCode.INTERNAL,
}


@pytest.mark.parametrize("cls,code", EXPECTED.items())
def test_each_error_class_maps_to_its_status_with_its_message(cls, code):
    assert status_of(cls("change X to Y")) == (code, "change X to Y")


def test_every_taxonomy_class_is_mapped():
    classes = {c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.BreezeError)}
    assert classes - {errors.BreezeError} <= set(STATUS_OF)


def test_subclasses_inherit_the_mapping():
    class TextTooLong(errors.InvalidRequest):
        pass

    assert status_of(TextTooLong("shorten the text"))[0] is grpc.StatusCode.INVALID_ARGUMENT


def test_unknown_error_is_internal_without_internals():
    code, message = status_of(KeyError("secret internal detail"))
    assert code is grpc.StatusCode.INTERNAL and "secret" not in message and "worker log" in message


class _Context:
    def __init__(self):
        self.aborted = None

    async def abort(self, code, message):
        self.aborted = (code, message)
        raise grpc.aio.AbortError()


async def test_mapped_errors_aborts_and_logs_a_traceback_for_surprises(caplog):
    ctx = _Context()
    with caplog.at_level(logging.ERROR, logger="breeze_worker.transport.status"):
        with pytest.raises(grpc.aio.AbortError):
            async with mapped_errors(ctx, "Test()"):
                raise ZeroDivisionError("bug")
    assert ctx.aborted[0] is grpc.StatusCode.INTERNAL
    assert any(r.exc_info and r.exc_info[0] is ZeroDivisionError for r in caplog.records)
    ctx = _Context()
    with pytest.raises(grpc.aio.AbortError):
        async with mapped_errors(ctx, "Test()"):
            raise errors.NotFound("no such artifact: check the id")
    assert ctx.aborted == (grpc.StatusCode.NOT_FOUND, "no such artifact: check the id")


async def test_a_send_that_finds_its_caller_gone_is_a_cancel_logged_at_info_without_a_traceback(caplog):
    """gRPC raises its own error (ExecuteBatchError) from a write on a call whose peer went away, when the write
    fails before the hang-up reaches the handler's task."""
    from grpc._cython import cygrpc

    ctx = _Context()
    with caplog.at_level(logging.DEBUG, logger="breeze_worker.transport.status"):
        with pytest.raises(asyncio.CancelledError):
            async with mapped_errors(ctx, "Synthesize"):
                raise cygrpc.ExecuteBatchError('Failed "execute_batch": (<SendMessageOperation>,)')
    assert ctx.aborted is None  # nothing to send to a caller that is gone
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "Synthesize ended: the caller went away (ExecuteBatchError)")]
    assert not any(r.exc_info for r in caplog.records)
