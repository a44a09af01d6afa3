"""`breeze-worker trace --trace FILE.json`: one streaming request, recorded as a Chrome / Perfetto trace
(open it in https://ui.perfetto.dev or chrome://tracing) with a mark at every host sync; prints the time
per span name. A warm-up request runs first, untraced (the fast path captures its CUDA graphs there).

    breeze-worker trace --path eager --frames 8 --trace eager.json
"""

from __future__ import annotations

import argparse
import datetime
import sys

import torch

from breeze_worker import jsonout
from breeze_worker.errors import BreezeError
from breeze_worker.measure.setup import add_model_arguments, add_request_arguments, device_meta


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    add_request_arguments(parser, frames=8)
    parser.add_argument("--path", default="eager", choices=("eager", "fast"), help="decode path to trace")
    parser.add_argument("--trace", required=True, metavar="FILE.json", help="where to write the trace")
    parser.add_argument("--no-sync-marks", action="store_true",
                        help="no gpu_sync marks (the sync detector slows every tensor operation down)")
    jsonout.add_argument(parser, "write the span summary as one JSON document to FILE (- for stdout; the table "
                                 "then goes to stderr)")


def run(args: argparse.Namespace) -> int:
    from breeze_worker.config import WorkerSettings
    from breeze_worker.engine.runtime import configure_codec_convolutions, pick_device
    from breeze_worker.engine.tracing import Tracer
    from breeze_worker.measure.setup import frame_source, load_model, make_request
    from breeze_worker.measure.trace import summarize, table, trace_request

    torch.set_grad_enabled(False)
    try:
        if args.frames < 1:
            raise ValueError(f"--frames must be at least 1, not {args.frames}")
        device = pick_device(args.device)
        served = WorkerSettings.from_env().engine  # what the worker would serve with (its environment)
        configure_codec_convolutions(device, served.codec_tf32)
        model = load_model(args, device)
        request = make_request(model, args.text, args.cfg, args.frames, args.seed)
        settings = served.fastpath
        for _ in frame_source(args.path, model, request, device, settings=settings):  # warm-up, untraced
            pass
        tracer = Tracer(nvtx=device.type == "cuda")  # NVTX ranges too, for Nsight Systems
        frames = trace_request(model, request, device, args.path, tracer, sync_marks=not args.no_sync_marks,
                               settings=settings)
    except (BreezeError, ValueError) as exc:  # a bad flag, checkpoint or request: one line, usage exit
        print(f"breeze-worker trace: {exc}", file=sys.stderr)
        return 2
    meta = {**device_meta(device), "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "model": args.model or f"random-{args.size}", "precision": str(model.dtype), "path": args.path,
            "frames": frames, "cfg": bool(args.cfg), "sync_marks": not args.no_sync_marks}
    tracer.write(args.trace, meta)
    rows = summarize(tracer)
    print(table(rows), file=sys.stderr if args.json == "-" else sys.stdout)
    print(f"wrote {args.trace} ({len(tracer.events)} events, {frames} frames)",
          file=sys.stderr if args.json == "-" else sys.stdout)
    jsonout.write({"schema": "breeze-trace-summary/1", "meta": meta, "trace": args.trace, "spans": rows}, args.json)
    return 0
