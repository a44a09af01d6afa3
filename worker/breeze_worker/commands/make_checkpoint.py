"""`breeze-worker make-checkpoint --size full|mid|tiny OUT`: a checkpoint directory in the official layout with
seeded random weights (language model, tokenizer, and the codec with its encoder and decoder), so the loader,
the reference path and the whole worker run at the released sizes without a download.

Its audio is NOT speech (random weights): it is for speed, memory and start-up measurements.

    breeze-worker make-checkpoint --size full /models/synthetic-full      # ~7 GB, bf16
    breeze-worker serve --model /models/synthetic-full --device cuda
"""

from __future__ import annotations

import argparse
import logging
import time

log = logging.getLogger("breeze_worker.make_checkpoint")

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", metavar="OUT", help="directory to write (created; must be empty)")
    parser.add_argument("--size", default="full", choices=("full", "mid", "tiny"),
                        help="full: the released sizes (~7 GB in bf16); mid: full widths, few layers; tiny")
    parser.add_argument("--seed", type=int, default=0, help="weight seed (same seed, same files)")
    parser.add_argument("--dtype", default="bf16", choices=tuple(DTYPES),
                        help="storage dtype of the language model's weights (the release ships bf16)")


def run(args: argparse.Namespace) -> int:
    import torch

    from breeze_worker.model.synthetic import write_synthetic_checkpoint

    started = time.perf_counter()
    try:
        out = write_synthetic_checkpoint(args.out, args.size, args.seed, getattr(torch, DTYPES[args.dtype]))
    except FileExistsError as exc:
        log.error("%s", exc)
        return 2
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"wrote {out}: synthetic {args.size}-size checkpoint, seed {args.seed}, {size / 1e9:.2f} GB in "
          f"{time.perf_counter() - started:.1f} s. Its audio is NOT speech (random weights).")
    return 0
