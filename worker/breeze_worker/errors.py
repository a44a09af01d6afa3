"""One error taxonomy for the whole worker: engine, model loader and artifact store (imports nothing of ours).

The transport maps each class to one gRPC status in one place (`breeze_worker.transport.status`).
Messages say what to change, because they reach the user verbatim.
"""

from __future__ import annotations


class BreezeError(Exception):
    """Base class of every error the worker raises on purpose."""


class InvalidRequest(BreezeError):
    """The request cannot be served as given (maps to INVALID_ARGUMENT)."""


class NotFound(BreezeError):
    """A named artifact or reference does not exist (maps to NOT_FOUND)."""


class OutOfRange(BreezeError):
    """An offset or index lies past the end of the data (maps to OUT_OF_RANGE)."""


class ResourceExhausted(BreezeError):
    """An admission limit was hit: active streams, queue length, queue wait, size (maps to RESOURCE_EXHAUSTED)."""


class Unavailable(BreezeError):
    """The engine is not ready or is shutting down (maps to UNAVAILABLE)."""


class DeadlineExceeded(BreezeError):
    """The request's deadline passed before it finished (maps to DEADLINE_EXCEEDED)."""


class Cancelled(BreezeError):
    """The caller went away; the job was dropped at the next frame boundary (maps to CANCELLED)."""


class CheckpointError(BreezeError):
    """A checkpoint directory does not match the architecture (missing, unexpected or mis-shaped tensors)."""


class NumericalError(BreezeError):
    """Non-finite values were produced and no safe fallback could recover the request (maps to INTERNAL)."""


class CodeOutOfRange(BreezeError):
    """A sampled code lies outside what the codec decodes; the frame was discarded, never decoded (maps to
    INTERNAL: the sampler must make this impossible, so reaching it is a defect of the worker)."""
