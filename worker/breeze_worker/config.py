"""Typed, validated worker settings: the one source of configuration.

`WorkerSettings.from_env()` is where the worker's settings are read from the environment (never at import
time); CLI flags override them. Each validation message says what to change. The fast path's settings are
`EngineSettings` fields read from their own variables (`BREEZE_FASTPATH_*`, `BREEZE_FUSED_*`, field metadata
"env"); the engine turns them into its typed `FastPathSettings` (engine/fastpath/settings.py).
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

ENV_PREFIX = "BREEZE_"


@dataclass(frozen=True)
class EngineSettings:
    model_dir: Path | None = None  # None: the tiny embedded default (its audio is not speech)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    precision: str = "auto"  # auto | fp32 | bf16 | fp16-mixed
    force_precision: bool = False  # allow bf16 on a device without native bf16 (emulated, slow)
    fast_path: str = "auto"  # auto | eager | fast   (auto: fast on CUDA, eager on CPU)
    max_active_streams: int = 8  # streams decoding at once
    max_queue: int = 32  # requests waiting for a slot
    max_queue_wait_s: float = 30.0  # a request waiting longer gets RESOURCE_EXHAUSTED
    max_text_chars: int = 2000
    max_reference_seconds: float = 30.0
    min_reference_seconds: float = 1.0  # shorter reference audio is refused (too little speech to clone)
    reference_cache_entries: int = 64
    # the codec's convolutions in TF32 where the device has it (compute capability >= 8.0); else true FP32
    # TF32 convolutions in the codec where the device has them (compute capability >= 8.0), as PyTorch's own
    # default does for cuDNN (so the reference code run with PyTorch's defaults); 0: strict FP32
    codec_tf32: bool = True
    # the codec's batched step through torch.compile (Inductor), so its small element-wise kernels fuse; each
    # slot bucket compiles once, at warm-up, before its CUDA graph is captured (engine/codec_graphs.py)
    codec_compile: bool = False
    # decode a step's audio on a CUDA stream of its own and read it during the next step (off by default: on
    # an H200 it stalled 16-stream bursts for ~8.7 s at a time; docs/performance.md)
    codec_overlap: bool = False
    # the fast path (engine/fastpath/settings.py FastPathSettings says what each does), each from its own variable
    fastpath_compile: str = field(default="auto", metadata={"env": "BREEZE_FASTPATH_COMPILE"})  # auto | on | off
    fastpath_compile_backend: str = field(default="inductor", metadata={"env": "BREEZE_FASTPATH_COMPILE_BACKEND"})
    fastpath_form: str = field(default="auto", metadata={"env": "BREEZE_FASTPATH_FORM"})  # auto | a layer form
    fastpath_tune: bool = field(default=False, metadata={"env": "BREEZE_FASTPATH_TUNE"})
    fastpath_sampler: str = field(default="auto", metadata={"env": "BREEZE_FASTPATH_SAMPLER"})  # auto|kernel|torch
    fastpath_read_overlap: bool = field(default=True, metadata={"env": "BREEZE_FASTPATH_READ_OVERLAP"})
    fastpath_pipeline: bool = field(default=False, metadata={"env": "BREEZE_FASTPATH_PIPELINE"})
    fused_chained: bool = field(default=True, metadata={"env": "BREEZE_FUSED_PDL"})  # chained kernel launches
    fused_plans: str = field(default="", metadata={"env": "BREEZE_FUSED_CONFIG"})  # launch-plan overrides, JSON

    def validate(self) -> None:
        if self.device != "auto" and self.device != "cpu" and not self.device.startswith("cuda"):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, not {self.device!r}")
        if self.precision not in ("auto", "fp32", "bf16", "fp16-mixed"):
            raise ValueError(f"precision must be auto, fp32, bf16 or fp16-mixed, not {self.precision!r}")
        if self.fast_path not in ("auto", "eager", "fast"):
            raise ValueError(f"fast_path must be auto, eager or fast, not {self.fast_path!r}")
        for name in ("max_active_streams", "max_queue", "max_text_chars", "reference_cache_entries"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        if self.max_queue_wait_s <= 0 or self.max_reference_seconds <= 0:
            raise ValueError("max_queue_wait_s and max_reference_seconds must be positive")
        if not 0 <= self.min_reference_seconds <= self.max_reference_seconds:
            raise ValueError(f"min_reference_seconds must be in 0..max_reference_seconds "
                             f"({self.max_reference_seconds:g}), not {self.min_reference_seconds:g}")
        if self.model_dir is not None and not Path(self.model_dir).is_dir():
            raise ValueError(f"model directory {self.model_dir} does not exist: pass a checkpoint directory")
        from breeze_worker.engine.fastpath.settings import FastPathSettings

        FastPathSettings.from_engine(self)  # the fast-path fields: raises with what to change


@dataclass(frozen=True)
class ArtifactSettings:
    directory: Path = Path("artifacts")
    max_age_s: float = 24 * 3600.0  # artifacts older than this are deleted
    max_total_bytes: int = 10 * 1024**3  # oldest artifacts are deleted beyond this total
    # free space kept on the artifact disk: below it the oldest artifacts (past min_keep_s) are evicted, and a
    # job that still cannot have it streams its audio without an artifact (the store reports itself degraded)
    min_free_bytes: int = 256 * 1024**2
    min_keep_s: float = 300.0  # eviction for free space never takes an artifact younger than this
    # test-only fault injection (diagnosis and storage-fault tests): delays in seconds, 0 = off; an artifact
    # write that would take its file past fault_eio_after_bytes fails with EIO (0 = off)
    fault_commit_delay_s: float = 0.0
    fault_first_byte_delay_s: float = 0.0
    fault_eio_after_bytes: int = 0
    # test-only: the commit's fsync (write) and each Fetch read take as long as a volume moving this many
    # bytes/s would (0 = off); the diagnosis tests use them where no cgroup I/O limit can throttle a real volume
    fault_storage_write_bytes_per_s: float = 0.0
    fault_storage_read_bytes_per_s: float = 0.0

    def validate(self) -> None:
        if self.max_age_s <= 0 or self.max_total_bytes <= 0:
            raise ValueError("artifact retention limits must be positive")
        if self.min_free_bytes < 0 or self.min_keep_s < 0:
            raise ValueError("min_free_bytes and min_keep_s must be >= 0 (0 turns the free-space headroom off)")
        if min(self.fault_commit_delay_s, self.fault_first_byte_delay_s, self.fault_eio_after_bytes,
               self.fault_storage_write_bytes_per_s, self.fault_storage_read_bytes_per_s) < 0:
            raise ValueError("fault settings must be >= 0")


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
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 50051  # Synthesize (0 = pick a free port)
    artifact_port: int = 50052  # Artifacts (0 = pick a free port)
    auth_token: str | None = None  # if set, every call needs `authorization: Bearer <token>`
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None  # if set, clients must present a certificate signed by this CA (mTLS)
    # serve on a non-loopback host with neither a token nor client certificates (refused without it)
    allow_insecure: bool = False
    max_request_bytes: int = 16 * 1024 * 1024  # largest accepted request message
    grace_s: float = 5.0  # on SIGTERM, running jobs get this long to finish
    artifact_grace_s: float = 10.0  # then the artifact port serves this long more, so finished jobs can be fetched
    # audio of one stream waiting for a client that reads slower than it is generated; past it the stream ends
    # with RESOURCE_EXHAUSTED and the job runs on to commit its artifact
    max_stream_buffer_bytes: int = 16 * 1024 * 1024
    metrics_port: int | None = None  # Prometheus text on GET /metrics (+ /healthz); None: off
    metrics_host: str | None = None  # address of the metrics listener (None: the same as host)
    advertised_artifact_address: str | None = None  # host:port clients use for artifacts (None: host:artifact_port)
    # the synthesis port asks each client connection to reconnect after this long (streams in flight finish
    # first), so a client of a fleet address resolves it again and finds workers added since; 0: never
    max_connection_age_s: float = 300.0

    def validate(self) -> None:
        for name in ("port", "artifact_port"):
            v = getattr(self, name)
            if not 0 <= v <= 65535:
                raise ValueError(f"{name} must be in 0..65535, not {v}")
        if self.port == self.artifact_port and self.port != 0:
            raise ValueError("the artifact channel needs its own port: --artifact-port must differ from --port")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("TLS needs both --tls-cert and --tls-key")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("--tls-client-ca (client certificates) needs TLS: add --tls-cert and --tls-key")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"metrics_port must be in 0..65535, not {self.metrics_port}")
        if not self.listens_on_loopback and not self.auth_token and self.tls_client_ca is None \
                and not self.allow_insecure:
            raise ValueError(
                f"refusing to listen on {self.host} without authentication: anyone who can reach it could use "
                "the worker. Set a bearer token (BREEZE_SERVER_AUTH_TOKEN) and TLS (--tls-cert/--tls-key), or "
                "require client certificates (--tls-client-ca); or listen on 127.0.0.1; or pass "
                "--allow-insecure to serve an open worker on purpose")
        if self.max_connection_age_s < 0:
            raise ValueError(f"--max-connection-age-s must be >= 0 (0: never), not {self.max_connection_age_s}")
        if self.grace_s < 0 or self.artifact_grace_s < 0:
            raise ValueError("--grace-s and --artifact-grace-s must be >= 0")
        if self.max_stream_buffer_bytes < 64 * 1024:
            raise ValueError(f"--max-stream-buffer-bytes must be at least 65536 (a few frames of audio), "
                             f"not {self.max_stream_buffer_bytes}")

    @property
    def listens_on_loopback(self) -> bool:
        return is_loopback(self.host)


@dataclass(frozen=True)
class WorkerSettings:
    engine: EngineSettings = field(default_factory=EngineSettings)
    artifacts: ArtifactSettings = field(default_factory=ArtifactSettings)
    server: ServerSettings = field(default_factory=ServerSettings)

    def validate(self) -> "WorkerSettings":
        self.engine.validate()
        self.artifacts.validate()
        self.server.validate()
        return self

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> "WorkerSettings":
        """Read BREEZE_<SECTION>_<FIELD> variables (e.g. BREEZE_ENGINE_DEVICE=cuda:0), or the variable a
        field's metadata names (the fast path's: BREEZE_FASTPATH_*, BREEZE_FUSED_*)."""
        env = dict(os.environ if environ is None else environ)
        sections = {}
        for section_name, section in (("engine", EngineSettings()), ("artifacts", ArtifactSettings()),
                                      ("server", ServerSettings())):
            changes = {}
            for f in fields(section):
                key = f.metadata.get("env") or f"{ENV_PREFIX}{section_name.upper()}_{f.name.upper()}"
                if key in env:
                    changes[f.name] = _parse(env[key], getattr(section, f.name), f.type, key)
            sections[section_name] = replace(section, **changes)
        return cls(**sections)


def _parse(raw: str, default, type_name, key: str):
    text = str(type_name)
    try:
        if "Path" in text:
            return Path(raw) if raw else None
        if "bool" in text:
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if "int" in text and "float" not in text:
            return int(raw)
        if "float" in text:
            return float(raw)
        return raw or (None if default is None else raw)
    except ValueError:
        raise ValueError(f"environment variable {key}={raw!r} is not a valid {text}") from None
