#!/usr/bin/env python
"""Request intake: the worker's own CPU time for each arriving request, measured on any CPU.

A request is checked and its prompt laid out (tokenized) on the worker's event loop, one request after
another (engine/request.py `resolve_request`), so a burst of 64 reaches the engine's queue only as fast as
the loop gets through them. This times that step for the serve benchmark's request mix (client i: an
instruction with CFG when i is odd, a clone of a reference with it when i % 4 == 3; the label's text) with the
full-size checkpoint's tokenizer (`make-checkpoint --size full`), in this checkout and, with --tree, in another
source tree, in separate processes taking turns (--rounds), and prints microseconds per request of each kind
(`breeze_client.bench.RequestMix`'s names), the mix's mean and the ratio to the other tree.

    python benchmarks/request_intake.py --tree ../baseline-checkout --rounds 5 --json intake.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

from bench_env import child_json, compare_trees, describe, take_turns, use_source_tree, write_json

CFG_EVERY, CLONE_EVERY = 2, 4  # serve_bench's mix (breeze-client bench --cfg-every 2 --clone-every 4)


def measure(label: str, reference_text: str, reference_seconds: float, calls: int) -> dict:
    """µs per resolve_request call of each kind, in this process's source tree."""
    import numpy as np

    from breeze_client.bench import LABELS, RequestMix
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
    # each kind of request the client mix sends, as the worker receives it (its reference already taken in)
    mix = RequestMix(cfg_every=CFG_EVERY, clone_every=CLONE_EVERY, reference_audio=b"RIFF",
                     reference_text=reference_text)
    requests = {}
    for i in range(math.lcm(CFG_EVERY, CLONE_EVERY)):
        options = mix.options(i)
        clone = options.get("reference_audio") is not None
        requests[mix.kind(i)] = (SynthesisRequest(
            text=text, seed=1, instruction=options.get("instruction"), cfg_scale=options.get("cfg_scale"),
            reference=ReferenceInput(audio=options["reference_audio"], transcript=options["reference_text"])
            if clone else None), reference if clone else None)
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


def _kinds() -> list[str]:
    """The kind of request each client of one cycle of the mix sends."""
    from breeze_client.bench import RequestMix

    mix = RequestMix(cfg_every=CFG_EVERY, clone_every=CLONE_EVERY)
    return [mix.kind(i) for i in range(math.lcm(CFG_EVERY, CLONE_EVERY))]


def _mix_mean(per_kind: dict) -> float:
    return statistics.fmean(per_kind[kind] for kind in _kinds())


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
                               "reference_seconds": args.reference_seconds, "mix": _kinds(), **summary})


if __name__ == "__main__":
    main()
