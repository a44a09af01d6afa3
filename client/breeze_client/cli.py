"""`breeze-client`: one entry point, one module per subcommand under `breeze_client.commands`.

Every subcommand gets the same connection flags (--target, --artifact-target, --tls-ca, --tls,
--tls-server-name, --tls-cert, --tls-key, --token, --timeout) and --json FILE (`-` for stdout: the convention of
`jsonout.py`, which `breeze-worker` keeps too). A subcommand module defines `add_arguments(parser)` and
`run(args, options) -> int`; to add one, write the module and add a line to COMMANDS.

A failed call, and a local file that cannot be read or written (checked before the job starts), print
`error: CODE: message` on stderr, the message saying what to change, and exit 1; a command line that does not
parse exits 2 with the usage; Ctrl-C prints `interrupted` and exits 130. What a failed or interrupted command
left behind (a partial WAV) is said on the lines after.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import sys
from pathlib import Path

from breeze_client.channel import DEFAULT_TARGET, ConnectionOptions
from breeze_client.commands._local import readable_file
from breeze_client.commands._output import JSON_HELP
from breeze_client.jsonout import stdout_for

# subcommand -> (module under breeze_client.commands, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "synth": ("synth", "synthesize text; stream the audio to a WAV file; print TTFA, RTF, job and artifact ids"),
    "fetch": ("fetch", "download an artifact over the artifact channel; print the retrieval timestamps"),
    "health": ("health", "check both ports' health and describe the worker"),
    "diagnose": ("diagnose", "time N jobs' retrievals phase by phase; name the slow phase, its evidence and the fix"),
    "bench": ("bench", "end-to-end streaming benchmark: per label wall, RTF, TTFA, inter-chunk latency; --concurrency"),
}

EXIT_OK, EXIT_FAILED_CALL, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130  # 130: 128 + SIGINT, as shells report


def _load(name: str):
    return importlib.import_module(f"breeze_client.commands.{COMMANDS[name][0]}")


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("connection (the same on every subcommand)")
    g.add_argument("--target", default=os.environ.get("BREEZE_TARGET", DEFAULT_TARGET),
                   help="the worker's Synthesize endpoint, host:port, or a fleet in gRPC's target syntax: "
                        "dns:///name:port or ipv4:host:port,host:port (env BREEZE_TARGET; default %(default)s)")
    g.add_argument("--artifact-target", default=os.environ.get("BREEZE_ARTIFACT_TARGET"),
                   help="host:port of the Artifacts endpoint (default: the address the job's worker advertises; "
                        "with a fleet --target, fetch by id asks each worker and uses the one that holds it)")
    g.add_argument("--tls-ca", type=Path, default=None, help="PEM roots to trust; turns TLS on")
    g.add_argument("--tls", action="store_true", help="TLS with the system's trusted roots")
    g.add_argument("--tls-server-name", default=None, help="name to check in the worker's certificate")
    g.add_argument("--tls-cert", type=Path, default=None,
                   help="PEM client certificate chain, for a worker that requires client certificates "
                        "(with --tls-key; turns TLS on)")
    g.add_argument("--tls-key", type=Path, default=None, help="PEM private key of --tls-cert")
    g.add_argument("--token", default=os.environ.get("BREEZE_TOKEN"),
                   help="bearer token (prefer the environment variable BREEZE_TOKEN)")
    g.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="deadline per call (default: none)")
    g.add_argument("--json", default=None, metavar="FILE", help=JSON_HELP)


def connection_options(args: argparse.Namespace) -> ConnectionOptions:
    for flag in ("tls_ca", "tls_cert", "tls_key"):
        if getattr(args, flag) is not None:
            readable_file("--" + flag.replace("_", "-"), getattr(args, flag), "PEM file")
    return ConnectionOptions(target=args.target, artifact_target=args.artifact_target, tls_ca=args.tls_ca,
                             tls=args.tls, tls_server_name=args.tls_server_name, tls_cert=args.tls_cert,
                             tls_key=args.tls_key, token=args.token, timeout_s=args.timeout)


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="breeze-client", description="Client for the Breeze TTS 2 worker")
    parser.add_argument("--log-level", default="WARNING", help="logging level (DEBUG, INFO, WARNING, ...)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = next((a for a in argv if a in COMMANDS), None)
    for name, (_, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:  # only the chosen command's module is imported
            _load(name).add_arguments(p)
            add_connection_arguments(p)
    return parser


def _error_line(code: str, message: str, exc: BaseException) -> str:
    return f"error: {code}: {message}{_notes(exc)}"


def _notes(exc: BaseException) -> str:
    """What the command left behind, added to the exception on its way out (`add_note`), one line each."""
    return "".join(f"\n{note}" for note in getattr(exc, "__notes__", ()))


def _deadline_hint(args: argparse.Namespace) -> str:
    if args.timeout is None:
        return ""
    return (f" (a call did not finish within --timeout {args.timeout:g} s: raise --timeout, or leave it out for no "
            "deadline)")


def main(argv: list[str] | None = None) -> int:
    from breeze_client.errors import BreezeClientError, DeadlineExceeded

    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv).parse_args(argv)
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.WARNING),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        with stdout_for(args.json):
            return int(_load(args.command).run(args, connection_options(args)) or 0)
    except BreezeClientError as exc:
        hint = _deadline_hint(args) if isinstance(exc, DeadlineExceeded) else ""
        print(_error_line(exc.code, exc.message + hint, exc), file=sys.stderr)
        return EXIT_FAILED_CALL
    except ValueError as exc:  # a flag's value the command refused
        print(_error_line("INVALID_ARGUMENT", str(exc), exc), file=sys.stderr)
        return EXIT_FAILED_CALL
    except OSError as exc:  # a local file failed while the command ran (a full disk, ...): its errno names it
        code = errno.errorcode.get(exc.errno or 0, "OS_ERROR")
        where = f"{exc.filename}: " if exc.filename else ""
        print(_error_line(code, f"{where}{exc.strerror or exc}", exc), file=sys.stderr)
        return EXIT_FAILED_CALL
    except KeyboardInterrupt as exc:  # the subcommand's `with` blocks already hung up and closed its files
        print(f"interrupted{_notes(exc)}", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
