"""The fast path's settings: one typed, frozen object, passed down explicitly.

`FastPathSettings` travels from the worker's `EngineSettings` (breeze_worker/config.py reads the
environment; `from_engine` converts) through the runtime to the batched stepper, the batch-1 generator,
their runners and graphs and each `FrameStep`; nothing in the fast path reads the environment or keeps
module-level switches. Library callers that pass no settings get the defaults below, which are what the
worker serves with when nothing is set.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

from breeze_worker.engine.fastpath.forms import FORMS
from breeze_worker.engine.fastpath.fused import KernelSettings

COMPILE_MODES = ("auto", "on", "off")
SAMPLERS = ("auto", "kernel", "torch")
_ON, _OFF = ("1", "on", "true", "yes"), ("0", "off", "false", "no")


@dataclass(frozen=True)
class FastPathSettings:
    # torch.compile of the step's units: auto (on CUDA when Triton is importable) | on | off
    compile: str = "auto"
    # the torch.compile backend: inductor; aot_eager traces without generating code (the CPU tests)
    compile_backend: str = "inductor"
    # the compiled layers' form (fastpath/forms.py FORMS), or auto: chosen by the step's row count
    form: str = "auto"
    # Inductor's coordinate-descent tuning of its reduction kernels: chosen by timing, so the summation order
    # (and a seed's audio) may differ between processes that do not share Inductor's cache
    tune: bool = False
    # who draws each position's codes: auto (the Triton sampling kernel where it runs: CUDA) | kernel | torch
    sampler: str = "auto"
    # the batch-1 runner queues the next frame's backbone step before the frame's host read
    read_overlap: bool = True
    # the batch-1 generator keeps one frame in flight (each frame's audio then comes one frame later)
    pipeline: bool = False
    # how the fused Triton kernels launch (chained launches, launch-plan overrides)
    kernels: KernelSettings = field(default_factory=KernelSettings)

    def __post_init__(self) -> None:
        if self.compile not in COMPILE_MODES:
            raise ValueError(f"fast-path compile {self.compile!r}: expected one of {', '.join(COMPILE_MODES)} "
                             "(BREEZE_FASTPATH_COMPILE)")
        if not self.compile_backend:
            raise ValueError("fast-path compile backend is empty: use inductor (BREEZE_FASTPATH_COMPILE_BACKEND)")
        if self.form != "auto" and self.form not in FORMS:
            raise ValueError(f"fast-path form {self.form!r}: expected auto or one of {', '.join(FORMS)} "
                             "(BREEZE_FASTPATH_FORM)")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"fast-path sampler {self.sampler!r}: expected one of {', '.join(SAMPLERS)} "
                             "(BREEZE_FASTPATH_SAMPLER)")

    def with_changes(self, **changes) -> "FastPathSettings":
        return replace(self, **changes)

    @classmethod
    def from_engine(cls, engine) -> "FastPathSettings":
        """From the worker's `EngineSettings` (breeze_worker/config.py): its `fastpath_*` and `fused_*` fields."""
        return cls(compile=_compile_mode(engine.fastpath_compile),
                   compile_backend=engine.fastpath_compile_backend.strip() or "inductor",
                   form=engine.fastpath_form.strip().lower() or "auto", tune=engine.fastpath_tune,
                   sampler=engine.fastpath_sampler.strip().lower() or "auto",
                   read_overlap=engine.fastpath_read_overlap, pipeline=engine.fastpath_pipeline,
                   kernels=KernelSettings(chained=engine.fused_chained, plans=parse_plans(engine.fused_plans)))


def _compile_mode(text: str) -> str:
    mode = text.strip().lower() or "auto"
    return "on" if mode in _ON else "off" if mode in _OFF else mode


def parse_plans(text: str) -> dict:
    """Launch-plan overrides from JSON text: {kernel or kernel@width: {setting: value}} (empty text: none)."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"BREEZE_FUSED_CONFIG is not valid JSON ({exc})") from None
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise ValueError("BREEZE_FUSED_CONFIG must be a JSON object of kernel name -> {setting: value}")
    return value
