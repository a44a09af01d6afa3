from breeze_tts_proto.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Compression(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMPRESSION_UNSPECIFIED: _ClassVar[Compression]
    COMPRESSION_NONE: _ClassVar[Compression]
    COMPRESSION_ZSTD: _ClassVar[Compression]
COMPRESSION_UNSPECIFIED: Compression
COMPRESSION_NONE: Compression
COMPRESSION_ZSTD: Compression

class StatArtifactRequest(_message.Message):
    __slots__ = ("artifact_id",)
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    artifact_id: str
    def __init__(self, artifact_id: _Optional[str] = ...) -> None: ...

class FetchArtifactRequest(_message.Message):
    __slots__ = ("artifact_id", "offset", "limit", "chunk_size", "compression")
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    artifact_id: str
    offset: int
    limit: int
    chunk_size: int
    compression: Compression
    def __init__(self, artifact_id: _Optional[str] = ..., offset: _Optional[int] = ..., limit: _Optional[int] = ..., chunk_size: _Optional[int] = ..., compression: _Optional[_Union[Compression, str]] = ...) -> None: ...

class FetchArtifactResponse(_message.Message):
    __slots__ = ("data", "offset", "uncompressed_size", "info", "request_received_unix_ns", "file_opened_unix_ns", "first_byte_sent_unix_ns", "last", "last_byte_sent_unix_ns", "read_ns", "sent_unix_ns", "read_cpu_wait_ns", "open_cpu_wait_ns", "arrival_cpu_wait_ns", "handler_cpu_wait_ns", "handler_cpu_run_ns")
    DATA_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    UNCOMPRESSED_SIZE_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    REQUEST_RECEIVED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    FILE_OPENED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    FIRST_BYTE_SENT_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    LAST_BYTE_SENT_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    READ_NS_FIELD_NUMBER: _ClassVar[int]
    SENT_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    READ_CPU_WAIT_NS_FIELD_NUMBER: _ClassVar[int]
    OPEN_CPU_WAIT_NS_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_CPU_WAIT_NS_FIELD_NUMBER: _ClassVar[int]
    HANDLER_CPU_WAIT_NS_FIELD_NUMBER: _ClassVar[int]
    HANDLER_CPU_RUN_NS_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    offset: int
    uncompressed_size: int
    info: _common_pb2.ArtifactInfo
    request_received_unix_ns: int
    file_opened_unix_ns: int
    first_byte_sent_unix_ns: int
    last: bool
    last_byte_sent_unix_ns: int
    read_ns: int
    sent_unix_ns: int
    read_cpu_wait_ns: int
    open_cpu_wait_ns: int
    arrival_cpu_wait_ns: int
    handler_cpu_wait_ns: int
    handler_cpu_run_ns: int
    def __init__(self, data: _Optional[bytes] = ..., offset: _Optional[int] = ..., uncompressed_size: _Optional[int] = ..., info: _Optional[_Union[_common_pb2.ArtifactInfo, _Mapping]] = ..., request_received_unix_ns: _Optional[int] = ..., file_opened_unix_ns: _Optional[int] = ..., first_byte_sent_unix_ns: _Optional[int] = ..., last: _Optional[bool] = ..., last_byte_sent_unix_ns: _Optional[int] = ..., read_ns: _Optional[int] = ..., sent_unix_ns: _Optional[int] = ..., read_cpu_wait_ns: _Optional[int] = ..., open_cpu_wait_ns: _Optional[int] = ..., arrival_cpu_wait_ns: _Optional[int] = ..., handler_cpu_wait_ns: _Optional[int] = ..., handler_cpu_run_ns: _Optional[int] = ...) -> None: ...

class DeleteArtifactRequest(_message.Message):
    __slots__ = ("artifact_id",)
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    artifact_id: str
    def __init__(self, artifact_id: _Optional[str] = ...) -> None: ...

class DeleteArtifactResponse(_message.Message):
    __slots__ = ("freed_bytes",)
    FREED_BYTES_FIELD_NUMBER: _ClassVar[int]
    freed_bytes: int
    def __init__(self, freed_bytes: _Optional[int] = ...) -> None: ...
