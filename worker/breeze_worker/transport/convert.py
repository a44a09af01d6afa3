"""Conversion between protobuf messages and engine types; no logic beyond mapping and unset fields.

Unset optional proto fields become None so the engine fills its defaults; enums map one to one and an
unknown enum number is an InvalidRequest that names the field.
"""

from __future__ import annotations

from breeze_tts_proto.v1 import common_pb2, synthesis_pb2
from breeze_worker.engine import types as et
from breeze_worker.errors import InvalidRequest

_ENCODING_FROM_PB = {
    common_pb2.PCM_ENCODING_UNSPECIFIED: et.PcmEncoding.S16LE,
    common_pb2.PCM_ENCODING_S16LE: et.PcmEncoding.S16LE,
    common_pb2.PCM_ENCODING_F32LE: et.PcmEncoding.F32LE,
}
_ENCODING_TO_PB = {et.PcmEncoding.S16LE: common_pb2.PCM_ENCODING_S16LE,
                   et.PcmEncoding.F32LE: common_pb2.PCM_ENCODING_F32LE}
_TEMPLATE_TO_PB = {
    et.Template.PLAIN: synthesis_pb2.TEMPLATE_PLAIN,
    et.Template.INSTRUCTION: synthesis_pb2.TEMPLATE_INSTRUCTION,
    et.Template.CLONE: synthesis_pb2.TEMPLATE_CLONE,
    et.Template.DIRECTION: synthesis_pb2.TEMPLATE_DIRECTION,
}
_END_REASON_TO_PB = {
    et.EndReason.END_OF_SPEECH: synthesis_pb2.END_REASON_END_OF_SPEECH,
    et.EndReason.FRAME_LIMIT: synthesis_pb2.END_REASON_FRAME_LIMIT,
    et.EndReason.CANCELLED: synthesis_pb2.END_REASON_CANCELLED,
    et.EndReason.ERROR: synthesis_pb2.END_REASON_ERROR,
}


def _opt(msg, name: str):
    return getattr(msg, name) if msg.HasField(name) else None


def encoding_from_pb(value: common_pb2.PcmEncoding) -> et.PcmEncoding:
    try:
        return _ENCODING_FROM_PB[value]
    except KeyError:
        raise InvalidRequest(f"encoding {value} is unknown: use PCM_ENCODING_S16LE or PCM_ENCODING_F32LE") from None


def synthesis_request_from_pb(msg: synthesis_pb2.SynthesizeRequest) -> et.SynthesisRequest:
    reference = None
    if msg.HasField("reference"):
        ref = msg.reference
        source = ref.WhichOneof("source")
        reference = et.ReferenceInput(
            audio=ref.audio if source == "audio" else None,
            transcript=ref.transcript or None,
            reference_id=ref.reference_id if source == "reference_id" else None,
        )
    sampling = et.SamplingOverrides()
    if msg.HasField("sampling"):
        s = msg.sampling
        sampling = et.SamplingOverrides(temperature=_opt(s, "temperature"), top_k=_opt(s, "top_k"),
                                        top_p=_opt(s, "top_p"), repetition_penalty=_opt(s, "repetition_penalty"))
    return et.SynthesisRequest(
        text=msg.text,
        instruction=_opt(msg, "instruction"),
        cfg_scale=_opt(msg, "cfg_scale"),
        seed=_opt(msg, "seed"),
        reference=reference,
        sampling=sampling,
        max_frames=_opt(msg, "max_frames"),
        encoding=encoding_from_pb(msg.encoding),
        frames_per_chunk=msg.frames_per_chunk or 1,
        request_id=msg.request_id or None,
        cfg_scale_reference=_opt(msg, "cfg_scale_reference"),
        cfg_scale_instruction=_opt(msg, "cfg_scale_instruction"),
    )


def artifact_to_pb(info: et.ArtifactInfo, endpoint: str) -> common_pb2.ArtifactInfo:
    msg = common_pb2.ArtifactInfo(artifact_id=info.artifact_id, size_bytes=info.size_bytes, sha256=info.sha256,
                                  committed_unix_ns=info.committed_at_ns, endpoint=endpoint)
    c = info.commit
    if c is not None:
        msg.commit.CopyFrom(common_pb2.CommitTiming(
            started_unix_ns=c.started_at_ns, bytes_synced=c.bytes_synced, wav_fsync_ns=c.wav_fsync_ns,
            hash_ns=c.hash_ns, rename_ns=c.rename_ns, sidecar_fsync_ns=c.sidecar_fsync_ns,
            dir_fsync_ns=c.dir_fsync_ns))
    return msg


def _params_to_pb(p: et.ResolvedRequest) -> synthesis_pb2.ResolvedParams:
    return synthesis_pb2.ResolvedParams(
        instruction=p.instruction or "",
        cfg_scale=p.cfg_scale,
        seed=p.seed,
        template=_TEMPLATE_TO_PB[et.Template(p.template)],
        sampling=synthesis_pb2.SamplingParams(temperature=p.sampling.temperature, top_k=p.sampling.top_k,
                                              top_p=p.sampling.top_p,
                                              repetition_penalty=p.sampling.repetition_penalty),
        max_frames=p.max_frames,
        encoding=_ENCODING_TO_PB[et.PcmEncoding(p.encoding)],
        frames_per_chunk=p.frames_per_chunk,
        reference_seconds=p.reference.seconds if p.reference is not None else 0.0,
        cfg_scale_reference=p.cfg_scale_reference, cfg_scale_instruction=p.cfg_scale_instruction,
    )


def event_to_pb(event, artifact_endpoint: str) -> synthesis_pb2.SynthesizeResponse:
    """One engine event (JobStarted | AudioChunk | JobFinished) as a stream message."""
    if isinstance(event, et.AudioChunk):
        return synthesis_pb2.SynthesizeResponse(chunk=synthesis_pb2.AudioChunk(
            sequence=event.sequence, sample_offset=event.sample_offset, pcm=event.pcm,
            num_samples=event.num_samples, emitted_unix_ns=event.emitted_at_ns))
    if isinstance(event, et.JobStarted):
        p = event.params
        return synthesis_pb2.SynthesizeResponse(started=synthesis_pb2.JobStarted(
            job_id=event.job_id, params=_params_to_pb(p), sample_rate=event.sample_rate,
            encoding=_ENCODING_TO_PB[et.PcmEncoding(p.encoding)], template=_TEMPLATE_TO_PB[et.Template(p.template)],
            queue_wait_s=event.queue_wait_s,
            reference_id=p.reference.reference_id if p.reference is not None else "",
            started_unix_ns=event.started_at_ns, artifact_id=event.artifact_id,
            artifact_endpoint=artifact_endpoint, received_unix_ns=event.received_at_ns))
    if isinstance(event, et.JobFinished):
        s = event.stats
        finished = synthesis_pb2.JobFinished(
            job_id=event.job_id, done_unix_ns=event.done_at_ns,
            stats=synthesis_pb2.JobStats(
                frames=s.frames, audio_seconds=s.audio_seconds, wall_seconds=s.wall_seconds, rtf=s.rtf,
                ttfa_s=s.ttfa_s,
                stages=synthesis_pb2.StageTimes(text_encode_s=s.stages.text_encode_s, prefill_s=s.stages.prefill_s,
                                                generate_s=s.stages.generate_s, codec_s=s.stages.codec_s),
                end_reason=_END_REASON_TO_PB[et.EndReason(s.end_reason)],
                nonfinite_events=s.nonfinite_events, nonfinite_layer=s.nonfinite_layer))
        if event.artifact is not None:
            finished.artifact.CopyFrom(artifact_to_pb(event.artifact, artifact_endpoint))
        else:
            finished.artifact_unavailable = event.artifact_unavailable or "no artifact was written for this job"
        return synthesis_pb2.SynthesizeResponse(finished=finished)
    raise TypeError(f"unknown engine event {type(event).__name__}")
