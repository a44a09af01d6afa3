"""Checks of the local files a command names, made before it calls the worker: a job is never run only to
find that its reference audio cannot be read or its output cannot be written. Each failure is an
`InvalidArgument` naming the flag, the path and what to change (the CLI prints `error: CODE: message`)."""

from __future__ import annotations

import os
from pathlib import Path

from breeze_client.errors import InvalidArgument


def readable_file(flag: str, path: Path | str, what: str = "file") -> Path:
    """`path` exists, is a file and can be read (`what`: the kind of file the flag takes, for the message)."""
    path = Path(path)
    if not path.exists():
        raise InvalidArgument(f"{flag} {path}: no such file; give the path of an existing {what}")
    if not path.is_file():
        raise InvalidArgument(f"{flag} {path}: not a file (a directory?); give the path of a file")
    if not os.access(path, os.R_OK):
        raise InvalidArgument(f"{flag} {path}: this user cannot read it; change its permissions or copy it")
    return path


def writable_file(flag: str, path: Path | str) -> Path:
    """A file can be written at `path`: its directory exists and is writable, and `path` is not a directory."""
    path = Path(path)
    folder = path.parent
    if path.is_dir():
        raise InvalidArgument(f"{flag} {path}: is a directory; name a file in it (for example {path / 'out.wav'})")
    if not folder.is_dir():
        raise InvalidArgument(f"{flag} {path}: the directory {folder} does not exist; create it first "
                              f"(mkdir -p {folder}) or write elsewhere")
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise InvalidArgument(f"{flag} {path}: this user cannot write there; choose a writable location")
    return path


def writable_dir(flag: str, path: Path | str) -> Path:
    """A directory that exists and is writable, or that can be created (its nearest existing parent is)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise InvalidArgument(f"{flag} {path}: is a file, not a directory; name a directory")
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InvalidArgument(f"{flag} {path}: this user cannot write in {existing}; choose a writable location")
    return path
