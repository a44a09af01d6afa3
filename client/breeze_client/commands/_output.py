"""Output helpers shared by the subcommands: the `--json` convention, aligned key/value lines, progress.

The `--json` convention is the one every `breeze-worker` command keeps too: `--json FILE` writes the command's
result as one JSON document to FILE and the command prints its usual text; `--json -` writes the document on
stdout and everything else the command prints goes to stderr (`cli.main` sets that up with `stdout_for`), so
stdout parses as one JSON document.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

STDOUT = "-"
JSON_HELP = "write the result as one JSON document to FILE (- for stdout; the text then goes to stderr)"

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


def write_json(obj: Any, destination: str | Path | None) -> None:
    """Write `obj` where `--json` says (nothing when it was not given)."""
    if not destination:
        return
    text = json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n"
    if str(destination) == STDOUT:
        out = _stdout[-1] if _stdout else sys.stdout
        out.write(text)
        out.flush()
        return
    Path(destination).write_text(text)


def print_rows(rows: list[tuple[str, str]]) -> None:
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


def ms(a: int | None, b: int | None) -> str:
    return "-" if a is None or b is None else f"{(b - a) / 1e6:9.3f} ms"


class Progress:
    """Progress on stderr. `update` is a line rewritten in place, shown only on a terminal (many a second);
    `step` marks a stage done (a run, a round): rewritten in place on a terminal, one line each elsewhere (a
    log, CI), so a long command shows it is moving wherever its stderr goes."""

    def __init__(self, prefix: str, stream: TextIO | None = None) -> None:
        self.prefix = prefix
        self.stream = stream if stream is not None else sys.stderr
        self.terminal = self.stream.isatty()
        self._shown = False

    def update(self, text: str) -> None:
        if self.terminal:
            self.stream.write(f"\r\033[K{self.prefix}: {text}")
            self.stream.flush()
            self._shown = True

    def step(self, text: str) -> None:
        if self.terminal:
            self.update(text)
        else:
            self.stream.write(f"{self.prefix}: {text}\n")
            self.stream.flush()

    def done(self) -> None:
        if self._shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self._shown = False
