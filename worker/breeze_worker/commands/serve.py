"""`breeze-worker serve`: load the model once, serve Synthesize and the artifact channel until SIGTERM.

Every flag is generated from a field of the typed settings in `breeze_worker.config` (its help, default and
environment variable, BREEZE_<SECTION>_<FIELD>, come from there; a flag overrides its variable; a switch
--x has its --no-x). When both servers listen and the model is warm, one line goes to stdout:
    breeze-worker ready: synthesis=HOST:PORT artifacts=HOST:PORT model=...; streams N/M ready
(N < M while the start-up builds the rest in the background, engine/startup.py; a log line says when all M are).
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
import gc
import logging
import signal
import sys
import time

from breeze_worker import logs
from breeze_worker.config import ServerSettings, SettingField, SettingsError, WorkerSettings, setting_fields
from breeze_worker.errors import BreezeError

log = logging.getLogger("breeze_worker.serve")

_GROUPS = {"engine": "engine", "fastpath": "fast path (measurement and tuning)", "server": "server",
           "artifacts": "artifacts", "http": "HTTP face (official API, OpenAI speech API, listening page)"}


def _group_of(f: SettingField) -> str:
    return _GROUPS[f.path[1] if f.path[0] == "engine" and len(f.path) > 2 else f.path[0]]


def _help(f: SettingField) -> str:
    if f.spec.hidden:
        return argparse.SUPPRESS
    if f.default is None or f.default == {}:
        text = f"{f.spec.help} (env {f.env})"
    else:
        default = ("on" if f.default else "off") if f.kind is bool else f.default
        text = f"{f.spec.help} (default: {default}; env {f.env})"
    return text.replace("%", "%%")  # argparse formats help with %


def _metavar(f: SettingField) -> str:
    if f.spec.metavar:
        return f.spec.metavar
    if f.spec.choices:
        return "{" + ",".join(f.spec.choices) + "}"
    if f.kind in (int, float):
        return "SECONDS" if f.name.endswith(("_s", "_seconds")) else "N"
    return f.name.split("_")[-1].upper()


def _converter(f: SettingField):
    def convert(text: str):
        try:
            return f.convert(text)
        except SettingsError as exc:
            raise argparse.ArgumentTypeError(f"{exc} (the variable: {f.env})") from None

    return convert


def add_arguments(parser: argparse.ArgumentParser, sections: tuple[str, ...] | None = None) -> None:
    """One flag per setting of `WorkerSettings` (breeze_worker/config.py): its help, its default and its
    variable come from the field; absent flags leave the variable's value or the default. `sections`: only
    those sections' settings (`compile` takes the engine's)."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for f in setting_fields(WorkerSettings):
        if sections is not None and f.path[0] not in sections:
            continue
        title = _group_of(f)
        group = groups.get(title) or groups.setdefault(title, parser.add_argument_group(title))
        if f.kind is bool:  # --flag / --no-flag; absent: None
            group.add_argument(f.flag, dest=f.dest, action=argparse.BooleanOptionalAction, default=None,
                               help=_help(f))
        else:
            group.add_argument(f.flag, dest=f.dest, type=_converter(f), default=None, metavar=_metavar(f),
                               help=_help(f))


def active_faults(settings: WorkerSettings) -> str:
    """The non-zero test-only fault settings, e.g. 'fault_commit_delay_s=0.4' ('' when none is set)."""
    a = settings.artifacts
    names = ("fault_commit_delay_s", "fault_first_byte_delay_s", "fault_eio_after_bytes",
             "fault_storage_write_bytes_per_s", "fault_storage_read_bytes_per_s")
    return " ".join(f"{name}={getattr(a, name):g}" for name in names if getattr(a, name) > 0)


def settings_from_args(args: argparse.Namespace, environ: dict[str, str] | None = None) -> WorkerSettings:
    """Each setting from its flag, else its environment variable (`environ`; None: the process's), else its
    default; validated (SettingsError, a ValueError, names the flag and the variable to change)."""
    overrides = {f.dest: getattr(args, f.dest, None) for f in setting_fields(WorkerSettings)}
    return WorkerSettings.load(environ, overrides).validate()


def tune_interpreter(server: ServerSettings, metrics) -> None:
    """The worker process's interpreter, set once the engine is warm: the thread switch interval, the start-up
    objects frozen out of the garbage collector's reach, and every collection's pause counted in `metrics`."""
    sys.setswitchinterval(server.switch_interval_ms / 1000)
    if server.gc_freeze:
        t0 = time.perf_counter()
        gc.collect()
        collect_s = time.perf_counter() - t0
        gc.freeze()
        log.info("garbage collector: %d start-up objects frozen (a full collection took %.0f ms); switch interval "
                 "%.2f ms", gc.get_freeze_count(), collect_s * 1e3, server.switch_interval_ms)
    started: dict[int, float] = {}

    def timed(phase: str, info: dict) -> None:
        if phase == "start":
            started[info["generation"]] = time.perf_counter()
        elif info["generation"] in started:
            metrics.gc_pause(info["generation"], time.perf_counter() - started.pop(info["generation"]))

    gc.callbacks.append(timed)


async def freeze_after_startup(server: ServerSettings, engine) -> None:
    """Once the start-up's background build is done (engine/startup.py), freeze what it left too (with
    --gc-freeze): compiling made many long-lived objects after the freeze at SERVING, and each full collection
    would scan them again, every stream waiting. No collection first: that would stall the streams now."""
    startup = getattr(engine.runtime, "startup", None)
    if not server.gc_freeze or startup is None:
        return
    while not startup.done.is_set():  # polled: a thread waiting on it could hold the exit up
        await asyncio.sleep(0.5)
    before = gc.get_freeze_count()
    gc.freeze()
    log.info("garbage collector: %d objects of the start-up's background build frozen", gc.get_freeze_count() - before)


async def serve(settings: WorkerSettings) -> int:
    """Open the artifact store first: its directory's lock refuses a second worker before anything else runs
    (DirectoryInUse, an OSError naming the holder); the lock is let go of when the worker ends."""
    from breeze_worker.artifacts.store import ArtifactStore
    from breeze_worker.transport.server import host_port

    if settings.engine.model_dir is None:
        log.warning("no --model given: serving the TINY EMBEDDED DEFAULT (random weights); its audio is NOT "
                    "speech. Pass --model DIR with a Breeze TTS 2 checkpoint for real synthesis.")
    faults = active_faults(settings)
    if faults:
        log.warning("TEST-ONLY FAULT INJECTION IS ON (%s): artifact commits or fetches are delayed, or artifact "
                    "writes fail, on purpose. Unset --fault-* / BREEZE_ARTIFACTS_FAULT_* outside the tests.", faults)
    s = settings.server
    store = ArtifactStore(settings.artifacts, holder={
        "synthesis": host_port(s.host, s.port), "artifacts": host_port(s.host, s.artifact_port)})
    try:
        return await _serve(settings, store)
    finally:
        store.close()


async def _serve(settings: WorkerSettings, store) -> int:
    from breeze_worker.engine.service import Engine
    from breeze_worker.transport.server import create_server, host_port

    faults = active_faults(settings)
    engine = Engine(settings.engine, store)
    servers = await create_server(settings, engine, store)
    store.lock.update(synthesis=host_port(settings.server.host, servers.synthesis_port),
                      artifacts=host_port(settings.server.host, servers.artifact_port))
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

        s = settings.server
        metrics = MetricsServer(engine.metrics.render, lambda: engine.ready and not engine.draining, CONTENT_TYPE,
                                max_connections=s.metrics_max_connections,
                                max_per_peer=s.metrics_max_connections_per_peer,
                                read_timeout_s=s.metrics_read_timeout_s)
        metrics_host = settings.server.metrics_host or settings.server.host
        port = await metrics.start(metrics_host, settings.server.metrics_port)
        store.lock.update(metrics=host_port(metrics_host, port))
        log.info("metrics on http://%s/metrics", host_port(metrics_host, port))
    http = None
    if settings.http.port is not None:
        from breeze_worker.transport.http import start_http

        http = await start_http(settings, engine, store, servers.artifact_endpoint, servers.slow_readers,
                                servers.auth_throttle)
        log.info("HTTP face on http%s://%s/", "s" if settings.server.tls_cert else "",
                 host_port(settings.http.host, http.port))
    starting = asyncio.create_task(engine.start())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    code = 0
    frozen_later: asyncio.Task | None = None
    if starting.done() and starting.exception() is None and not stop.is_set():
        tune_interpreter(settings.server, engine.metrics)
        frozen_later = asyncio.create_task(freeze_after_startup(settings.server, engine))
        await servers.set_serving(True)
        host = settings.server.host
        model = "tiny-default (audio is NOT speech)" if engine.is_tiny_default else engine.model_description
        readiness = engine.readiness()
        ready, configured = readiness["ready_streams"], readiness["configured_streams"]
        capacity = (f"; streams {ready}/{configured} ready" + ("" if ready >= configured else
                                                                " (the rest are built while serving)"))
        print(f"breeze-worker ready: synthesis={host}:{servers.synthesis_port} "
              f"artifacts={host}:{servers.artifact_port} model={model}{capacity}"
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
    if frozen_later is not None:
        frozen_later.cancel()
    await _drain(settings, engine, servers, served=code == 0 and starting.done(), hurry=hurry)
    if metrics is not None:
        await metrics.stop()
    if http is not None:
        await http.stop()
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
        except TimeoutError:
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
        logs.flush()  # the log's lines first, then this one, whole
        print(f"breeze-worker serve: {exc}", file=sys.stderr)
        return 1
