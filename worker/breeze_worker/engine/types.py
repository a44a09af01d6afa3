"""Plain types shared by the engine and the transport edge (which converts them to and from protobuf).

A `SynthesisRequest` is what the caller asked for (unset fields are None). `resolve_request`
(engine/request.py) validates it and fills defaults, giving a `ResolvedRequest`: the parameters actually
used, reported back to the caller in the stream's start message.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np


class Template(str, enum.Enum):
    """Which of the model's four prompt templates a request uses (chosen from which inputs it has)."""

    PLAIN = "plain"  # text only; no negative branch, cfg_scale must be 1
    INSTRUCTION = "instruction"  # instruction, no reference (voice design); negative = plain prompt
    CLONE = "clone"  # reference audio + exact transcript; no negative branch, cfg_scale must be 1
    DIRECTION = "direction"  # reference + transcript + instruction; negative = the clone prompt, or with two
    # guidance scales the three branches instruction / clone / plain (ResolvedRequest.dual_cfg)


class EndReason(str, enum.Enum):
    END_OF_SPEECH = "end_of_speech"  # the backbone sampled the end-of-speech class (2051)
    FRAME_LIMIT = "frame_limit"  # the request's frame limit was reached
    CANCELLED = "cancelled"  # the caller went away or its deadline passed
    ERROR = "error"  # the job failed; see the error


class PcmEncoding(str, enum.Enum):
    S16LE = "s16le"
    F32LE = "f32le"

    @property
    def sample_width(self) -> int:
        return 2 if self is PcmEncoding.S16LE else 4


@dataclass(frozen=True)
class SamplingOverrides:
    """Per-request sampling settings; None means "the checkpoint's default" (generation_config.json)."""

    temperature: float | None = None  # 0 means greedy (argmax everywhere)
    top_k: int | None = None  # 0 means no top-k filter
    top_p: float | None = None  # 1.0 means no nucleus filter
    repetition_penalty: float | None = None  # on the codebook-0 history only; 1.0 disables


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings actually used (backbone codebook 0 and every depth step)."""

    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.1

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class ReferenceInput:
    """Reference audio for cloning: raw file bytes + exact transcript, or the id of one the worker holds."""

    audio: bytes | None = None
    transcript: str | None = None
    reference_id: str | None = None


@dataclass(frozen=True)
class SynthesisRequest:
    text: str
    instruction: str | None = None
    cfg_scale: float | None = None  # None: 1.0 for plain/clone, the checkpoint default otherwise
    seed: int | None = None  # None: the worker draws one and reports it
    reference: ReferenceInput | None = None
    # voice direction's two guidance scales (both or neither; direction template only, without cfg_scale)
    cfg_scale_reference: float | None = None
    cfg_scale_instruction: float | None = None
    sampling: SamplingOverrides = field(default_factory=SamplingOverrides)
    max_frames: int | None = None  # None: follows the text's length (see engine/request.py)
    encoding: PcmEncoding = PcmEncoding.S16LE
    frames_per_chunk: int = 1
    request_id: str | None = None  # for logs; the worker assigns the job id


@dataclass(frozen=True)
class ResolvedReference:
    """A reference after intake: the id the worker holds it under, its transcript and its codes [T, 16]."""

    reference_id: str
    transcript: str
    codes: np.ndarray  # int64 [T, 16]
    seconds: float


@dataclass(frozen=True)
class LaidOutPrompt:
    """A request's prompt token layouts, made once when it is resolved (engine/prompt.py `lay_out`):
    [positive], [positive, negative] with CFG, or [instruction, clone, plain] with two guidance scales
    (model/prompts.py PromptLayout), and what they were made from, so a changed request is laid out again
    rather than served stale layouts."""

    layouts: tuple  # tuple[prompts.PromptLayout, ...]
    source: tuple  # (tokenizer identity, template, text, instruction, transcript, reference frames, branches)


@dataclass(frozen=True)
class ResolvedRequest:
    """The parameters actually used for one job (reported back in the start message)."""

    text: str
    instruction: str | None
    cfg_scale: float
    seed: int
    template: Template
    sampling: SamplingParams
    max_frames: int
    encoding: PcmEncoding
    frames_per_chunk: int
    reference: ResolvedReference | None = None
    # the prompt's token layouts from validation, carried to the join (None: laid out there)
    prompt: LaidOutPrompt | None = field(default=None, compare=False, repr=False)
    # voice direction's two guidance scales (both set or both None; with them cfg_scale is 1, unused): logits
    # u + cfg_scale_reference * (r - u) + cfg_scale_instruction * (i - u) over the plain, clone and
    # instruction prompts
    cfg_scale_reference: float | None = None
    cfg_scale_instruction: float | None = None

    @property
    def dual_cfg(self) -> bool:
        return self.cfg_scale_reference is not None and self.cfg_scale_instruction is not None

    @property
    def uses_cfg(self) -> bool:
        """Whether the prompt has more than one branch (one guidance scale, or two)."""
        return self.cfg_scale != 1.0 or self.dual_cfg

    @property
    def branches(self) -> int:
        """Model rows the request takes: 1 without guidance, 2 with one scale, 3 with two."""
        return 3 if self.dual_cfg else 2 if self.cfg_scale != 1.0 else 1


# ---- events the engine yields for one job, in order: JobStarted, AudioChunk*, JobFinished ----


@dataclass(frozen=True)
class JobStarted:
    job_id: str
    params: ResolvedRequest
    sample_rate: int
    queue_wait_s: float
    started_at_ns: int  # server wall clock (time.time_ns)
    artifact_id: str = ""  # the id its artifact gets once committed ("" without an artifact writer)
    received_at_ns: int = 0  # server wall clock when the request reached the transport's handler (0: unknown)


@dataclass(frozen=True)
class AudioChunk:
    sequence: int  # 0, 1, 2, ...
    sample_offset: int  # index of this chunk's first sample in the job's audio
    pcm: bytes  # encoded as the request's PcmEncoding, little endian, mono
    num_samples: int
    emitted_at_ns: int  # server wall clock when the chunk left the engine


@dataclass(frozen=True)
class StageTimes:
    """Seconds spent per stage of one job."""

    text_encode_s: float = 0.0
    prefill_s: float = 0.0
    generate_s: float = 0.0  # backbone + depth decoder + sampling, all frames
    codec_s: float = 0.0


@dataclass(frozen=True)
class JobStats:
    frames: int
    audio_seconds: float
    wall_seconds: float  # from job start (after queue) to job done
    rtf: float  # wall / audio (lower is better)
    ttfa_s: float  # job start -> first audio chunk emitted
    stages: StageTimes
    end_reason: EndReason
    nonfinite_events: int = 0  # frames recomputed at a safe precision after a non-finite value (recovered)
    nonfinite_layer: str = ""  # the first layer that overflowed in the first of them ("" when none or unknown)


@dataclass(frozen=True)
class CommitTiming:
    """The timed steps of one artifact commit (durations in ns; `started_at_ns` on the wall clock)."""

    started_at_ns: int  # the artifact writer took the job up (generation was done)
    bytes_synced: int  # what the syncs still had to write: the WAV's part not yet on the volume, and the sidecar
    wav_fsync_ns: int  # header write + fsync of the WAV
    hash_ns: int  # reading the WAV back for its SHA-256: the part after the fsync (it runs alongside it)
    rename_ns: int
    sidecar_fsync_ns: int = 0  # sidecar write + fsync + rename (unknown to Stat: 0)
    dir_fsync_ns: int = 0  # directory fsync (unknown to Stat: 0)


@dataclass(frozen=True)
class ArtifactInfo:
    artifact_id: str
    size_bytes: int
    sha256: str
    committed_at_ns: int
    commit: CommitTiming | None = None  # how the commit went (None: not recorded)


@dataclass(frozen=True)
class JobFinished:
    job_id: str
    done_at_ns: int  # server wall clock when generation finished (before the artifact commit)
    stats: JobStats
    artifact: ArtifactInfo | None
    artifact_unavailable: str | None = None  # why `artifact` is None although the audio streamed to the end
