from breeze_tts_proto.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Template(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TEMPLATE_UNSPECIFIED: _ClassVar[Template]
    TEMPLATE_PLAIN: _ClassVar[Template]
    TEMPLATE_INSTRUCTION: _ClassVar[Template]
    TEMPLATE_CLONE: _ClassVar[Template]
    TEMPLATE_DIRECTION: _ClassVar[Template]

class EndReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    END_REASON_UNSPECIFIED: _ClassVar[EndReason]
    END_REASON_END_OF_SPEECH: _ClassVar[EndReason]
    END_REASON_FRAME_LIMIT: _ClassVar[EndReason]
    END_REASON_CANCELLED: _ClassVar[EndReason]
    END_REASON_ERROR: _ClassVar[EndReason]
TEMPLATE_UNSPECIFIED: Template
TEMPLATE_PLAIN: Template
TEMPLATE_INSTRUCTION: Template
TEMPLATE_CLONE: Template
TEMPLATE_DIRECTION: Template
END_REASON_UNSPECIFIED: EndReason
END_REASON_END_OF_SPEECH: EndReason
END_REASON_FRAME_LIMIT: EndReason
END_REASON_CANCELLED: EndReason
END_REASON_ERROR: EndReason

class SamplingOverrides(_message.Message):
    __slots__ = ("temperature", "top_k", "top_p", "repetition_penalty")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    top_p: float
    repetition_penalty: float
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., repetition_penalty: _Optional[float] = ...) -> None: ...

class ReferenceAudio(_message.Message):
    __slots__ = ("audio", "reference_id", "transcript")
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSCRIPT_FIELD_NUMBER: _ClassVar[int]
    audio: bytes
    reference_id: str
    transcript: str
    def __init__(self, audio: _Optional[bytes] = ..., reference_id: _Optional[str] = ..., transcript: _Optional[str] = ...) -> None: ...

class SynthesizeRequest(_message.Message):
    __slots__ = ("text", "instruction", "cfg_scale", "seed", "reference", "sampling", "max_frames", "encoding", "frames_per_chunk", "request_id", "cfg_scale_reference", "cfg_scale_instruction")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTION_FIELD_NUMBER: _ClassVar[int]
    CFG_SCALE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    MAX_FRAMES_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    FRAMES_PER_CHUNK_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CFG_SCALE_REFERENCE_FIELD_NUMBER: _ClassVar[int]
    CFG_SCALE_INSTRUCTION_FIELD_NUMBER: _ClassVar[int]
    text: str
    instruction: str
    cfg_scale: float
    seed: int
    reference: ReferenceAudio
    sampling: SamplingOverrides
    max_frames: int
    encoding: _common_pb2.PcmEncoding
    frames_per_chunk: int
    request_id: str
    cfg_scale_reference: float
    cfg_scale_instruction: float
    def __init__(self, text: _Optional[str] = ..., instruction: _Optional[str] = ..., cfg_scale: _Optional[float] = ..., seed: _Optional[int] = ..., reference: _Optional[_Union[ReferenceAudio, _Mapping]] = ..., sampling: _Optional[_Union[SamplingOverrides, _Mapping]] = ..., max_frames: _Optional[int] = ..., encoding: _Optional[_Union[_common_pb2.PcmEncoding, str]] = ..., frames_per_chunk: _Optional[int] = ..., request_id: _Optional[str] = ..., cfg_scale_reference: _Optional[float] = ..., cfg_scale_instruction: _Optional[float] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_k", "top_p", "repetition_penalty")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    top_p: float
    repetition_penalty: float
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., repetition_penalty: _Optional[float] = ...) -> None: ...

class ResolvedParams(_message.Message):
    __slots__ = ("instruction", "cfg_scale", "seed", "template", "sampling", "max_frames", "encoding", "frames_per_chunk", "reference_seconds", "cfg_scale_reference", "cfg_scale_instruction")
    INSTRUCTION_FIELD_NUMBER: _ClassVar[int]
    CFG_SCALE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    MAX_FRAMES_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    FRAMES_PER_CHUNK_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CFG_SCALE_REFERENCE_FIELD_NUMBER: _ClassVar[int]
    CFG_SCALE_INSTRUCTION_FIELD_NUMBER: _ClassVar[int]
    instruction: str
    cfg_scale: float
    seed: int
    template: Template
    sampling: SamplingParams
    max_frames: int
    encoding: _common_pb2.PcmEncoding
    frames_per_chunk: int
    reference_seconds: float
    cfg_scale_reference: float
    cfg_scale_instruction: float
    def __init__(self, instruction: _Optional[str] = ..., cfg_scale: _Optional[float] = ..., seed: _Optional[int] = ..., template: _Optional[_Union[Template, str]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., max_frames: _Optional[int] = ..., encoding: _Optional[_Union[_common_pb2.PcmEncoding, str]] = ..., frames_per_chunk: _Optional[int] = ..., reference_seconds: _Optional[float] = ..., cfg_scale_reference: _Optional[float] = ..., cfg_scale_instruction: _Optional[float] = ...) -> None: ...

class JobStarted(_message.Message):
    __slots__ = ("job_id", "params", "sample_rate", "encoding", "template", "queue_wait_s", "reference_id", "started_unix_ns", "artifact_id", "artifact_endpoint", "received_unix_ns")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_ID_FIELD_NUMBER: _ClassVar[int]
    STARTED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    params: ResolvedParams
    sample_rate: int
    encoding: _common_pb2.PcmEncoding
    template: Template
    queue_wait_s: float
    reference_id: str
    started_unix_ns: int
    artifact_id: str
    artifact_endpoint: str
    received_unix_ns: int
    def __init__(self, job_id: _Optional[str] = ..., params: _Optional[_Union[ResolvedParams, _Mapping]] = ..., sample_rate: _Optional[int] = ..., encoding: _Optional[_Union[_common_pb2.PcmEncoding, str]] = ..., template: _Optional[_Union[Template, str]] = ..., queue_wait_s: _Optional[float] = ..., reference_id: _Optional[str] = ..., started_unix_ns: _Optional[int] = ..., artifact_id: _Optional[str] = ..., artifact_endpoint: _Optional[str] = ..., received_unix_ns: _Optional[int] = ...) -> None: ...

class AudioChunk(_message.Message):
    __slots__ = ("sequence", "sample_offset", "pcm", "num_samples", "emitted_unix_ns")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    PCM_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    EMITTED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    sample_offset: int
    pcm: bytes
    num_samples: int
    emitted_unix_ns: int
    def __init__(self, sequence: _Optional[int] = ..., sample_offset: _Optional[int] = ..., pcm: _Optional[bytes] = ..., num_samples: _Optional[int] = ..., emitted_unix_ns: _Optional[int] = ...) -> None: ...

class StageTimes(_message.Message):
    __slots__ = ("text_encode_s", "prefill_s", "generate_s", "codec_s")
    TEXT_ENCODE_S_FIELD_NUMBER: _ClassVar[int]
    PREFILL_S_FIELD_NUMBER: _ClassVar[int]
    GENERATE_S_FIELD_NUMBER: _ClassVar[int]
    CODEC_S_FIELD_NUMBER: _ClassVar[int]
    text_encode_s: float
    prefill_s: float
    generate_s: float
    codec_s: float
    def __init__(self, text_encode_s: _Optional[float] = ..., prefill_s: _Optional[float] = ..., generate_s: _Optional[float] = ..., codec_s: _Optional[float] = ...) -> None: ...

class JobStats(_message.Message):
    __slots__ = ("frames", "audio_seconds", "wall_seconds", "rtf", "ttfa_s", "stages", "end_reason", "nonfinite_events", "nonfinite_layer")
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    AUDIO_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WALL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RTF_FIELD_NUMBER: _ClassVar[int]
    TTFA_S_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    END_REASON_FIELD_NUMBER: _ClassVar[int]
    NONFINITE_EVENTS_FIELD_NUMBER: _ClassVar[int]
    NONFINITE_LAYER_FIELD_NUMBER: _ClassVar[int]
    frames: int
    audio_seconds: float
    wall_seconds: float
    rtf: float
    ttfa_s: float
    stages: StageTimes
    end_reason: EndReason
    nonfinite_events: int
    nonfinite_layer: str
    def __init__(self, frames: _Optional[int] = ..., audio_seconds: _Optional[float] = ..., wall_seconds: _Optional[float] = ..., rtf: _Optional[float] = ..., ttfa_s: _Optional[float] = ..., stages: _Optional[_Union[StageTimes, _Mapping]] = ..., end_reason: _Optional[_Union[EndReason, str]] = ..., nonfinite_events: _Optional[int] = ..., nonfinite_layer: _Optional[str] = ...) -> None: ...

class JobFinished(_message.Message):
    __slots__ = ("job_id", "done_unix_ns", "stats", "artifact", "artifact_unavailable")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    DONE_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    done_unix_ns: int
    stats: JobStats
    artifact: _common_pb2.ArtifactInfo
    artifact_unavailable: str
    def __init__(self, job_id: _Optional[str] = ..., done_unix_ns: _Optional[int] = ..., stats: _Optional[_Union[JobStats, _Mapping]] = ..., artifact: _Optional[_Union[_common_pb2.ArtifactInfo, _Mapping]] = ..., artifact_unavailable: _Optional[str] = ...) -> None: ...

class SynthesizeResponse(_message.Message):
    __slots__ = ("started", "chunk", "finished")
    STARTED_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    started: JobStarted
    chunk: AudioChunk
    finished: JobFinished
    def __init__(self, started: _Optional[_Union[JobStarted, _Mapping]] = ..., chunk: _Optional[_Union[AudioChunk, _Mapping]] = ..., finished: _Optional[_Union[JobFinished, _Mapping]] = ...) -> None: ...

class GetWorkerInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("model_description", "is_tiny_default", "warning", "sample_rate", "artifact_endpoint", "ready", "max_text_chars", "max_request_bytes", "version", "artifact_store_degraded", "artifact_disk_free_bytes", "max_active_streams", "ready_streams", "startup_building")
    MODEL_DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    IS_TINY_DEFAULT_FIELD_NUMBER: _ClassVar[int]
    WARNING_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    MAX_TEXT_CHARS_FIELD_NUMBER: _ClassVar[int]
    MAX_REQUEST_BYTES_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_STORE_DEGRADED_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_DISK_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_ACTIVE_STREAMS_FIELD_NUMBER: _ClassVar[int]
    READY_STREAMS_FIELD_NUMBER: _ClassVar[int]
    STARTUP_BUILDING_FIELD_NUMBER: _ClassVar[int]
    model_description: str
    is_tiny_default: bool
    warning: str
    sample_rate: int
    artifact_endpoint: str
    ready: bool
    max_text_chars: int
    max_request_bytes: int
    version: str
    artifact_store_degraded: str
    artifact_disk_free_bytes: int
    max_active_streams: int
    ready_streams: int
    startup_building: str
    def __init__(self, model_description: _Optional[str] = ..., is_tiny_default: _Optional[bool] = ..., warning: _Optional[str] = ..., sample_rate: _Optional[int] = ..., artifact_endpoint: _Optional[str] = ..., ready: _Optional[bool] = ..., max_text_chars: _Optional[int] = ..., max_request_bytes: _Optional[int] = ..., version: _Optional[str] = ..., artifact_store_degraded: _Optional[str] = ..., artifact_disk_free_bytes: _Optional[int] = ..., max_active_streams: _Optional[int] = ..., ready_streams: _Optional[int] = ..., startup_building: _Optional[str] = ...) -> None: ...
