"""Typed, validated settings of the worker, the engine and the fast path: the one source of configuration.

Each setting is a field of a frozen dataclass declared with `setting(default, help, ...)`: its type (the
annotation), its default, its checks (choices, bounds) and its help text. Everything else comes from that field:
- its environment variable BREEZE_<SECTION>_<FIELD> (BREEZE_ENGINE_DEVICE, BREEZE_FASTPATH_FORM), or the one the
  field names (the fused kernels' BREEZE_FUSED_PDL and BREEZE_FUSED_CONFIG), read only by `WorkerSettings.load`
  and `from_env`, called by the commands (never at import time);
- its `breeze-worker serve` flag, --<field> with dashes after the section's flag prefix unless the field names
  its own (--model, --token); booleans also get a --no-... form. commands/serve.py builds the parser from
  `setting_fields`;
- its validation message, which names the flag and the variable to change.
The settings are passed down explicitly (`Engine(settings.engine, store)`; the runtime hands
`settings.engine.fastpath` to the fast path); no other module reads the environment.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import json
import os
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

ENV_PREFIX = "BREEZE_"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


class SettingsError(ValueError):
    """A setting whose value cannot be used; the message names its flag and its environment variable."""


@dataclass(frozen=True, eq=False)
class Setting:
    """What a settings field declares besides its type and default."""

    help: str
    flag: str = ""  # default: --<section flag prefix><field name, dashes>
    env: str = ""  # default: BREEZE_<SECTION>_<FIELD NAME>
    choices: tuple[str, ...] = ()
    aliases: Mapping[str, str] = field(default_factory=dict)  # other spellings of a choice (env and flag)
    at_least: float | None = None
    at_most: float | None = None
    positive: bool = False
    parse: Callable[[str], Any] | None = None  # text -> value, for a value that is not a plain type
    hidden: bool = False  # accepted, but left out of --help (the test-only faults)
    metavar: str = ""


def setting(default: Any, help: str, **declared: Any) -> Any:
    """A settings field: `default`, the `help` text, and what `Setting` declares."""
    meta = {"setting": Setting(help=help, **declared)}
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def section(cls: type) -> Any:
    """A nested settings section (its own variables and flags, with its own prefixes)."""
    return field(default_factory=cls, metadata={"section": True})


@dataclass(frozen=True)
class SettingField:
    """One setting as the environment, the CLI and the checks see it."""

    path: tuple[str, ...]  # attribute path from WorkerSettings, e.g. ("engine", "fastpath", "form")
    kind: type  # bool | int | float | str | Path | Mapping
    optional: bool  # None is a valid value (an empty variable gives None)
    default: Any
    spec: Setting
    env: str
    flag: str

    @property
    def name(self) -> str:
        return self.path[-1]

    @property
    def dest(self) -> str:  # the argparse destination
        return "__".join(self.path)

    @property
    def label(self) -> str:
        return f"{self.flag} ({self.env})"

    def convert(self, text: str) -> Any:
        """The value `text` (from a variable or a flag) stands for; SettingsError says why not, unnamed."""
        raw = text.strip()
        if self.optional and raw == "":
            return None
        if self.spec.parse is not None:
            return self.spec.parse(raw)
        if self.kind is bool:
            if raw.lower() in _TRUE:
                return True
            if raw.lower() in _FALSE:
                return False
            raise SettingsError(f"{text!r} is not a switch: use one of {', '.join(_TRUE + _FALSE)}")
        if self.kind is int:
            try:
                return int(raw)
            except ValueError:
                raise SettingsError(f"{text!r} is not a whole number") from None
        if self.kind is float:
            try:
                return float(raw)
            except ValueError:
                raise SettingsError(f"{text!r} is not a number") from None
        if self.kind is Path:
            return Path(raw)
        if self.spec.choices:
            raw = raw.lower()
            return self.spec.aliases.get(raw, raw)
        return raw

    def problem(self, value: Any) -> str | None:
        """What is wrong with `value` for this setting (None: nothing)."""
        s = self.spec
        if value is None:
            return None if self.optional else "must be set"
        if self.kind is bool and not isinstance(value, bool):
            return f"must be true or false, not {value!r}"
        if self.kind in (int, float):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    (self.kind is int and not isinstance(value, int)):
                return f"must be {'a whole number' if self.kind is int else 'a number'}, not {value!r}"
            if s.at_least is not None and value < s.at_least:
                return f"must be at least {s.at_least:g}, not {value:g}"
            if s.at_most is not None and value > s.at_most:
                return f"must be at most {s.at_most:g}, not {value:g}"
            if s.positive and not value > 0:
                return f"must be positive, not {value:g}"
        if self.kind is str and not isinstance(value, str):
            return f"must be text, not {value!r}"
        if self.kind is Path and not isinstance(value, (str, os.PathLike)):
            return f"must be a path, not {value!r}"
        if s.choices and value not in s.choices:
            return f"must be {_one_of(s.choices)}, not {value!r}"
        return None


def _one_of(choices: tuple[str, ...]) -> str:
    return ", ".join(choices[:-1]) + " or " + choices[-1] if len(choices) > 1 else choices[0]


def _kind(annotation: Any) -> tuple[Any, bool]:
    """(the type, whether None is allowed) of a field annotation such as `Path | None`."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _kind(args[0])[0], len(args) < len(typing.get_args(annotation))
    return typing.get_origin(annotation) or annotation, False


@functools.cache
def setting_fields(cls: type, path: tuple[str, ...] = ()) -> tuple[SettingField, ...]:
    """Every setting of the section `cls` and its nested sections, in declaration order."""
    hints = typing.get_type_hints(cls)
    out: list[SettingField] = []
    for f in dataclasses.fields(cls):
        kind, optional = _kind(hints[f.name])
        if f.metadata.get("section"):
            out.extend(setting_fields(kind, path + (f.name,)))
            continue
        spec = f.metadata.get("setting")
        if spec is None:  # a library-only field (no variable, no flag)
            continue
        if not issubclass(cls, _Section):  # the prefixes below are a section's
            raise TypeError(f"setting {cls.__name__}.{f.name} is declared outside a settings section")
        if f.default is not dataclasses.MISSING:
            default = f.default
        else:
            assert f.default_factory is not dataclasses.MISSING  # `setting` gives a default or a default factory
            default = f.default_factory()
        env = spec.env or f"{cls.ENV_PREFIX}{f.name.upper()}"
        flag = spec.flag or f"--{cls.FLAG_PREFIX}{f.name.replace('_', '-')}"
        out.append(SettingField(path + (f.name,), kind, optional, default, spec, env, flag))
    return tuple(out)


class _Section:
    """What every settings section shares: its fields are checked when it is made."""

    ENV_PREFIX: ClassVar[str]
    FLAG_PREFIX: ClassVar[str] = ""

    def __post_init__(self) -> None:
        # mypy#11470: a `type[...]` value is checked against Hashable with its instances' __hash__
        for f in setting_fields(type(self)):  # type: ignore[arg-type]
            if len(f.path) == 1:  # nested sections checked themselves
                problem = f.problem(getattr(self, f.name))
                if problem:
                    raise SettingsError(f"{f.label} {problem}")

    def validate(self) -> None:
        """The checks across fields and against the host (a directory that must exist)."""

    def with_changes(self, **changes: Any) -> Any:
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]


def _field(cls: type, name: str) -> SettingField:
    return next(f for f in setting_fields(cls) if f.path == (name,))


# ---- the fast path ----

COMPILE_MODES = ("auto", "on", "off")
SAMPLERS = ("auto", "kernel", "torch")
# the live layer forms (engine/fastpath/forms.py FORMS; tests/fastpath/test_form_selector.py keeps them equal)
FORM_NAMES = ("fused+chain+all", "gemm+attention", "units+attn", "gemm")


def parse_plans(text: str) -> dict:
    """Launch-plan overrides from JSON text: {kernel or kernel@width: {setting: value}} (empty text: none)."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SettingsError(f"is not valid JSON ({exc})") from None
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise SettingsError("must be a JSON object of kernel name -> {setting: value}")
    return value


@dataclass(frozen=True, eq=False)
class KernelSettings(_Section):
    """How the fused Triton kernels (engine/fastpath/fused.py) launch; a FrameStep passes its settings' own."""

    ENV_PREFIX: ClassVar[str] = "BREEZE_FUSED_"
    FLAG_PREFIX: ClassVar[str] = "fused-"
    chained: bool = setting(True, "chained kernel launches (programmatic dependent launch) where the device has "
                                  "them", env="BREEZE_FUSED_PDL")
    plans: Mapping[str, Mapping[str, Any]] = setting(
        {}, "launch-plan overrides by kernel (norm_gate_up) or kernel and input width (norm_gate_up@2048), as "
            "JSON: {kernel: {setting: value}}, on top of the fixed plans; for measurements",
        env="BREEZE_FUSED_CONFIG", parse=parse_plans, metavar="JSON")
    # False: every stage runs its torch form even where the kernels could run (the kernels' reference; tests)
    use_triton: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.plans, Mapping) or not all(isinstance(v, Mapping) for v in self.plans.values()):
            raise SettingsError(f"{_field(KernelSettings, 'plans').label} must map kernel names to settings")

    def _key(self) -> tuple:
        return self.chained, json.dumps(self.plans, sort_keys=True), self.use_triton

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KernelSettings) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())


@dataclass(frozen=True)
class FastPathSettings(_Section):
    """The fast path's settings (engine/fastpath/): frozen, hashable, passed to the stepper, the batch-1
    generator, their runners and graphs and each FrameStep. Library callers that pass none get these defaults,
    which are what the worker serves with when nothing is set."""

    ENV_PREFIX: ClassVar[str] = "BREEZE_FASTPATH_"
    FLAG_PREFIX: ClassVar[str] = "fastpath-"
    compile: str = setting("auto", "torch.compile of the frame step's units: auto (on CUDA when Triton is "
                                   "importable), on or off", choices=COMPILE_MODES,
                           aliases={**{t: "on" for t in _TRUE}, **{f: "off" for f in _FALSE}})
    compile_backend: str = setting("inductor", "torch.compile backend (aot_eager traces without generating code)",
                                   metavar="BACKEND")
    form: str = setting("auto", "the compiled layers' form: auto (chosen by the step's row count) or one of "
                                + ", ".join(FORM_NAMES), choices=("auto",) + FORM_NAMES)
    tune: bool = setting(False, "Inductor's coordinate-descent tuning of its reductions (chosen by timing, so a "
                                "seed's audio may differ between processes that do not share Inductor's cache)")
    sampler: str = setting("auto", "who draws each position's codes: auto (the Triton sampling kernel where it "
                                   "runs: CUDA), kernel or torch", choices=SAMPLERS)
    read_overlap: bool = setting(True, "the batch-1 runner queues the next frame's backbone step before the "
                                       "frame's host read")
    pipeline: bool = setting(False, "the batch-1 generator keeps one frame in flight (each frame's audio comes "
                                    "one frame later)")
    dynamic_shapes: bool = setting(False, "compile the batched step's units once for every batch shape (Dynamo's "
                                          "automatic dynamic shapes: the first shape static, the next ones with "
                                          "symbolic sizes) instead of once per shape: fewer compiles at start-up")
    kernels: KernelSettings = section(KernelSettings)
    half_kv: bool = setting(True, "under fp16-mixed, the backbone's keys and values in FP16 where its q/k norms "
                                  "bound the keys and its k/v projections run in FP16 (half the cache memory a "
                                  "stream slot takes); off: FP32, as the residual stream")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.compile_backend.strip():
            raise SettingsError(f"{_field(FastPathSettings, 'compile_backend').label} is empty: use inductor")


# ---- the worker's sections ----


@dataclass(frozen=True)
class EngineSettings(_Section):
    ENV_PREFIX: ClassVar[str] = "BREEZE_ENGINE_"
    model_dir: Path | None = setting(None, "Breeze TTS 2 checkpoint directory (default: the tiny embedded model, "
                                           "whose audio is NOT speech)", flag="--model", metavar="DIR")
    device: str = setting("auto", "auto, cpu, cuda or cuda:N")
    precision: str = setting("auto", "auto, fp32, bf16 or fp16-mixed",
                             choices=("auto", "fp32", "bf16", "fp16-mixed"))
    force_precision: bool = setting(False, "run --precision bf16 even where the device only emulates it (slow; "
                                           "refused otherwise)")
    fast_path: str = setting("auto", "auto (fast on CUDA, eager on the CPU), eager or fast",
                             choices=("auto", "eager", "fast"))
    max_active_streams: int = setting(8, "streams decoding at once", at_least=1)
    max_queue: int = setting(32, "requests waiting for a slot", at_least=1)
    max_queue_wait_s: float = setting(30.0, "longest wait for a slot, seconds (longer: RESOURCE_EXHAUSTED)",
                                      positive=True)
    join_gather_ms: float = setting(120.0, "an idle engine admitting a burst waits up to this long, milliseconds, "
                                          "for the burst's requests still being received, so that they join at "
                                          "one frame boundary, and no longer once they fill every free slot "
                                          "(0: admit at once)", at_least=0)
    join_gather_quiet_ms: float = setting(2.0, "with join_gather_ms: the burst has ended once no request has "
                                               "arrived for this long, milliseconds (what a lone request waits)",
                                          at_least=0)
    artifact_commit_threads: int = setting(2, "threads committing finished jobs' artifacts (the jobs that "
                                              "end at one step commit as one group; each job's final message "
                                              "waits for its commit)", at_least=1)
    join_gather_burst_quiet_ms: float = setting(10.0, "with join_gather_ms: once two requests wait, the burst "
                                                      "has ended only after this long without an arrival, "
                                                      "milliseconds", at_least=0)
    max_text_chars: int = setting(2000, "longest accepted text, characters", at_least=1)
    max_reference_seconds: float = setting(30.0, "longest accepted reference audio, seconds", positive=True)
    min_reference_seconds: float = setting(1.0, "shortest accepted reference audio, seconds (less is too little "
                                                "speech to clone)", at_least=0)
    reference_cache_entries: int = setting(64, "encoded references kept in memory", at_least=1)
    codec_tf32: bool = setting(True, "TF32 convolutions in the codec where the device has them (compute "
                                     "capability >= 8.0), as PyTorch's own default for cuDNN; off: strict FP32")
    codec_precision: str = setting("fp32", "the codec decoder's precision: fp32, or fp16-mixed (its convolutions "
                                           "with FP16 weights and inputs, everything else FP32) for GPUs without "
                                           "TF32 (compute capability < 8.0, a T4) once `breeze-worker "
                                           "precision-check --codec` shows it within 40 dB SNR of FP32",
                                   choices=("fp32", "fp16-mixed"))
    codec_compile_slots: int = setting(16, "on CUDA, compile the codec's batched step with torch.compile "
                                            "(Inductor) for every slot bucket of at least this many slots, at "
                                            "warm-up, before its CUDA graph (0: never; 1: every bucket; the "
                                            "compiled code is cached, TORCHINDUCTOR_CACHE_DIR)", at_least=0)
    compile_bundle: Path | None = setting(None, "a compile bundle (`breeze-worker compile`, built on a host of the "
                                                "same kind with the same settings) to install into this host's "
                                                "compile caches before compiling; one that does not match is "
                                                "refused, with a log line, and the worker compiles as without it",
                                          metavar="BUNDLE")
    startup: str = setting("progressive", "progressive: report SERVING once what one stream needs is built (the "
                                          "smallest batch shape uncompiled, the codec's one-slot batch) and build "
                                          "the rest while serving, admitting streams as their batch shapes are "
                                          "ready; whole: build everything first", choices=("progressive", "whole"))
    codec_overlap: bool = setting(False, "decode each step's audio on its own CUDA stream while the next step "
                                         "runs (experimental: multi-second stalls were seen at 16 streams)")
    fastpath: FastPathSettings = section(FastPathSettings)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.device not in ("auto", "cpu") and not self.device.startswith("cuda"):
            raise SettingsError(f"{_field(EngineSettings, 'device').label} must be auto, cpu, cuda or cuda:N, "
                                f"not {self.device!r}")

    def validate(self) -> None:
        if not self.min_reference_seconds <= self.max_reference_seconds:
            raise SettingsError(
                f"{_field(EngineSettings, 'min_reference_seconds').label} must be at most "
                f"{_field(EngineSettings, 'max_reference_seconds').label} ({self.max_reference_seconds:g}), "
                f"not {self.min_reference_seconds:g}")
        if self.model_dir is not None and not Path(self.model_dir).is_dir():
            raise SettingsError(f"{_field(EngineSettings, 'model_dir').label}: {self.model_dir} is not a "
                                "directory: pass a Breeze TTS 2 checkpoint directory")


@dataclass(frozen=True)
class ArtifactSettings(_Section):
    ENV_PREFIX: ClassVar[str] = "BREEZE_ARTIFACTS_"
    FLAG_PREFIX: ClassVar[str] = "artifact-"
    directory: Path = setting(Path("artifacts"), "where WAV artifacts are written", flag="--artifact-dir",
                              metavar="DIR")
    max_age_s: float = setting(24 * 3600.0, "artifacts older than this many seconds are deleted", positive=True)
    max_total_bytes: int = setting(10 * 1024**3, "the oldest artifacts are deleted beyond this total",
                                   flag="--artifact-max-bytes", positive=True)
    min_free_bytes: int = setting(256 * 1024**2, "free space kept on the artifact disk: the oldest artifacts are "
                                                 "evicted to keep it, and a job that cannot have it streams "
                                                 "without an artifact (the store reports itself degraded; 0: off)",
                                  at_least=0)
    min_keep_s: float = setting(300.0, "eviction for free space never takes an artifact younger than this many "
                                       "seconds", at_least=0)
    # test-only fault injection (the diagnosis and storage-fault tests): 0 = off; hidden from --help
    fault_commit_delay_s: float = setting(0.0, "delay each artifact commit by this many seconds", at_least=0,
                                          flag="--fault-commit-delay-s", hidden=True)
    fault_first_byte_delay_s: float = setting(0.0, "delay each fetch's first byte by this many seconds",
                                              at_least=0, flag="--fault-first-byte-delay-s", hidden=True)
    fault_eio_after_bytes: int = setting(0, "fail an artifact write with EIO that would take its file past this "
                                            "many bytes", at_least=0, flag="--fault-eio-after-bytes", hidden=True)
    # the commit's fsync and each fetch read take as long as a volume moving this many bytes/s would (where no
    # cgroup I/O limit can throttle a real volume)
    fault_storage_write_bytes_per_s: float = setting(0.0, "artifact writes as slow as a volume of this many "
                                                          "bytes/s", at_least=0,
                                                     flag="--fault-storage-write-bytes-per-s", hidden=True)
    fault_storage_read_bytes_per_s: float = setting(0.0, "artifact reads as slow as a volume of this many bytes/s",
                                                    at_least=0, flag="--fault-storage-read-bytes-per-s",
                                                    hidden=True)


MIN_TOKEN_CHARS = 16  # a shorter bearer token is refused at start-up


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses (127.0.0.0/8, ::1); anything else may be reachable."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ServerSettings(_Section):
    ENV_PREFIX: ClassVar[str] = "BREEZE_SERVER_"
    host: str = setting("127.0.0.1", "address to listen on (0.0.0.0 for all interfaces; anything but loopback "
                                     "needs a token or client certificates)")
    port: int = setting(50051, "Synthesize port (0: any free port)", at_least=0, at_most=65535)
    artifact_port: int = setting(50052, "Artifacts port (0: any free port)", at_least=0, at_most=65535)
    advertised_artifact_address: str | None = setting(
        None, "host:port that clients should use for artifacts (default: host:artifact-port)",
        flag="--advertise-artifact-address", metavar="HOST:PORT")
    max_connection_age_s: float = setting(
        300.0, "seconds after which a client connection to the synthesis port is asked to reconnect (its streams "
               "finish first), so clients of a fleet address resolve it again and find new workers; 0: never",
        at_least=0)
    auth_token: str | None = setting(None, "require 'authorization: Bearer TOKEN' on every call but health "
                                           f"(prefer the environment variable; at least {MIN_TOKEN_CHARS} "
                                           "characters)", flag="--token", metavar="TOKEN")
    auth_max_failures: int = setting(20, "failed authentications one address may make before its calls are "
                                         "refused (RESOURCE_EXHAUSTED) until it regains one", at_least=1)
    auth_failure_refill_s: float = setting(3.0, "an address regains one failed authentication every this many "
                                                "seconds", positive=True)
    allow_insecure: bool = setting(False, "serve on a non-loopback --host with neither a token nor client "
                                          "certificates (refused otherwise)")
    metrics_port: int | None = setting(None, "serve Prometheus metrics on GET /metrics (and the probes /healthz, "
                                             "/livez) of this port (default: off)", at_least=0, at_most=65535,
                                       metavar="PORT")
    metrics_host: str | None = setting(None, "address the metrics listener binds (default: the --host value)",
                                       metavar="HOST")
    tls_cert: Path | None = setting(None, "PEM certificate chain (TLS on both ports; needs --tls-key)",
                                    metavar="PEM")
    tls_key: Path | None = setting(None, "PEM private key", metavar="PEM")
    tls_client_ca: Path | None = setting(None, "PEM CA certificate(s): require client certificates signed by it on "
                                               "both ports (mutual TLS; needs --tls-cert)", metavar="PEM")
    max_request_bytes: int = setting(16 * 1024 * 1024, "largest accepted request message, bytes", at_least=1)
    grace_s: float = setting(5.0, "seconds running jobs get to finish on SIGTERM", at_least=0)
    artifact_grace_s: float = setting(10.0, "seconds the artifact port serves on after the running jobs ended on "
                                            "SIGTERM (so their artifacts can be fetched)", at_least=0)
    max_stream_buffer_bytes: int = setting(
        4 * 1024 * 1024, "audio bytes one stream may hold for a client that reads slower than the audio is made "
                         "(4 MiB: 87 s of s16le); past it the stream ends (RESOURCE_EXHAUSTED) and the job runs on "
                         "for its artifact", at_least=64 * 1024)
    max_buffered_audio_bytes: int = setting(
        128 * 1024 * 1024, "audio bytes all streams together may hold for their clients; a stream whose next "
                           "chunk would pass it ends as one over --max-stream-buffer-bytes does",
        at_least=64 * 1024)
    reader_stall_s: float = setting(
        10.0, "seconds a client may take no audio while some waits for it; then its stream ends "
              "(RESOURCE_EXHAUSTED) and the job runs on for its artifact, as it does when a client that took "
              "nothing this long goes away", positive=True)
    # what any peer, authenticated or not, can make the worker hold (docs/operations.md, "Bounds")
    max_streams_per_connection: int = setting(128, "calls one client connection may have open at once, on each "
                                                   "port (HTTP/2 concurrent streams)", at_least=1)
    max_calls: int = setting(2048, "calls open at once on each port, all connections together; one more is "
                                   "refused with RESOURCE_EXHAUSTED", at_least=16)
    health_max_watchers: int = setting(1024, "health Watch calls open at once, both ports together (health is "
                                             "open without a token); one more is refused with RESOURCE_EXHAUSTED",
                                       at_least=1)
    first_message_timeout_s: float = setting(15.0, "seconds a call may take to send its request message after it "
                                                   "opened; then it ends with DEADLINE_EXCEEDED", positive=True)
    max_waiting_calls_per_peer: int = setting(64, "calls one address may have open that have not sent their "
                                                  "request message yet; one more is refused with "
                                                  "RESOURCE_EXHAUSTED", at_least=1)
    keepalive_time_s: float = setting(60.0, "seconds between the worker's pings on a connection, to find peers "
                                            "that are gone", positive=True)
    keepalive_timeout_s: float = setting(20.0, "seconds a peer has to answer a ping, and to acknowledge data "
                                               "sent to it (TCP user timeout), before its connection is closed",
                                         positive=True)
    max_connection_idle_s: float = setting(300.0, "seconds a connection with no call open is kept (its client "
                                                  "reconnects when it calls again); 0: for ever", at_least=0)
    handshake_timeout_s: float = setting(10.0, "seconds a new connection has to finish its TLS and HTTP/2 "
                                               "handshakes", positive=True)
    metrics_max_connections: int = setting(256, "connections the metrics listener holds at once; at the bound, "
                                                "the oldest connection that has not sent its request is closed "
                                                "for a new one", at_least=2)
    metrics_max_connections_per_peer: int = setting(16, "connections one address may hold on the metrics "
                                                        "listener; its oldest is closed for a new one", at_least=1)
    metrics_read_timeout_s: float = setting(5.0, "seconds a metrics client has to send its request",
                                            positive=True)
    switch_interval_ms: float = setting(
        0.5, "the interpreter's thread switch interval, ms (Python's default: 5): every torch call of the engine "
             "thread gives up the interpreter lock and may wait this long to get it back from the event loop",
        at_least=0.05, at_most=100.0)
    gc_freeze: bool = setting(True, "once the model is loaded and warm, move every object made so far out of the "
                                    "garbage collector's reach (gc.freeze): compiling leaves millions of objects "
                                    "whose full collections would stall every stream")

    def validate(self) -> None:
        label = {f.name: f.label for f in setting_fields(ServerSettings)}
        if self.port == self.artifact_port and self.port != 0:
            raise SettingsError(f"the artifact channel needs its own port: {label['artifact_port']} must differ "
                                f"from {label['port']}")
        if self.max_buffered_audio_bytes < self.max_stream_buffer_bytes:
            raise SettingsError(f"{label['max_buffered_audio_bytes']} (all streams) must be at least "
                                f"{label['max_stream_buffer_bytes']} (one stream), {self.max_stream_buffer_bytes}")
        advertised = self.advertised_artifact_address
        if advertised is not None:
            port = advertised.rpartition("]")[2] if advertised.startswith("[") else advertised
            port = port.rpartition(":")[2] if ":" in port else ""
            if not (port.isdigit() and 1 <= int(port) <= 65535):
                raise SettingsError(f"{label['advertised_artifact_address']} {advertised}: clients dial it, so it "
                                    "needs a port, a number from 1 to 65535 (HOST:PORT)")
        if self.auth_token is not None and len(self.auth_token) < MIN_TOKEN_CHARS:
            raise SettingsError(f"{label['auth_token']}: the bearer token is {len(self.auth_token)} characters; use "
                                f"at least {MIN_TOKEN_CHARS} (a random one: openssl rand -hex 32)")
        if self.reader_stall_s >= self.keepalive_timeout_s:
            raise SettingsError(f"{label['reader_stall_s']} ({self.reader_stall_s:g}) must be less than "
                                f"{label['keepalive_timeout_s']} ({self.keepalive_timeout_s:g}): the connection of a "
                                "peer that stopped reading is closed then, and the worker must end its stream first")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise SettingsError(f"TLS needs both {label['tls_cert']} and {label['tls_key']}")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise SettingsError(f"{label['tls_client_ca']} (client certificates) needs TLS: add "
                                f"{label['tls_cert']} and {label['tls_key']}")
        if not self.listens_on_loopback and not self.auth_token and self.tls_client_ca is None \
                and not self.allow_insecure:
            raise SettingsError(
                f"refusing to listen on {self.host} without authentication: anyone who can reach it could use "
                f"the worker. Set a bearer token ({label['auth_token']}) and TLS ({label['tls_cert']}, "
                f"{label['tls_key']}), or require client certificates ({label['tls_client_ca']}); or listen on "
                f"127.0.0.1; or pass {label['allow_insecure']} to serve an open worker on purpose")

    @property
    def listens_on_loopback(self) -> bool:
        return is_loopback(self.host)


@dataclass(frozen=True)
class HttpSettings(_Section):
    """The optional HTTP face (transport/http/): the official API, the OpenAI speech API and the listening page.
    Authentication and TLS are the server section's (--token, --tls-*)."""

    ENV_PREFIX: ClassVar[str] = "BREEZE_HTTP_"
    FLAG_PREFIX: ClassVar[str] = "http-"
    port: int | None = setting(None, "serve the HTTP face (POST /v1/audio/speech, the listening page at /) on this "
                                     "port (0: any free port; default: off)", at_least=0, at_most=65535,
                               metavar="PORT")
    host: str = setting("127.0.0.1", "address the HTTP face binds (anything but loopback needs a token or client "
                                     "certificates, as --host)")
    read_timeout_s: float = setting(30.0, "seconds a client gets to send a request's head, and again its body; "
                                          "slower: the connection is closed (408 once the head is in)",
                                    positive=True)
    voices_dir: Path | None = setting(None, "directory of voices for the OpenAI body's `voice`: NAME.wav with its "
                                            "exact transcript in NAME.txt (default: only the model's own voice)",
                                      metavar="DIR")
    reference_fp32: bool = setting(False, "load a second copy of the model in FP32 so the listening page can "
                                          "render a request at the reference precision beside the serving one "
                                          "(memory: the model again, in FP32)")
    reference_device: str | None = setting(None, "device of the FP32 reference copy: cpu, cuda or cuda:N "
                                                 "(default: the engine's)", metavar="DEVICE")

    def validate(self) -> None:
        if self.voices_dir is not None and not Path(self.voices_dir).is_dir():
            raise SettingsError(f"{_field(HttpSettings, 'voices_dir').label}: {self.voices_dir} is not a "
                                "directory: give a directory of NAME.wav + NAME.txt pairs")
        device = self.reference_device
        if device is not None and device not in ("auto", "cpu") and not device.startswith("cuda"):
            raise SettingsError(f"{_field(HttpSettings, 'reference_device').label} must be cpu, cuda or cuda:N, "
                                f"not {device!r}")

    @property
    def listens_on_loopback(self) -> bool:
        return is_loopback(self.host)


@dataclass(frozen=True)
class WorkerSettings:
    engine: EngineSettings = section(EngineSettings)
    artifacts: ArtifactSettings = section(ArtifactSettings)
    server: ServerSettings = section(ServerSettings)
    http: HttpSettings = section(HttpSettings)

    def validate(self) -> WorkerSettings:
        """The checks across fields and against the host, of every section; returns self."""
        self.engine.validate()
        self.engine.fastpath.validate()
        self.artifacts.validate()
        self.server.validate()
        self.http.validate()
        s = self.server
        if self.http.port is not None and not self.http.listens_on_loopback and not s.auth_token \
                and s.tls_client_ca is None and not s.allow_insecure:
            raise SettingsError(f"refusing to listen on {self.http.host} ({_field(HttpSettings, 'host').label}) "
                                "without authentication: set a token or client certificates as for --host, listen "
                                "on 127.0.0.1, or pass --allow-insecure")
        return self

    @classmethod
    def load(cls, environ: Mapping[str, str] | None = None,
             overrides: Mapping[str, Any] | None = None) -> WorkerSettings:
        """The settings: each field from `overrides` (by `SettingField.dest`, e.g. the serve flags), else its
        environment variable (`environ`; None: the process environment), else its default. Not yet
        `validate`d across fields; a bad value raises SettingsError naming the flag and the variable."""
        env = os.environ if environ is None else environ
        given = dict(overrides or {})
        values: dict[tuple[str, ...], Any] = {}
        for f in setting_fields(cls):  # type: ignore[arg-type]  # mypy#11470, as in _Section.__post_init__
            if given.get(f.dest) is not None:
                values[f.path] = given[f.dest]
            elif f.env in env and (env[f.env].strip() or f.optional):  # empty: unset, or None where allowed
                try:
                    values[f.path] = f.convert(env[f.env])
                except SettingsError as exc:
                    raise SettingsError(f"{f.env}={env[f.env]!r} ({f.flag}): {exc}") from None
        return _build(cls, (), values)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> WorkerSettings:
        """The settings the environment gives (BREEZE_ENGINE_DEVICE=cuda:0, BREEZE_FASTPATH_FORM=gemm, ...)."""
        return cls.load(environ)


def _build(cls: type, path: tuple[str, ...], values: dict[tuple[str, ...], Any]) -> Any:
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.metadata.get("section"):
            kwargs[f.name] = _build(typing.get_type_hints(cls)[f.name], path + (f.name,), values)
        elif path + (f.name,) in values:
            kwargs[f.name] = values[path + (f.name,)]
    return cls(**kwargs)


def recorded_commit(environ: Mapping[str, str] | None = None) -> str | None:
    """The commit a bench records when none is passed: $BREEZE_COMMIT (set by the device runner)."""
    return (os.environ if environ is None else environ).get("BREEZE_COMMIT") or None
