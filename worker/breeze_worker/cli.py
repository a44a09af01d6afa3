"""`breeze-worker`: one entry point, one module per subcommand under `breeze_worker.commands`.

Each command module defines `add_arguments(parser)` and `run(args) -> int`. Modules are imported only
when their subcommand runs, so `breeze-worker serve` never imports the benchmark code and vice versa.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

# subcommand -> (module under breeze_worker.commands, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("serve", "run the gRPC worker (Synthesize stream + artifact channel)"),
    "bench": ("bench", "engine benchmark: eager reference vs fast path, stage split, memory, syncs"),
    "audit-syncs": ("audit_syncs", "count device-to-host synchronizations per frame; fail over a budget"),
    "precision-check": ("precision_check", "compare precision policies against FP32, teacher-forced"),
    "trace": ("trace", "trace one streaming request as a Chrome / Perfetto trace (--trace FILE.json)"),
    "make-checkpoint": ("make_checkpoint", "write a synthetic checkpoint (official layout, random weights; "
                                           "its audio is NOT speech)"),
}


def _load(name: str):
    return importlib.import_module(f"breeze_worker.commands.{COMMANDS[name][0]}")


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="breeze-worker", description="Breeze TTS 2 GPU worker")
    parser.add_argument("--log-level", default="INFO", help="logging level (DEBUG, INFO, WARNING, ...)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = next((a for a in argv if a in COMMANDS), None)
    for name, (_, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:  # only the chosen command's module is imported
            _load(name).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv).parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    return int(_load(args.command).run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
