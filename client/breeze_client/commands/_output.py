"""Output helpers shared by the subcommands: JSON, aligned key/value lines, a terminal-only progress line."""

from __future__ import annotations

import json
import sys


def print_json(obj) -> None:
    print(json.dumps(obj, indent=2, sort_keys=False, default=str))


def print_rows(rows: list[tuple[str, str]]) -> None:
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


def ms(a: int | None, b: int | None) -> str:
    return "-" if a is None or b is None else f"{(b - a) / 1e6:9.3f} ms"


class Progress:
    """A one-line progress display on stderr, only when stderr is a terminal (never in --json mode)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self._shown = False

    def update(self, text: str) -> None:
        if self.enabled:
            sys.stderr.write("\r\033[K" + text)
            sys.stderr.flush()
            self._shown = True

    def done(self) -> None:
        if self._shown:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
