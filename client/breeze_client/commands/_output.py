"""Output helpers shared by the subcommands: the `--json` flag's help, aligned key/value lines, progress.

The `--json` convention itself (`--json FILE`, `--json -`) is `breeze_client/jsonout.py`, which `breeze-worker`
keeps too.
"""

from __future__ import annotations

import sys
from typing import TextIO

JSON_HELP = "write the result as one JSON document to FILE (- for stdout; the text then goes to stderr)"


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
