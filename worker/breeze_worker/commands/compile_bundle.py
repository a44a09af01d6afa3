"""`breeze-worker compile --model DIR --out BUNDLE`: compile everything a worker with these settings compiles and
write it as one compile bundle (engine/bundle.py), to install on every host of the same kind
(`serve --compile-bundle BUNDLE`, or BREEZE_ENGINE_COMPILE_BUNDLE).

It takes the engine's settings as `serve` does (the same flags and BREEZE_ENGINE_* variables: the streams,
precision, fast path and codec settings shape what is compiled, and are the bundle's key with the GPU and the
software versions), starts the engine the way `serve --startup whole` would (every batch shape compiled and
captured, every codec batch built), then writes the bundle. Run it on the kind of host that will serve (an
image build step on a GPU builder, or an init container: ops/); a host of another kind refuses the bundle and
compiles as it would without one.

    breeze-worker compile --model /models/Breeze-TTS-2 --device cuda --max-active-streams 64 \\
        --out /var/cache/breeze/h100-64.bundle
"""

from __future__ import annotations

import argparse
import datetime
import logging
import platform
import sys
import time
from pathlib import Path

log = logging.getLogger("breeze_worker.compile")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from breeze_worker.commands.serve import add_arguments as add_settings

    parser.add_argument("--out", required=True, type=Path, metavar="BUNDLE", help="the bundle file to write")
    add_settings(parser, sections=("engine",))


def run(args: argparse.Namespace) -> int:
    from breeze_worker.commands.serve import settings_from_args

    try:
        settings = settings_from_args(args)
    except ValueError as exc:
        print(f"breeze-worker compile: {exc}", file=sys.stderr)
        return 2
    engine = settings.engine.with_changes(startup="whole", compile_bundle=None)
    started = time.perf_counter()
    try:
        from breeze_worker.engine.bundle import bundle_key, collect_parts, write_bundle
        from breeze_worker.engine.precision import choose_policy
        from breeze_worker.engine.runtime import Runtime, pick_device

        runtime = Runtime.load(engine)
        device = pick_device(engine.device)
        policy = choose_policy(engine.precision, device, force=engine.force_precision)
        key = bundle_key(engine, runtime.model, device, policy.name)
        parts = collect_parts()
        built_by: dict[str, object] = {
            "host": platform.node(), "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "seconds": round(time.perf_counter() - started, 1), "stepper": getattr(runtime.stepper, "stats", dict)()}
        header = write_bundle(args.out, key, parts, built_by)
    except (ValueError, OSError) as exc:  # a setting, a checkpoint or the output path to fix: the message says how
        log.error("compile failed: %s", exc)
        return 1
    size = sum(part["bytes"] for part in header["parts"])
    print(f"wrote {args.out}: compile bundle of {size / 1e6:.1f} MB ("
          + ", ".join(f"{p['name']} {p['bytes'] / 1e6:.1f} MB" for p in header["parts"])
          + f") for {key['device']} {key['compute_capability'] or ''} torch {key['torch']}, "
          f"{key['max_active_streams']} streams, precision {key['precision']}; built in "
          f"{time.perf_counter() - started:.1f} s", flush=True)
    return 0
