"""The `--json` flag of every `breeze-worker` command: the convention `breeze-client` keeps too, in one place
(`breeze_client/jsonout.py`): `--json FILE` writes the result as one JSON document to FILE and the command
prints its tables and progress as usual; `--json -` writes the document on stdout and sends everything else to
stderr. `breeze_worker.cli` sets up the second case (`stdout_for`).
"""

from __future__ import annotations

from breeze_client.jsonout import STDOUT, stdout_for, to_file, write

__all__ = ["HELP", "STDOUT", "add_argument", "stdout_for", "to_file", "write"]

HELP = "write the result as one JSON document to FILE (- for stdout; the tables then go to stderr)"


def add_argument(parser, help: str = HELP) -> None:
    parser.add_argument("--json", default=None, metavar="FILE", help=help)
