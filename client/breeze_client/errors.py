"""The SDK's own exceptions, one per gRPC status the worker uses; each carries `code` and `message`.

`from_rpc_error` is the one place a `grpc.RpcError` becomes one of these. Callers catch
`BreezeClientError` (everything) or a specific class; the CLI prints `code: message` and exits non-zero.
"""

from __future__ import annotations

import grpc


class BreezeClientError(Exception):
    """Base class: a failed call. `code` is the gRPC status name (e.g. "INVALID_ARGUMENT")."""

    code: str = "UNKNOWN"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class InvalidArgument(BreezeClientError):
    code = "INVALID_ARGUMENT"


class NotFound(BreezeClientError):
    code = "NOT_FOUND"


class OutOfRange(BreezeClientError):
    code = "OUT_OF_RANGE"


class ResourceExhausted(BreezeClientError):
    code = "RESOURCE_EXHAUSTED"


class RequestTooLarge(ResourceExhausted):
    """The request message is larger than the worker accepts (its --max-request-bytes)."""


class Unavailable(BreezeClientError):
    code = "UNAVAILABLE"


class DeadlineExceeded(BreezeClientError):
    code = "DEADLINE_EXCEEDED"


class Cancelled(BreezeClientError):
    code = "CANCELLED"


class Unauthenticated(BreezeClientError):
    code = "UNAUTHENTICATED"


class PermissionDenied(BreezeClientError):
    code = "PERMISSION_DENIED"


class FailedPrecondition(BreezeClientError):
    code = "FAILED_PRECONDITION"


class Internal(BreezeClientError):
    code = "INTERNAL"


class Unimplemented(BreezeClientError):
    """The address called does not serve the call: most often the worker's other port."""

    code = "UNIMPLEMENTED"


class IntegrityError(BreezeClientError):
    """Fetched bytes do not match the artifact's size or SHA-256."""

    code = "DATA_LOSS"


class ProtocolError(BreezeClientError):
    """The worker's stream broke the contract (e.g. no final message)."""

    code = "INTERNAL"


_BY_CODE: dict[grpc.StatusCode, type[BreezeClientError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.OUT_OF_RANGE: OutOfRange,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.INTERNAL: Internal,
    grpc.StatusCode.UNIMPLEMENTED: Unimplemented,
    grpc.StatusCode.DATA_LOSS: IntegrityError,
}


def from_rpc_error(err: grpc.RpcError) -> BreezeClientError:
    """The SDK exception for a failed call (works for sync and asyncio errors)."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = (err.details() if hasattr(err, "details") else None) or str(err)
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED and "--max-request-bytes" in details:
        return RequestTooLarge(details)  # the worker's own refusal already says what to change
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in details:
        # gRPC's bare limit (a request far past --max-request-bytes, or an older worker)
        return RequestTooLarge(f"{details}: the request is larger than the worker accepts; send a shorter "
                               "reference audio (or raise the worker's --max-request-bytes)")
    if code is grpc.StatusCode.UNAVAILABLE and "backend unhealthy" in details:  # the fleet channel's health check
        return Unavailable(f"no worker is taking jobs: every worker the target resolves to reports NOT_SERVING "
                           f"(loading its model, or draining); retry later or add workers ({details})")
    if code is grpc.StatusCode.UNAVAILABLE and ("connect" in details.lower() or "refused" in details.lower()):
        details = f"{details} (is the worker running, and are --target / --artifact-target right?)"
    if code is grpc.StatusCode.UNIMPLEMENTED:
        return Unimplemented(f"{details}: the address called does not serve this call. A worker listens on two "
                             "ports: --target takes its synthesis address (synthesis= in its ready line), "
                             "--artifact-target its artifact address (artifacts=); check neither names the other")
    cls = _BY_CODE.get(code, BreezeClientError)
    return cls(details, None if cls is not BreezeClientError else code.name)
