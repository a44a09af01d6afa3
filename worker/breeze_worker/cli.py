"""`breeze-worker`: one entry point, one module per subcommand under `breeze_worker.commands`.

Each command module defines `add_arguments(parser)` and `run(args) -> int`. Modules are imported only
when their subcommand runs, so `breeze-worker serve` never imports the benchmark code and vice versa.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from breeze_worker import jsonout, logs

# subcommand -> (module under breeze_worker.commands, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("serve", "run the gRPC worker (Synthesize stream + artifact channel)"),
    "bench": ("bench", "engine benchmark: eager reference vs fast path, stage split, memory, syncs"),
    "audit-syncs": ("audit_syncs", "count device-to-host synchronizations per frame; fail over a budget"),
    "precision-check": ("precision_check", "compare precision policies against FP32, teacher-forced"),
    "trace": ("trace", "trace one streaming request as a Chrome / Perfetto trace (--trace FILE.json)"),
    "doctor": ("doctor", "what this host can do: measure the GPU, the verdict and what to do next (never "
                         "changes the host)"),
    "make-checkpoint": ("make_checkpoint", "write a synthetic checkpoint (official layout, random weights; "
                                           "its audio is NOT speech)"),
    "compile": ("compile_bundle", "compile everything `serve` would with these settings into a compile bundle for "
                                  "hosts of the same kind (serve --compile-bundle)"),
}


def _load(name: str):
    return importlib.import_module(f"breeze_worker.commands.{COMMANDS[name][0]}")


def add_logging_arguments(parser: argparse.ArgumentParser, top_level: bool) -> None:
    """--log-level and --log-format, before or after the subcommand (after wins)."""
    g = parser.add_argument_group("logging")
    g.add_argument("--log-level", default="INFO" if top_level else argparse.SUPPRESS,
                   help="logging level (DEBUG, INFO, WARNING, ...; default: INFO)")
    g.add_argument("--log-format", default="text" if top_level else argparse.SUPPRESS, choices=logs.FORMATS,
                   help="text lines, or one JSON object per line with job_id, request_id, method and peer as "
                        "fields (default: text)")


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="breeze-worker", description="Breeze TTS 2 GPU worker")
    add_logging_arguments(parser, top_level=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = next((a for a in argv if a in COMMANDS), None)
    for name, (_, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:  # only the chosen command's module is imported
            _load(name).add_arguments(p)
            add_logging_arguments(p, top_level=False)
    return parser


EXIT_NOT_INSTALLED = 1
WORKER_EXTRA = "pip install 'breeze-tts-serving[worker]'"


def _missing_dependency(exc: ModuleNotFoundError) -> bool:
    """Whether `exc` is a third-party package the worker needs that is not installed (not one of ours)."""
    return bool(exc.name) and not str(exc.name).split(".")[0].startswith(("breeze_", "_breeze"))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser(argv)  # imports the chosen command's module
        args = parser.parse_args(argv)
        try:
            logs.configure(args.log_level, args.log_format)  # the one place logging is configured
        except ValueError as exc:
            parser.error(str(exc))
        with jsonout.stdout_for(getattr(args, "json", None)):
            return int(_load(args.command).run(args) or 0)
    except ModuleNotFoundError as exc:  # `pip install .` is the client alone: the worker's stack is an extra
        if not _missing_dependency(exc):
            raise
        print(f"breeze-worker: the worker's dependencies are not installed (no module named {exc.name!r}). "
              f"Install the worker extra: {WORKER_EXTRA} (or scripts/install.sh, which installs the CPU build "
              "of torch first; on a GPU host install the CUDA build of torch first, see README)", file=sys.stderr)
        return EXIT_NOT_INSTALLED


if __name__ == "__main__":
    sys.exit(main())
