#!/usr/bin/env python
"""Request intake: the worker's own CPU time for each arriving request, measured on any CPU.

A request is checked and its prompt laid out (tokenized) on the worker's event loop, one request after
another (engine/request.py `resolve_request`), so a burst of 64 reaches the engine's queue only as fast as
the loop gets through them. This times that step for the serve benchmark's request mix (client i: an
instruction with CFG when i is odd, a clone of a reference with it when i % 4 == 3; the label's text) with the
full-size checkpoint's tokenizer (`make-checkpoint --size full`), in this checkout and, with --tree, in another
source tree, in separate processes taking turns (--rounds), and prints microseconds per request of each kind,
the mix's mean and the ratio to the other tree.

    python benchmarks/request_intake.py --tree ../baseline-checkout --rounds 5 --json intake.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from bench_env import child_json, compare_trees, describe, take_turns, use_source_tree, write_json

KINDS = ("plain", "instruction+cfg", "plain", "clone+instruction+cfg")  # clients 0..3 of every 4 in the mix
INSTRUCTION = "Speak clearly and naturally."  # breeze_client.bench's mix default
CFG_SCALE = 2.0


def measure(label: str, reference_text: str, reference_seconds: float, calls: int) -> dict:
    """µs per resolve_request call of each kind, in this process's source tree."""
    import numpy as np

    from breeze_client.bench import LABELS
    from breeze_worker.engine.request import resolve_request
    from breeze_worker.engine.types import ReferenceInput, ResolvedReference, SynthesisRequest
    from breeze_worker.model.loaded import GenerationDefaults
    from breeze_worker.model.synthetic import WORDS, config_for
    from breeze_worker.model.tokenizer import BreezeTokenizer

    config = config_for("full")
    tokenizer = BreezeTokenizer.tiny(config, WORDS)
    defaults = GenerationDefaults()
    text = LABELS[label].text
    frames = max(1, round(reference_seconds * defaults.frame_rate))
    reference = ResolvedReference(reference_id="ref-" + "0" * 32, transcript=reference_text,
                                  codes=np.zeros((frames, 16), dtype=np.int64), seconds=reference_seconds)
    requests = {
        "plain": (SynthesisRequest(text=text, seed=1), None),
        "instruction+cfg": (SynthesisRequest(text=text, instruction=INSTRUCTION, cfg_scale=CFG_SCALE, seed=1), None),
        "clone+instruction+cfg": (SynthesisRequest(
            text=text, instruction=INSTRUCTION, cfg_scale=CFG_SCALE, seed=1,
            reference=ReferenceInput(audio=b"RIFF", transcript=reference_text)), reference),
    }
    out = {}
    for kind, (request, ref) in requests.items():
        resolve_request(request, defaults, ref, tokenizer=tokenizer)  # first call outside the timing
        start = time.perf_counter()
        for _ in range(calls):
            resolve_request(request, defaults, ref, tokenizer=tokenizer)
        out[kind] = (time.perf_counter() - start) / calls * 1e6
    return out


def _child(tree: Path | None, args) -> dict:
    return child_json(__file__, ["--measure", "--label", args.label, "--reference-text", args.reference_text,
                                 "--reference-seconds", str(args.reference_seconds), "--calls", str(args.calls)],
                      tree)


def _mix_mean(per_kind: dict) -> float:
    return statistics.fmean(per_kind[kind] for kind in KINDS)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", default=None, help="another source tree to compare (a baseline checkout)")
    p.add_argument("--rounds", type=int, default=5, help="turns each tree takes, alternated")
    p.add_argument("--calls", type=int, default=300, help="calls per kind in a turn")
    p.add_argument("--label", default="chunk-7.36s", help="breeze-client bench label whose text is spoken")
    p.add_argument("--reference-text", default="Please call Stella. Ask her to bring these things with her "
                                               "from the store.")
    p.add_argument("--reference-seconds", type=float, default=4.08, help="the reference audio's length")
    p.add_argument("--json", default=None)
    p.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.measure:
        print(json.dumps(measure(args.label, args.reference_text, args.reference_seconds, args.calls)))
        return
    use_source_tree()
    turns = take_turns(args.tree, args.rounds, lambda tree: _child(tree, args))
    summary: dict = {}
    for name, runs in turns.items():
        kinds = {kind: statistics.median(run[kind] for run in runs) for kind in runs[0]}
        summary[name] = {"us_per_request": kinds, "mix_mean_us": statistics.median(_mix_mean(r) for r in runs),
                         "mix_mean_us_range": [min(map(_mix_mean, runs)), max(map(_mix_mean, runs))]}
        cells = ", ".join(f"{kind} {us:.0f}" for kind, us in kinds.items())
        print(f"{name}: mix mean {summary[name]['mix_mean_us']:.0f} µs a request ({cells}; medians of "
              f"{args.rounds} turns)")
    compare_trees(summary, "mix_mean_us", "the CPU time a request")
    if args.json:
        write_json(args.json, {"schema": "breeze-request-intake/1", "meta": describe(), "tree": args.tree,
                               "rounds": args.rounds, "calls": args.calls, "label": args.label,
                               "reference_seconds": args.reference_seconds, "mix": list(KINDS), **summary})


if __name__ == "__main__":
    main()
