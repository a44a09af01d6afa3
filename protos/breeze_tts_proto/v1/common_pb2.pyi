from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PcmEncoding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PCM_ENCODING_UNSPECIFIED: _ClassVar[PcmEncoding]
    PCM_ENCODING_S16LE: _ClassVar[PcmEncoding]
    PCM_ENCODING_F32LE: _ClassVar[PcmEncoding]
PCM_ENCODING_UNSPECIFIED: PcmEncoding
PCM_ENCODING_S16LE: PcmEncoding
PCM_ENCODING_F32LE: PcmEncoding

class ArtifactInfo(_message.Message):
    __slots__ = ("artifact_id", "size_bytes", "sha256", "committed_unix_ns", "endpoint", "commit")
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    artifact_id: str
    size_bytes: int
    sha256: str
    committed_unix_ns: int
    endpoint: str
    commit: CommitTiming
    def __init__(self, artifact_id: _Optional[str] = ..., size_bytes: _Optional[int] = ..., sha256: _Optional[str] = ..., committed_unix_ns: _Optional[int] = ..., endpoint: _Optional[str] = ..., commit: _Optional[_Union[CommitTiming, _Mapping]] = ...) -> None: ...

class CommitTiming(_message.Message):
    __slots__ = ("started_unix_ns", "bytes_synced", "wav_fsync_ns", "hash_ns", "rename_ns", "sidecar_fsync_ns", "dir_fsync_ns", "cpu_wait_ns", "cpu_run_ns", "storage_cpu_wait_ns", "fsync_cpu_wait_ns")
    STARTED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    BYTES_SYNCED_FIELD_NUMBER: _ClassVar[int]
    WAV_FSYNC_NS_FIELD_NUMBER: _ClassVar[int]
    HASH_NS_FIELD_NUMBER: _ClassVar[int]
    RENAME_NS_FIELD_NUMBER: _ClassVar[int]
    SIDECAR_FSYNC_NS_FIELD_NUMBER: _ClassVar[int]
    DIR_FSYNC_NS_FIELD_NUMBER: _ClassVar[int]
    CPU_WAIT_NS_FIELD_NUMBER: _ClassVar[int]
    CPU_RUN_NS_FIELD_NUMBER: _ClassVar[int]
    STORAGE_CPU_WAIT_NS_FIELD_NUMBER: _ClassVar[int]
    FSYNC_CPU_WAIT_NS_FIELD_NUMBER: _ClassVar[int]
    started_unix_ns: int
    bytes_synced: int
    wav_fsync_ns: int
    hash_ns: int
    rename_ns: int
    sidecar_fsync_ns: int
    dir_fsync_ns: int
    cpu_wait_ns: int
    cpu_run_ns: int
    storage_cpu_wait_ns: int
    fsync_cpu_wait_ns: int
    def __init__(self, started_unix_ns: _Optional[int] = ..., bytes_synced: _Optional[int] = ..., wav_fsync_ns: _Optional[int] = ..., hash_ns: _Optional[int] = ..., rename_ns: _Optional[int] = ..., sidecar_fsync_ns: _Optional[int] = ..., dir_fsync_ns: _Optional[int] = ..., cpu_wait_ns: _Optional[int] = ..., cpu_run_ns: _Optional[int] = ..., storage_cpu_wait_ns: _Optional[int] = ..., fsync_cpu_wait_ns: _Optional[int] = ...) -> None: ...
