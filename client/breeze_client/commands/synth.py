"""`breeze-client synth TEXT [--stream] -o out.wav`: run one job, write its audio, print TTFA, RTF and ids.

With --stream the WAV grows as chunks arrive (a player can follow it) and its header is fixed at the
end; without it the audio is written once the job finished. Either way the file is a valid WAV whose
samples are exactly the streamed PCM (the same bytes as the worker's artifact).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from breeze_client import jsonout
from breeze_client.channel import ConnectionOptions
from breeze_client.commands._local import readable_file, writable_file
from breeze_client.commands._output import Progress, print_rows
from breeze_client.errors import BreezeClientError
from breeze_client.sdk import BreezeClient
from breeze_client.types import SynthesisRequest
from breeze_client.wav import StreamingWavWriter, write_wav


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("text", help="the text to speak")
    p.add_argument("-o", "--output", type=Path, default=None, help="WAV file to write (default: none)")
    p.add_argument("--stream", action="store_true", help="write audio to the file as it arrives")
    p.add_argument("--instruction", default=None, help="speaking instruction (voice design / direction)")
    p.add_argument("--cfg-scale", type=float, default=None, help="classifier-free guidance scale (> 0)")
    p.add_argument("--cfg-scale-reference", type=float, default=None,
                   help="voice direction with two guidance scales: the reference's (with --cfg-scale-instruction, "
                        "--ref-audio/--ref-id, --ref-text and --instruction; not with --cfg-scale)")
    p.add_argument("--cfg-scale-instruction", type=float, default=None,
                   help="voice direction with two guidance scales: the instruction's (see --cfg-scale-reference)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: the worker picks and reports one)")
    p.add_argument("--ref-audio", type=Path, default=None, help="reference audio file for cloning")
    p.add_argument("--ref-text", default=None, help="exact transcript of --ref-audio")
    p.add_argument("--ref-id", default=None, help="id of a reference the worker already holds (instead of audio)")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--repetition-penalty", type=float, default=None)
    p.add_argument("--max-frames", type=int, default=None, help="frame limit (12.5 frames per second)")
    p.add_argument("--encoding", choices=("s16le", "f32le"), default="s16le")
    p.add_argument("--frames-per-chunk", type=int, default=1)


def _request(args) -> SynthesisRequest:
    return SynthesisRequest(
        text=args.text, instruction=args.instruction, cfg_scale=args.cfg_scale, seed=args.seed,
        reference_audio=args.ref_audio.read_bytes() if args.ref_audio else None, reference_text=args.ref_text,
        reference_id=args.ref_id, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
        repetition_penalty=args.repetition_penalty, max_frames=args.max_frames, encoding=args.encoding,
        frames_per_chunk=args.frames_per_chunk, cfg_scale_reference=args.cfg_scale_reference,
        cfg_scale_instruction=args.cfg_scale_instruction)


def _guidance(job) -> str:
    if job.cfg_scale_reference is not None:
        return f"guidance: reference {job.cfg_scale_reference:g}, instruction {job.cfg_scale_instruction:g}"
    return f"cfg {job.cfg_scale:g}"


def _left_behind(output: Path | None, writer: StreamingWavWriter | None, stream: bool, sample_rate: int) -> str:
    """What a job that failed or was interrupted left in `output`."""
    if output is None:
        return ""
    if writer is None:
        return (f"{output}: nothing was written (no audio had arrived)" if stream else
                f"{output}: nothing was written (without --stream the WAV is written when the job ends)")
    width = 2 if writer.encoding == "s16le" else 4
    seconds = writer.data_bytes / width / max(sample_rate, 1)
    return (f"{output}: a partial WAV of the {seconds:.2f} s of audio that arrived ({writer.data_bytes} bytes of "
            "audio; its header is complete, so it plays)")


def run(args: argparse.Namespace, options: ConnectionOptions) -> int:
    if args.ref_audio is not None:
        readable_file("--ref-audio", args.ref_audio, "audio file (WAV, FLAC or OGG)")
    if args.output is not None:
        writable_file("-o", args.output)
    request = _request(args)
    progress = Progress("synth")
    with BreezeClient(options=options) as client:
        info = client.worker_info()
        if info.warning:
            print(f"warning: {info.warning}", file=sys.stderr)
        writer = None
        # leaving early (Ctrl-C, a deadline, a write error) hangs up, so the worker frees the job's slot at once;
        # the WAV written so far is closed with a valid header either way, and the error says what it holds
        with client.stream(request, collect_audio=not args.stream) as stream:
            try:
                for chunk in stream:
                    if args.stream and args.output is not None:
                        if writer is None:
                            writer = StreamingWavWriter(args.output, stream.job.encoding, stream.job.sample_rate)
                        writer.write(chunk.pcm)
                    seconds = (chunk.sample_offset + chunk.num_samples) / max(stream.job.sample_rate, 1)
                    progress.update(f"{stream.job.job_id}: {seconds:6.2f} s of audio, {chunk.sequence + 1} chunks")
            except (BreezeClientError, KeyboardInterrupt) as exc:
                progress.done()
                if writer is not None:
                    writer.close()
                rate = stream.job.sample_rate if stream.job is not None else 0
                note = _left_behind(args.output, writer, args.stream, rate)
                if note:
                    exc.add_note(note)
                raise
            finally:
                progress.done()
                written_ns = writer.close() if writer is not None else None
        result = stream.result
        if args.output is not None and not args.stream:
            written_ns = write_wav(args.output, result.audio, result.job.encoding, result.job.sample_rate)
        elif args.output is not None and writer is None:  # a job without audio still gets a valid (empty) WAV
            written_ns = write_wav(args.output, b"", result.job.encoding, result.job.sample_rate)
    timing = dataclasses.replace(result.timing, audio_written_ns=written_ns)
    result = dataclasses.replace(result, timing=timing)
    out = result.to_dict()
    out["output"] = str(args.output) if args.output else None
    out["worker_warning"] = info.warning
    jsonout.write(out, args.json)
    s, job, a = result.stats, result.job, result.artifact
    ttfa = f"{timing.ttfa_ms:.1f} ms" if timing.ttfa_ms is not None else "- (no audio)"
    rows = [
        ("job", f"{job.job_id}  (template {job.template}, seed {job.seed}, {_guidance(job)}, "
                f"queue {job.queue_wait_s:.3f} s)"),
        ("TTFA", f"{ttfa} request sent -> first audio received (worker: {s.ttfa_s * 1e3:.1f} ms)"),
        ("RTF", f"{s.rtf:.3f}  ({s.wall_seconds:.2f} s for {s.audio_seconds:.2f} s of audio, {s.frames} frames, "
                f"{s.end_reason})"),
        ("artifact", f"{a.artifact_id}  {a.size_bytes} bytes  sha256 {a.sha256[:16]}...  at {a.endpoint}"
         if a else f"none: {result.artifact_unavailable or 'not written'}"),
    ]
    if job.reference_id:
        rows.append(("reference", f"{job.reference_id}  (reuse with --ref-id)"))
    if args.output is not None:
        rows.append(("wrote", f"{args.output}{'  (streamed)' if args.stream else ''}"))
    print_rows(rows)
    return 0
