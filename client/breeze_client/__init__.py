"""Client SDK and CLI for the Breeze TTS 2 worker.

The public names are the ones below; everything else in the package may change between versions.
"""

from importlib.metadata import PackageNotFoundError, version

from breeze_client.aio import AsyncBreezeClient, AsyncSynthesisStream
from breeze_client.errors import (
    BreezeClientError,
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    IntegrityError,
    Internal,
    InvalidArgument,
    NotFound,
    OutOfRange,
    PermissionDenied,
    ProtocolError,
    RequestTooLarge,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    Unimplemented,
)
from breeze_client.sdk import BreezeClient, SynthesisStream
from breeze_client.types import (
    ArtifactRef,
    AudioChunk,
    FetchResult,
    JobInfo,
    JobStats,
    SamplingParams,
    SynthesisRequest,
    SynthesisResult,
    WorkerInfo,
)

try:
    __version__ = version("breeze-tts-serving")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "ArtifactRef",
    "AsyncBreezeClient",
    "AsyncSynthesisStream",
    "AudioChunk",
    "BreezeClient",
    "BreezeClientError",
    "Cancelled",
    "DeadlineExceeded",
    "FailedPrecondition",
    "FetchResult",
    "IntegrityError",
    "Internal",
    "InvalidArgument",
    "JobInfo",
    "JobStats",
    "NotFound",
    "OutOfRange",
    "PermissionDenied",
    "ProtocolError",
    "RequestTooLarge",
    "ResourceExhausted",
    "SamplingParams",
    "SynthesisRequest",
    "SynthesisResult",
    "SynthesisStream",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "WorkerInfo",
    "__version__",
]
