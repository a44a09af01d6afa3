"""`breeze-worker audit-syncs`: count device-to-host synchronizations per frame at run time, name their
source lines, and fail (exit 1) when a frame of the fast path exceeds `--budget`; a bad flag, checkpoint or
request exits 2 with one line on stderr. The budget is the fast path's: the eager path is the numerical
reference, which syncs many times a frame by design, so its counts are reported and never fail the run.

Runs one request per decode path (`--path eager|fast|both`) on the model the flags name (default: the
tiny embedded model on the CPU, where device syncs are emulated: see measure/syncaudit.py). Prints a table;
`--json FILE` (or `-` for stdout) writes the full result with every sync event.

    breeze-worker audit-syncs --path both --budget 1     # the fast path within 1; the eager path reported
"""

from __future__ import annotations

import argparse
import datetime
import logging
import sys

import torch

from breeze_worker import jsonout
from breeze_worker.errors import BreezeError
from breeze_worker.measure.setup import (
    add_model_arguments,
    add_request_arguments,
    device_meta,
    parse_paths,
)

log = logging.getLogger("breeze_worker.audit_syncs")

EXIT_OVER_BUDGET = 1
EXIT_USAGE = 2  # bad flags, an unreadable checkpoint, an invalid request: never mistaken for "over budget"
BUDGETED_PATH = "fast"  # the eager path is the numerical reference: its syncs are reported, not judged


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    add_request_arguments(parser, frames=4)
    parser.add_argument("--path", default="both", help="eager | fast | both")
    parser.add_argument("--budget", type=int, default=None, metavar="N",
                        help="fail (exit 1) if any frame of the fast path makes more than N host syncs (setup "
                             "not counted; the eager reference's syncs are reported, never judged)")
    jsonout.add_argument(parser, "write the result as one JSON document, every sync event included, to FILE (- for "
                         "stdout; the table then goes to stderr)")


def audit(args: argparse.Namespace) -> dict:
    """Run the audit the flags describe; the JSON document (`breeze-audit-syncs/1`)."""
    from breeze_worker.config import WorkerSettings
    from breeze_worker.engine.runtime import configure_codec_convolutions, pick_device
    from breeze_worker.measure.audit import SCHEMA, audit_path
    from breeze_worker.measure.setup import load_model, make_request

    if args.budget is not None and args.budget < 0:
        raise ValueError(f"--budget must be 0 or more host syncs per frame, not {args.budget}")
    if args.frames < 1:
        raise ValueError(f"--frames must be at least 1, not {args.frames}")
    paths = parse_paths(args.path)
    if args.budget is not None and BUDGETED_PATH not in paths:
        log.warning("--budget applies to the fast path, which this run does not audit (--path %s): the eager "
                    "path's syncs are reported only", args.path)
    device = pick_device(args.device)
    served = WorkerSettings.from_env().engine  # what the worker would serve with (its environment)
    configure_codec_convolutions(device, served.codec_tf32)
    model = load_model(args, device)
    request = make_request(model, args.text, args.cfg, args.frames, args.seed)
    settings = served.fastpath
    path_docs: list[dict] = []
    doc: dict[str, object] = {
        "schema": SCHEMA,
        "meta": {**device_meta(device), "date": datetime.datetime.now(datetime.UTC).isoformat(
            timespec="seconds"), "model": args.model or f"random-{args.size}", "precision": str(model.dtype),
                 "frames": args.frames, "cfg": bool(args.cfg), "seed": args.seed, "budget": args.budget,
                 "budget_applies_to": BUDGETED_PATH},
        "paths": path_docs,
    }
    for path in paths:
        log.info("auditing the %s path (%d frames)", path, args.frames)
        budget = args.budget if path == BUDGETED_PATH else None
        path_docs.append(audit_path(model, request, device, path, budget, settings=settings))
    doc["within_budget"] = all(p["within_budget"] for p in path_docs)
    return doc


def run(args: argparse.Namespace) -> int:
    from breeze_worker.measure.audit import table

    torch.set_grad_enabled(False)
    try:
        doc = audit(args)
    except (BreezeError, ValueError) as exc:  # a bad flag, checkpoint or request: one line, the usage exit
        print(f"breeze-worker audit-syncs: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(table(doc))
    jsonout.write(doc, args.json)
    if not doc["within_budget"]:
        over = {p["path"]: p["frames_over_budget"] for p in doc["paths"] if not p["within_budget"]}
        log.error("host syncs per frame exceed the budget of %d: %s", args.budget, over)
        return EXIT_OVER_BUDGET
    return 0
