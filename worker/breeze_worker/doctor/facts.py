"""Facts about the device and the software: read only (nvidia-smi queries, torch's device properties).

`nvidia-smi` is asked, read-only, for clocks, power, utilization and the processes using the GPU; when it is
missing (many containers) the report says so and the busy check falls back to torch's own memory figures.
The busy decision (`judge_busy`) and the parsing are pure functions, tested with recorded outputs.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import platform
import shutil
import subprocess
from dataclasses import asdict, dataclass, field

import torch

log = logging.getLogger(__name__)

SMI_FIELDS = ("uuid", "name", "driver_version", "pstate", "clocks.sm", "clocks.mem", "clocks.max.sm", "clocks.max.mem",
              "utilization.gpu", "memory.used", "memory.total", "power.draw", "power.limit", "temperature.gpu")
APP_FIELDS = ("pid", "used_memory", "gpu_uuid")
# another process holding more than this much of the GPU's memory, or keeping it this busy, makes it "busy"
BUSY_MEMORY_BYTES = 1 << 30
BUSY_UTILIZATION_PERCENT = 10.0
SMI_TIMEOUT_S = 10.0


def parse_csv_row(line: str, fields: tuple[str, ...]) -> dict[str, str | float | None]:
    """One `--format=csv,noheader,nounits` line: numbers as floats, "[N/A]" / "[Not Supported]" as None."""
    values = [v.strip() for v in line.split(",")]
    if len(values) != len(fields):
        raise ValueError(f"nvidia-smi gave {len(values)} values for {len(fields)} fields: {line!r}")
    out: dict[str, str | float | None] = {}
    for name, value in zip(fields, values):
        if not value or value.startswith("["):
            out[name] = None
            continue
        try:
            out[name] = float(value)
        except ValueError:
            out[name] = value
    return out


def _smi(args: list[str]) -> str:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise FileNotFoundError("nvidia-smi is not on PATH")
    done = subprocess.run([exe, *args], capture_output=True, text=True, timeout=SMI_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"nvidia-smi exited {done.returncode}: {(done.stderr or done.stdout).strip()[:200]}")
    return done.stdout


@dataclass
class SmiSample:
    """One read of nvidia-smi: every GPU's SMI_FIELDS by UUID and every compute process (memory in MiB)."""

    gpus: dict[str, dict] = field(default_factory=dict)
    apps: list[dict] = field(default_factory=list)
    error: str | None = None


def sample_smi() -> SmiSample:
    """Read nvidia-smi once. Call it before this process creates a CUDA context, so that every process it
    lists is someone else (in a container nvidia-smi may show host process ids, which cannot be compared)."""
    try:
        text = _smi([f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits"])
        gpus = {str(row["uuid"]).lower(): row for row in (parse_csv_row(line, SMI_FIELDS) for line in text.splitlines()
                                                  if line.strip())}
        text = _smi([f"--query-compute-apps={','.join(APP_FIELDS)}", "--format=csv,noheader,nounits"])
        apps = [parse_csv_row(line, APP_FIELDS) for line in text.splitlines() if line.strip()]
    except (OSError, RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
        return SmiSample(error=f"{type(exc).__name__}: {exc}")
    return SmiSample(gpus=gpus, apps=apps)


def judge_busy(smi: dict | None, apps: list[dict] | None, own_pid: int, memory_used_by_others: int | None
               ) -> list[str]:
    """Why the GPU counts as busy (empty: idle). `smi`/`apps`: nvidia-smi samples taken before this process
    used the GPU (None: unavailable); `memory_used_by_others`: device memory in use that this process's
    allocator does not hold (torch.cuda.mem_get_info), beyond its CUDA context."""
    reasons = []
    others = [a for a in (apps or []) if a.get("pid") is not None and int(a["pid"]) != own_pid]
    own_mib = sum(float(a.get("used_memory") or 0.0) for a in (apps or []) if a not in others)
    if others:
        held = sum(float(a.get("used_memory") or 0.0) for a in others)
        pids = ", ".join(str(int(a["pid"])) for a in others)
        reasons.append(f"{len(others)} other process(es) use this GPU (pid {pids}; {held:.0f} MiB)")
    if smi is not None:
        util = smi.get("utilization.gpu")
        if isinstance(util, float) and util >= BUSY_UTILIZATION_PERCENT:
            reasons.append(f"GPU utilization {util:.0f}% before the doctor started")
        used = smi.get("memory.used")
        if not others and isinstance(used, float) and (used - own_mib) * 2**20 >= BUSY_MEMORY_BYTES:
            reasons.append(f"{used - own_mib:.0f} MiB of GPU memory in use before the doctor started")
    if memory_used_by_others is not None and memory_used_by_others >= BUSY_MEMORY_BYTES and not reasons:
        reasons.append(f"{memory_used_by_others / 2**30:.1f} GiB of GPU memory held outside this process")
    return reasons


def versions() -> dict:
    """Python, torch (and its CUDA and cuDNN), triton, transformers: what the fast path's speed depends on."""

    def dist(*names: str) -> str | None:
        for name in names:
            try:
                return importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                continue
        return None

    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {"python": platform.python_version(), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
            "cudnn": cudnn, "triton": dist("triton", "pytorch-triton"), "transformers": dist("transformers")}


@dataclass
class DeviceFacts:
    type: str  # cuda | cpu
    name: str
    index: int | None = None
    capability: tuple[int, int] | None = None
    memory_total_bytes: int | None = None
    memory_free_bytes: int | None = None
    multiprocessors: int | None = None
    uuid: str | None = None
    smi: dict | None = None  # the SMI_FIELDS sample (clocks, driver, power), None when unavailable
    smi_error: str | None = None
    processes: list[dict] = field(default_factory=list)
    emulates_bf16: bool | None = None  # capability < 8.0: BF16 runs without BF16 tensor cores
    bf16_supported_with_emulation: bool | None = None  # what torch.cuda.is_bf16_supported() says
    busy_reasons: list[str] = field(default_factory=list)
    cpu_count: int | None = None
    versions: dict = field(default_factory=dict)

    @property
    def busy(self) -> bool:
        return bool(self.busy_reasons)

    def to_dict(self) -> dict:
        return {**asdict(self), "capability": None if self.capability is None else list(self.capability),
                "busy": self.busy}


def cpu_facts() -> DeviceFacts:
    cuda_note = ("CPU build of torch (no CUDA support)" if torch.version.cuda is None
                 else "torch has CUDA support but sees no CUDA device")
    name = f"cpu ({platform.processor() or platform.machine()}); {cuda_note}"
    return DeviceFacts(type="cpu", name=name, cpu_count=os.cpu_count(), versions=versions())


def match_smi(uuid: str | None, smi: SmiSample | None) -> tuple[dict | None, list[dict] | None, str | None]:
    """(this GPU's nvidia-smi row, the processes on it, why there are none) for the device with `uuid`."""
    if smi is None or smi.error:
        return None, None, "nvidia-smi was not read" if smi is None else smi.error
    if uuid is None or uuid not in smi.gpus:
        return None, None, "nvidia-smi lists no GPU with this device's UUID (a MIG slice, or another container)"
    return smi.gpus[uuid], [a for a in smi.apps if str(a.get("gpu_uuid")).lower() == uuid], None


def device_uuid(props) -> str | None:
    """The device's UUID as nvidia-smi writes it, lower-cased ("gpu-..."), from torch's device properties."""
    raw = getattr(props, "uuid", None)
    if raw is None:
        return None
    text = str(raw).lower()  # torch 2.11 prints the bare UUID; nvidia-smi prefixes "GPU-"
    return text if text.startswith(("gpu-", "mig-")) else f"gpu-{text}"


def cuda_facts(device: torch.device, smi: SmiSample | None = None) -> DeviceFacts:
    """Facts of a CUDA device. `smi` (from `sample_smi`, taken before this process touched the device) gives
    clocks, driver, power, and the memory and utilization of other processes."""
    index = device.index or 0
    props = torch.cuda.get_device_properties(index)
    capability = (props.major, props.minor)
    facts = DeviceFacts(type="cuda", name=props.name, index=index, capability=capability,
                        memory_total_bytes=int(props.total_memory), multiprocessors=props.multi_processor_count,
                        uuid=device_uuid(props), cpu_count=os.cpu_count(), versions=versions())
    facts.smi, apps, facts.smi_error = match_smi(facts.uuid, smi)
    facts.processes = apps or []
    free, total = torch.cuda.mem_get_info(index)  # creates this process's CUDA context
    facts.memory_free_bytes, facts.memory_total_bytes = int(free), int(total)
    held_here = torch.cuda.memory_reserved(index)
    context_allowance = 768 << 20  # this process's own CUDA context and libraries
    outside = max(0, int(total - free) - held_here - context_allowance)
    facts.busy_reasons = judge_busy(facts.smi, apps, os.getpid(), outside)
    facts.emulates_bf16 = capability < (8, 0)
    try:
        facts.bf16_supported_with_emulation = bool(torch.cuda.is_bf16_supported())
    except Exception:  # a fact we can do without (older releases, old drivers)
        facts.bf16_supported_with_emulation = None
    return facts
