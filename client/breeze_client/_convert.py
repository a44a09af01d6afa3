"""Conversion between the SDK's types and the protobuf messages (shared by the sync and asyncio clients)."""

from __future__ import annotations

from breeze_client.clock import ClockMapping
from breeze_client.types import (
    ArtifactRef,
    CommitTiming,
    JobInfo,
    JobStats,
    SamplingParams,
    StageTimes,
    SynthesisRequest,
    WorkerInfo,
)
from breeze_tts_proto.v1 import artifacts_pb2, common_pb2, synthesis_pb2

ENCODINGS = {"s16le": common_pb2.PCM_ENCODING_S16LE, "f32le": common_pb2.PCM_ENCODING_F32LE}
ENCODING_NAMES = {v: k for k, v in ENCODINGS.items()}
COMPRESSIONS = {"none": artifacts_pb2.COMPRESSION_NONE, "zstd": artifacts_pb2.COMPRESSION_ZSTD}
_TEMPLATES = {synthesis_pb2.TEMPLATE_PLAIN: "plain", synthesis_pb2.TEMPLATE_INSTRUCTION: "instruction",
              synthesis_pb2.TEMPLATE_CLONE: "clone", synthesis_pb2.TEMPLATE_DIRECTION: "direction"}
_END_REASONS = {synthesis_pb2.END_REASON_END_OF_SPEECH: "end_of_speech",
                synthesis_pb2.END_REASON_FRAME_LIMIT: "frame_limit",
                synthesis_pb2.END_REASON_CANCELLED: "cancelled", synthesis_pb2.END_REASON_ERROR: "error"}


def request_to_pb(req: SynthesisRequest) -> synthesis_pb2.SynthesizeRequest:
    if req.encoding not in ENCODINGS:
        raise ValueError(f"encoding must be one of {sorted(ENCODINGS)}, not {req.encoding!r}")
    msg = synthesis_pb2.SynthesizeRequest(text=req.text, encoding=ENCODINGS[req.encoding],
                                          frames_per_chunk=req.frames_per_chunk, request_id=req.request_id or "")
    for name in ("instruction", "cfg_scale", "seed", "max_frames", "cfg_scale_reference", "cfg_scale_instruction"):
        value = getattr(req, name)
        if value is not None:
            setattr(msg, name, value)
    for name in ("temperature", "top_k", "top_p", "repetition_penalty"):
        value = getattr(req, name)
        if value is not None:
            setattr(msg.sampling, name, value)
    if req.reference_audio is not None or req.reference_id is not None or req.reference_text is not None:
        if req.reference_audio is not None:
            msg.reference.audio = req.reference_audio
        elif req.reference_id is not None:
            msg.reference.reference_id = req.reference_id
        msg.reference.transcript = req.reference_text or ""
    return msg


def job_from_pb(m: synthesis_pb2.JobStarted, clock: ClockMapping) -> JobInfo:
    p = m.params
    return JobInfo(
        job_id=m.job_id, template=_TEMPLATES.get(m.template, "unspecified"), seed=p.seed, cfg_scale=p.cfg_scale,
        instruction=p.instruction,
        sampling=SamplingParams(p.sampling.temperature, p.sampling.top_k, p.sampling.top_p,
                                p.sampling.repetition_penalty),
        max_frames=p.max_frames, encoding=ENCODING_NAMES.get(m.encoding, "s16le"),
        frames_per_chunk=p.frames_per_chunk, sample_rate=m.sample_rate, queue_wait_s=m.queue_wait_s,
        reference_id=m.reference_id, reference_seconds=p.reference_seconds,
        server_started_ns=clock.to_client(m.started_unix_ns), artifact_id=m.artifact_id,
        artifact_endpoint=m.artifact_endpoint,
        server_received_ns=clock.to_client(m.received_unix_ns),
        cfg_scale_reference=p.cfg_scale_reference if p.HasField("cfg_scale_reference") else None,
        cfg_scale_instruction=p.cfg_scale_instruction if p.HasField("cfg_scale_instruction") else None)


def stats_from_pb(s: synthesis_pb2.JobStats) -> JobStats:
    st = s.stages
    return JobStats(frames=s.frames, audio_seconds=s.audio_seconds, wall_seconds=s.wall_seconds, rtf=s.rtf,
                    ttfa_s=s.ttfa_s, stages=StageTimes(st.text_encode_s, st.prefill_s, st.generate_s, st.codec_s),
                    end_reason=_END_REASONS.get(s.end_reason, "unspecified"), nonfinite_events=s.nonfinite_events,
                    nonfinite_layer=s.nonfinite_layer)


def artifact_from_pb(a: common_pb2.ArtifactInfo, clock: ClockMapping) -> ArtifactRef:
    commit = None
    if a.HasField("commit"):
        c = a.commit
        commit = CommitTiming(server_started_ns=clock.to_client(c.started_unix_ns), bytes_synced=c.bytes_synced,
                              wav_fsync_ns=c.wav_fsync_ns, hash_ns=c.hash_ns, rename_ns=c.rename_ns,
                              sidecar_fsync_ns=c.sidecar_fsync_ns, dir_fsync_ns=c.dir_fsync_ns)
    return ArtifactRef(artifact_id=a.artifact_id, size_bytes=a.size_bytes, sha256=a.sha256, endpoint=a.endpoint,
                       server_committed_ns=clock.to_client(a.committed_unix_ns), commit=commit,
                       clock_offset_ns=clock.offset_ns)


def worker_info_from_pb(m: synthesis_pb2.WorkerInfo) -> WorkerInfo:
    return WorkerInfo(model_description=m.model_description, is_tiny_default=m.is_tiny_default, warning=m.warning,
                      sample_rate=m.sample_rate, artifact_endpoint=m.artifact_endpoint, ready=m.ready,
                      max_text_chars=m.max_text_chars, max_request_bytes=m.max_request_bytes, version=m.version,
                      artifact_store_degraded=m.artifact_store_degraded,
                      artifact_disk_free_bytes=m.artifact_disk_free_bytes, max_active_streams=m.max_active_streams,
                      ready_streams=m.ready_streams, startup_building=m.startup_building)
