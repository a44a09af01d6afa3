"""The one `--json` convention of both command-line tools (`breeze-client` and `breeze-worker`).

`--json FILE` writes the command's result as one JSON document to FILE, and the command prints its text as
usual; `--json -` writes the document on stdout and sends everything else the command prints to stderr, so
stdout parses as one JSON document. Each tool's `cli.main` sets up the second case (`stdout_for`).
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

STDOUT = "-"

_stdout: list[TextIO] = []  # the real stdout while a `--json -` command runs with its prints sent to stderr


@contextlib.contextmanager
def stdout_for(destination: str | None) -> Iterator[None]:
    """With `--json -`, the command's prints go to stderr and stdout is kept for the document."""
    if destination != STDOUT:
        yield
        return
    _stdout.append(sys.stdout)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _stdout.pop()


def write(doc: Any, destination: str | Path | None, default: Callable[[Any], Any] = str) -> None:
    """Write `doc` where `--json` says (nothing when it was not given)."""
    if not destination:
        return
    text = json.dumps(doc, indent=2, default=default) + "\n"
    if str(destination) == STDOUT:
        out = _stdout[-1] if _stdout else sys.stdout
        out.write(text)
        out.flush()
        return
    Path(destination).parent.mkdir(parents=True, exist_ok=True)
    Path(destination).write_text(text)


def to_file(destination: str | Path | None) -> bool:
    """Whether `--json` names a file (which a long run may rewrite with what it measured so far)."""
    return bool(destination) and str(destination) != STDOUT
