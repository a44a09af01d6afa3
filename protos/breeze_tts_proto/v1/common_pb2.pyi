from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

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
    __slots__ = ("artifact_id", "size_bytes", "sha256", "committed_unix_ns", "endpoint")
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    artifact_id: str
    size_bytes: int
    sha256: str
    committed_unix_ns: int
    endpoint: str
    def __init__(self, artifact_id: _Optional[str] = ..., size_bytes: _Optional[int] = ..., sha256: _Optional[str] = ..., committed_unix_ns: _Optional[int] = ..., endpoint: _Optional[str] = ...) -> None: ...
