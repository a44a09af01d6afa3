"""Building a model on the meta device and materializing it, without torch's reference implementations.

A loader builds its modules on the meta device (no memory, no initialization) and then gives every tensor
uninitialized memory on the target device before filling it from the checkpoint. Done with torch's own means
(`nn.init` fills on meta tensors, `Module.to_empty`), meta tensors go through torch's Python reference
implementations, whose first use imports its compiler stack (Dynamo, sympy, symbolic shapes): seconds of a
worker's start-up that compiles nothing before it serves. `no_init` and `materialize` do the same without them.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

_INIT_FILLS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "xavier_uniform_",
               "xavier_normal_", "kaiming_uniform_", "kaiming_normal_")


@contextlib.contextmanager
def no_init():
    """`torch.nn.init`'s fills as no-ops (modules built meanwhile keep whatever memory they were given: the
    meta device's none). Process-wide while it lasts: only for a loader's build, which nothing runs beside."""
    saved = {name: getattr(nn.init, name) for name in _INIT_FILLS if hasattr(nn.init, name)}
    for name in saved:
        setattr(nn.init, name, _unchanged)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(nn.init, name, fn)


def _unchanged(tensor, *args, **kwargs):
    return tensor


def materialize(module: nn.Module, device: torch.device | str) -> nn.Module:
    """`module.to_empty(device=device)`: every parameter and buffer an uninitialized tensor of its shape and dtype
    on `device` (a parameter shared by several modules stays one); returns `module`."""
    made: dict[int, torch.Tensor] = {}

    def empty(t: torch.Tensor) -> torch.Tensor:
        return torch.empty(tuple(t.shape), dtype=t.dtype, device=device)

    for sub in module.modules():
        for name, param in list(sub._parameters.items()):
            if param is not None:
                if id(param) not in made:
                    made[id(param)] = nn.Parameter(empty(param), requires_grad=param.requires_grad)
                sub._parameters[name] = made[id(param)]  # type: ignore[assignment]
        for name, buffer in list(sub._buffers.items()):
            if buffer is not None:
                if id(buffer) not in made:
                    made[id(buffer)] = empty(buffer)
                sub._buffers[name] = made[id(buffer)]
    return module
