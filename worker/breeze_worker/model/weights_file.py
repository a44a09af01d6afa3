"""Writing a safetensors weights file with the permissions of the files written beside it."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors.torch import save_file


def save_weights(tensors: dict[str, torch.Tensor], path: Path, like: Path) -> None:
    """`save_file` to `path`, then `path` given the permission bits of `like` (a file this process wrote in
    the same directory, so the process's umask decided them): safetensors creates its files 0600, which a
    service running as another user (the systemd unit's `breeze`) cannot read."""
    save_file(tensors, str(path), metadata={"format": "pt"})
    os.chmod(path, like.stat().st_mode & 0o777)
