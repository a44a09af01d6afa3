"""`breeze-worker serve`: load the model once, serve Synthesize and the artifact channel until SIGTERM.

Flags are generated from the typed settings in `breeze_worker.config` (defaults shown come from there,
environment variables BREEZE_<SECTION>_<FIELD> are read first and flags override them). When both
servers listen and the model is warm, one line goes to stdout:
    breeze-worker ready: synthesis=HOST:PORT artifacts=HOST:PORT model=...
The test-only faults (--fault-*, BREEZE_ARTIFACTS_FAULT_*) are hidden from --help; when one is
non-zero the worker logs a WARNING at startup and the ready line ends with `TEST FAULTS ON: ...`.

SIGTERM (or SIGINT) drains in order: health reports NOT_SERVING and new synthesis is refused with
UNAVAILABLE (queued requests too), running jobs get --grace-s to finish, then the synthesis port closes
and the artifact port serves --artifact-grace-s longer so finished jobs can still be fetched. A second
signal ends the artifact grace early.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from dataclasses import fields, replace
from pathlib import Path

from breeze_worker.config import ArtifactSettings, EngineSettings, ServerSettings, WorkerSettings
from breeze_worker.errors import BreezeError

log = logging.getLogger("breeze_worker.serve")

_SECTIONS = {"engine": EngineSettings, "artifacts": ArtifactSettings, "server": ServerSettings}
# (section, field, flag, help); the type and the default come from the settings dataclass
FLAGS: list[tuple[str, str, str, str]] = [
    ("engine", "model_dir", "--model", "Breeze TTS 2 checkpoint directory (default: the tiny embedded model, "
                                       "whose audio is NOT speech)"),
    ("engine", "device", "--device", "auto | cpu | cuda | cuda:N"),
    ("engine", "precision", "--precision", "auto | fp32 | bf16 | fp16-mixed"),
    ("engine", "fast_path", "--fast-path", "auto | eager | fast"),
    ("engine", "max_active_streams", "--max-active-streams", "streams decoding at once"),
    ("engine", "max_queue", "--max-queue", "requests waiting for a slot"),
    ("engine", "max_queue_wait_s", "--max-queue-wait-s", "longest wait for a slot, seconds"),
    ("engine", "max_text_chars", "--max-text-chars", "longest accepted text"),
    ("engine", "force_precision", "--force-precision", "run --precision bf16 even where the device only "
                                                       "emulates it (slow; refused otherwise)"),
    ("engine", "max_reference_seconds", "--max-reference-seconds", "longest accepted reference audio"),
    ("engine", "min_reference_seconds", "--min-reference-seconds", "shortest accepted reference audio"),
    ("engine", "reference_cache_entries", "--reference-cache-entries", "encoded references kept in memory"),
    ("engine", "codec_tf32", "--codec-tf32", "TF32 convolutions in the codec where the device has them "
                                             "(compute capability >= 8.0), as PyTorch's default; on by default "
                                             "(BREEZE_ENGINE_CODEC_TF32=0: strict FP32)"),
    ("engine", "codec_compile", "--codec-compile", "compile the codec's batched step with torch.compile "
                                                   "(Inductor) at warm-up, each slot bucket once (slower start)"),
    ("engine", "codec_overlap", "--codec-overlap", "decode each step's audio on its own CUDA stream while the "
                                                   "next step runs (experimental: stalls seen at 16 streams)"),
    ("server", "host", "--host", "address to listen on (0.0.0.0 for all interfaces)"),
    ("server", "port", "--port", "Synthesize port (0 = any free port)"),
    ("server", "artifact_port", "--artifact-port", "Artifacts port (0 = any free port)"),
    ("server", "advertised_artifact_address", "--advertise-artifact-address",
     "host:port that clients should use for artifacts (default: host:artifact-port)"),
    ("server", "max_connection_age_s", "--max-connection-age-s",
     "seconds after which a client connection to the synthesis port is asked to reconnect (its streams finish "
     "first), so clients of a fleet address resolve it again and find new workers; 0 = never"),
    ("server", "auth_token", "--token", "require 'authorization: Bearer TOKEN' on every call but health "
                                        "(prefer the environment variable BREEZE_SERVER_AUTH_TOKEN)"),
    ("server", "allow_insecure", "--allow-insecure", "serve on a non-loopback --host with neither a token nor "
                                                     "client certificates (refused otherwise)"),
    ("server", "metrics_port", "--metrics-port", "serve Prometheus metrics on GET /metrics of this port "
                                                 "(off by default)"),
    ("server", "metrics_host", "--metrics-host", "address the metrics listener binds (default: the --host value)"),
    ("server", "tls_cert", "--tls-cert", "PEM certificate chain (TLS on both ports; needs --tls-key)"),
    ("server", "tls_key", "--tls-key", "PEM private key"),
    ("server", "tls_client_ca", "--tls-client-ca", "PEM CA certificate(s): require client certificates signed "
                                                   "by it on both ports (mutual TLS; needs --tls-cert)"),
    ("server", "max_request_bytes", "--max-request-bytes", "largest accepted request message"),
    ("server", "grace_s", "--grace-s", "seconds running jobs get to finish on SIGTERM"),
    ("server", "artifact_grace_s", "--artifact-grace-s", "seconds the artifact port serves on after the running "
                                                         "jobs ended on SIGTERM (so their artifacts can be fetched)"),
    ("server", "max_stream_buffer_bytes", "--max-stream-buffer-bytes",
     "audio bytes one stream may hold for a client that reads slower than real time; past it the stream ends "
     "(RESOURCE_EXHAUSTED) and the job runs on for its artifact"),
    ("artifacts", "directory", "--artifact-dir", "where WAV artifacts are written"),
    ("artifacts", "max_age_s", "--artifact-max-age-s", "artifacts older than this are deleted"),
    ("artifacts", "max_total_bytes", "--artifact-max-bytes", "oldest artifacts are deleted beyond this total"),
    ("artifacts", "min_free_bytes", "--artifact-min-free-bytes",
     "free space kept on the artifact disk: the oldest artifacts are evicted to keep it, and a job that cannot "
     "have it streams without an artifact (0 = off)"),
    ("artifacts", "min_keep_s", "--artifact-min-keep-s", "eviction for free space never takes an artifact younger "
                                                         "than this"),
    ("artifacts", "fault_commit_delay_s", "--fault-commit-delay-s", argparse.SUPPRESS),  # test-only
    ("artifacts", "fault_first_byte_delay_s", "--fault-first-byte-delay-s", argparse.SUPPRESS),  # test-only
    ("artifacts", "fault_eio_after_bytes", "--fault-eio-after-bytes", argparse.SUPPRESS),  # test-only
    ("artifacts", "fault_storage_write_bytes_per_s", "--fault-storage-write-bytes-per-s", argparse.SUPPRESS),
    ("artifacts", "fault_storage_read_bytes_per_s", "--fault-storage-read-bytes-per-s", argparse.SUPPRESS),
]


def _field_type(section: str, name: str):
    default = {f.name: f for f in fields(_SECTIONS[section])}[name]
    text = str(default.type)
    if text == "bool":
        return bool
    if "Path" in text:
        return Path
    if "float" in text:
        return float
    if "int" in text:
        return int
    return str


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for section, name, flag, help_text in FLAGS:
        default = getattr(_SECTIONS[section](), name)
        if help_text is not argparse.SUPPRESS:
            help_text = f"{help_text} (default: {default})" if default is not None else help_text
        kind = _field_type(section, name)
        if kind is bool:  # a switch: present = True; absent = the environment's value or the default
            parser.add_argument(flag, dest=f"{section}__{name}", action="store_const", const=True, default=None,
                                help=help_text)
            continue
        metavar = "DIR" if kind is Path and "dir" in name + flag else flag.lstrip("-").split("-")[-1].upper()
        parser.add_argument(flag, dest=f"{section}__{name}", type=kind, default=None, help=help_text,
                            metavar=metavar)


def active_faults(settings: WorkerSettings) -> str:
    """The non-zero test-only fault settings, e.g. 'fault_commit_delay_s=0.4' ('' when none is set)."""
    a = settings.artifacts
    names = ("fault_commit_delay_s", "fault_first_byte_delay_s", "fault_eio_after_bytes",
             "fault_storage_write_bytes_per_s", "fault_storage_read_bytes_per_s")
    return " ".join(f"{name}={getattr(a, name):g}" for name in names if getattr(a, name) > 0)


def settings_from_args(args: argparse.Namespace, environ: dict[str, str] | None = None) -> WorkerSettings:
    """Environment first, flags over it; validated (ValueError says what to change)."""
    settings = WorkerSettings.from_env(environ)
    changes: dict[str, dict] = {s: {} for s in _SECTIONS}
    for section, name, _, _ in FLAGS:
        value = getattr(args, f"{section}__{name}", None)
        if value is not None:
            changes[section][name] = value
    settings = WorkerSettings(**{s: replace(getattr(settings, s), **changes[s]) for s in _SECTIONS})
    return settings.validate()


async def serve(settings: WorkerSettings) -> int:
    from breeze_worker.artifacts.store import ArtifactStore
    from breeze_worker.engine.service import Engine
    from breeze_worker.transport.server import create_server, host_port

    if settings.engine.model_dir is None:
        log.warning("no --model given: serving the TINY EMBEDDED DEFAULT (random weights); its audio is NOT "
                    "speech. Pass --model DIR with a Breeze TTS 2 checkpoint for real synthesis.")
    faults = active_faults(settings)
    if faults:
        log.warning("TEST-ONLY FAULT INJECTION IS ON (%s): artifact commits or fetches are delayed, or artifact "
                    "writes fail, on purpose. Unset --fault-* / BREEZE_ARTIFACTS_FAULT_* outside the tests.", faults)
    store = ArtifactStore(settings.artifacts)
    engine = Engine(settings.engine, store)
    servers = await create_server(settings, engine, store)
    stop, hurry = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:  # the first signal drains; a second one ends the artifact grace early
        (hurry if stop.is_set() else stop).set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    metrics = None
    if settings.server.metrics_port is not None:
        from breeze_worker.engine.metrics import CONTENT_TYPE
        from breeze_worker.transport.metrics_http import MetricsServer

        metrics = MetricsServer(engine.metrics.render, lambda: engine.ready, CONTENT_TYPE)
        metrics_host = settings.server.metrics_host or settings.server.host
        port = await metrics.start(metrics_host, settings.server.metrics_port)
        log.info("metrics on http://%s/metrics", host_port(metrics_host, port))
    starting = asyncio.create_task(engine.start())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    code = 0
    if starting.done() and starting.exception() is None and not stop.is_set():
        await servers.set_serving(True)
        host = settings.server.host
        model = "tiny-default (audio is NOT speech)" if engine.is_tiny_default else engine.model_description
        print(f"breeze-worker ready: synthesis={host}:{servers.synthesis_port} "
              f"artifacts={host}:{servers.artifact_port} model={model}"
              + (f"; TEST FAULTS ON: {faults}" if faults else ""), flush=True)
        await stopping
    elif starting.done() and starting.exception() is not None:
        exc = starting.exception()
        if isinstance(exc, (ValueError, BreezeError)):  # a setting or checkpoint to fix: its message says how
            log.error("the engine failed to start: %s", exc)
        else:
            log.error("the engine failed to start", exc_info=exc)
        code = 1
    stopping.cancel()
    await _drain(settings, engine, servers, served=code == 0 and starting.done(), hurry=hurry)
    if metrics is not None:
        await metrics.stop()
    if not starting.done():
        await asyncio.wait({starting}, timeout=settings.server.grace_s)
    await engine.stop()
    log.info("stopped")
    return code


async def _drain(settings: WorkerSettings, engine, servers, *, served: bool, hurry: asyncio.Event) -> None:
    """The shutdown order: NOT_SERVING and new synthesis refused; running jobs finish within --grace-s; the
    synthesis port closes; the artifact port serves --artifact-grace-s more; then it closes too."""
    s = settings.server
    await servers.begin_drain()
    if served:
        log.info("stopping: NOT_SERVING, new synthesis refused; running jobs get %.1f s to finish", s.grace_s)
        left = await engine.drain(s.grace_s)
        if left:
            log.warning("%d job(s) still running after --grace-s %.1f s end now with UNAVAILABLE", left, s.grace_s)
    await engine.stop()  # ends whatever is still running; the calls below then send their last messages
    await servers.stop_synthesis(1.0)
    if served and s.artifact_grace_s > 0 and not hurry.is_set():
        log.info("synthesis closed; the artifact port serves %.1f s more so finished jobs can be fetched "
                 "(signal again to stop now)", s.artifact_grace_s)
        try:
            await asyncio.wait_for(hurry.wait(), s.artifact_grace_s)
        except asyncio.TimeoutError:
            pass
    await servers.stop_artifacts(1.0)


def run(args: argparse.Namespace) -> int:
    try:
        settings = settings_from_args(args)
    except ValueError as exc:
        print(f"breeze-worker serve: {exc}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(serve(settings))
    except OSError as exc:  # a port in use, an unwritable artifact directory, an unreadable TLS file
        print(f"breeze-worker serve: {exc}", file=sys.stderr)
        return 1
