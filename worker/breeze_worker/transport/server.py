"""Two grpc.aio servers in one process: synthesis (Synthesis + Clock) and artifacts (Artifacts + Clock).

Both ports carry grpc.health.v1 (the overall "" status and breeze.tts.v1.Synthesis report NOT_SERVING
until the engine is loaded and warmed; breeze.tts.v1.Artifacts serves as soon as the store is open)
and server reflection. `create_server` binds, starts and returns the running servers with the ports
actually bound (port 0 picks a free one); `serve` owns the signal handling and the engine lifecycle.

Shutting down takes three steps (commands/serve.py drives them): `begin_drain` reports NOT_SERVING for
synthesis while both ports stay open, `stop_synthesis` closes the synthesis port once the running jobs
have ended, and `stop_artifacts` closes the artifact port after the artifact grace.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

import breeze_worker
from breeze_tts_proto.v1 import (
    artifacts_pb2,
    artifacts_pb2_grpc,
    clock_pb2,
    clock_pb2_grpc,
    synthesis_pb2,
    synthesis_pb2_grpc,
)
from breeze_worker.artifacts.store import ArtifactStore
from breeze_worker.config import ServerSettings, WorkerSettings
from breeze_worker.transport.artifact_servicer import MAX_MESSAGE_BYTES, ArtifactServicer
from breeze_worker.transport.auth import AuthThrottle, BearerTokenInterceptor
from breeze_worker.transport.calls import CallInterceptor
from breeze_worker.transport.clock_servicer import ClockServicer
from breeze_worker.transport.health import BoundedHealthServicer, WatcherCollector
from breeze_worker.transport.preflight import check_tls_files, in_use_error, port_in_use
from breeze_worker.transport.stream_relay import SlowReaderBounds
from breeze_worker.transport.synthesis_servicer import SynthesisServicer

log = logging.getLogger(__name__)

SYNTHESIS_SERVICE = synthesis_pb2.DESCRIPTOR.services_by_name["Synthesis"].full_name
ARTIFACTS_SERVICE = artifacts_pb2.DESCRIPTOR.services_by_name["Artifacts"].full_name
CLOCK_SERVICE = clock_pb2.DESCRIPTOR.services_by_name["Clock"].full_name
_ARTIFACT_REQUEST_BYTES = 64 * 1024  # Stat / Fetch / Delete requests are tiny
SPACE_CHECK_S = 5.0  # how often the artifact disk's free space (and, while degraded, a test write) is checked


def receive_cap(max_request_bytes: int) -> int:
    """gRPC's own receive limit on the synthesis port: well above --max-request-bytes.

    Requests between the two reach `Synthesize`, which refuses them with a message naming the limit
    and the remedy; only a request past this hard cap gets gRPC's bare "larger than max" status.
    """
    return 2 * max_request_bytes + (1 << 20)


def host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def _options(s: ServerSettings, max_receive: int, max_send: int) -> list[tuple[str, int]]:
    """One port's channel arguments: message limits, and what a connection may hold (docs/operations.md)."""
    options = [
        ("grpc.max_receive_message_length", max_receive),
        ("grpc.max_send_message_length", max_send),
        ("grpc.so_reuseport", 0),  # a second worker on the same port must fail, not share it
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.max_concurrent_streams", s.max_streams_per_connection),
        ("grpc.keepalive_time_ms", int(s.keepalive_time_s * 1000)),
        # also the sockets' TCP user timeout: data a peer leaves unacknowledged this long closes its connection
        ("grpc.keepalive_timeout_ms", int(s.keepalive_timeout_s * 1000)),
        ("grpc.server_handshake_timeout_ms", int(s.handshake_timeout_s * 1000)),
    ]
    if s.max_connection_idle_s > 0:
        options.append(("grpc.max_connection_idle_ms", int(s.max_connection_idle_s * 1000)))
    return options


def _credentials(settings: WorkerSettings) -> grpc.ServerCredentials | None:
    """TLS from --tls-cert/--tls-key; with --tls-client-ca, clients must present a certificate it signed."""
    s = settings.server
    if s.tls_cert is None:
        return None
    assert s.tls_key is not None  # settings.validate() (before this): tls_cert and tls_key come together
    check_tls_files(s)
    client_ca = Path(s.tls_client_ca).read_bytes() if s.tls_client_ca is not None else None
    return grpc.ssl_server_credentials([(Path(s.tls_key).read_bytes(), Path(s.tls_cert).read_bytes())],
                                       root_certificates=client_ca, require_client_auth=client_ca is not None)


def _interceptors(settings: WorkerSettings, throttle: AuthThrottle) -> list[grpc.aio.ServerInterceptor]:
    """The call wrapper outermost (log fields, the throttle on failed authentications, the request message's
    arrival, undecodable bodies), then the token check when there is one."""
    s = settings.server
    if not s.auth_token:
        return [CallInterceptor(s.first_message_timeout_s, s.max_waiting_calls_per_peer)]
    return [CallInterceptor(s.first_message_timeout_s, s.max_waiting_calls_per_peer, throttle.gate),
            BearerTokenInterceptor(s.auth_token, throttle)]


def warn_about_exposure(settings: WorkerSettings) -> None:
    """Log what a non-loopback listener leaves open (validation already refused an open one without
    --allow-insecure)."""
    s = settings.server
    if s.listens_on_loopback:
        return
    if not s.auth_token and s.tls_client_ca is None:
        log.warning("listening on %s with NO authentication (--allow-insecure): anyone who can reach the ports "
                    "can synthesize and read every artifact. Set BREEZE_SERVER_AUTH_TOKEN and TLS, or bind "
                    "127.0.0.1", s.host)
    elif s.tls_cert is None:
        log.warning("listening on %s with a bearer token but without TLS: the token and the audio cross the "
                    "network in clear text. Add --tls-cert/--tls-key (and --tls-client-ca for client "
                    "certificates)", s.host)


def _bind(server: grpc.aio.Server, host: str, port: int, credentials, flag: str) -> int:
    address = host_port(host, port)
    if port_in_use(host, port):
        raise in_use_error(address, port, flag)
    try:
        bound = (server.add_secure_port(address, credentials) if credentials is not None
                 else server.add_insecure_port(address))
    except RuntimeError as exc:
        raise OSError(f"cannot listen on {address} ({exc}): is another worker running? pick another port") from exc
    if bound == 0:
        raise OSError(f"cannot listen on {address}: is another worker running? pick another port")
    return bound


def advertised_artifact_endpoint(settings: WorkerSettings, artifact_port: int) -> str:
    s = settings.server
    if s.advertised_artifact_address:
        return s.advertised_artifact_address
    host = s.host
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = socket.getfqdn()
    return host_port(host, artifact_port)


@dataclass
class RunningServers:
    """The two started servers, their bound ports and the shared health state."""

    synthesis: grpc.aio.Server
    artifacts: grpc.aio.Server
    synthesis_port: int
    artifact_port: int
    artifact_endpoint: str
    health: BoundedHealthServicer
    store: ArtifactStore
    slow_readers: SlowReaderBounds  # what slow readers may hold, shared with the HTTP face's streams
    auth_throttle: AuthThrottle  # failed authentications per address, shared with the HTTP face
    _tasks: list[asyncio.Task] = field(default_factory=list)

    async def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for service in ("", SYNTHESIS_SERVICE):
            await self.health.set(service, status)

    async def stop(self, grace: float | None = None) -> None:
        """Report NOT_SERVING, then let in-flight calls finish for `grace` seconds before cutting them."""
        for task in self._tasks:
            task.cancel()
        await self.health.enter_graceful_shutdown()
        await asyncio.gather(self.synthesis.stop(grace), self.artifacts.stop(grace))

    async def begin_drain(self) -> None:
        """Synthesis reports NOT_SERVING (load balancers stop sending); the artifact service still serves."""
        await self.set_serving(False)

    async def stop_synthesis(self, grace: float) -> None:
        """Close the synthesis port; calls still writing their last messages get `grace` seconds."""
        await self.synthesis.stop(grace)

    async def stop_artifacts(self, grace: float) -> None:
        """Close the artifact port (the end of the artifact grace); fetches in flight get `grace` seconds."""
        for task in self._tasks:
            task.cancel()
        await self.health.enter_graceful_shutdown()
        await self.artifacts.stop(grace)

    async def wait_for_termination(self) -> None:
        await asyncio.gather(self.synthesis.wait_for_termination(), self.artifacts.wait_for_termination())


def _worker_info(settings: WorkerSettings, engine, endpoint: str, store: ArtifactStore) -> synthesis_pb2.WorkerInfo:
    tiny = bool(getattr(engine, "is_tiny_default", False))
    disk = store.status()
    readiness = engine.readiness() if hasattr(engine, "readiness") else {}
    return synthesis_pb2.WorkerInfo(
        model_description=str(getattr(engine, "model_description", "")),
        is_tiny_default=tiny,
        warning=str(getattr(engine, "not_speech_warning", "")),
        sample_rate=int(getattr(engine, "sample_rate", 24000)),
        artifact_endpoint=endpoint,
        ready=bool(getattr(engine, "ready", False)),
        max_text_chars=settings.engine.max_text_chars,
        max_request_bytes=settings.server.max_request_bytes,
        version=breeze_worker.__version__,
        artifact_store_degraded=disk.reason,
        artifact_disk_free_bytes=disk.free_bytes,
        max_active_streams=settings.engine.max_active_streams,
        ready_streams=int(readiness.get("ready_streams", 0)),
        startup_building=str(readiness.get("building", "")),
    )


async def _watch_loop_lag(metrics, period_s: float = 0.05) -> None:
    """How late this event loop runs a timer, observed every `period_s`: if Python work (message
    conversion, auth, logging) ever held the loop, every stream's messages waited that long."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + period_s
        await asyncio.sleep(period_s)
        metrics.loop_lag(loop.time() - due)


async def _store_upkeep_loop(store: ArtifactStore, retention_interval_s: float) -> None:
    """Retention every `retention_interval_s`; the free-space headroom and the degraded state every SPACE_CHECK_S."""
    next_retention = 0.0
    loop = asyncio.get_running_loop()
    while True:
        try:
            if loop.time() >= next_retention:
                await asyncio.to_thread(store.enforce_retention)
                next_retention = loop.time() + retention_interval_s
            await asyncio.to_thread(store.space.refresh)
        except Exception:  # noqa: BLE001 - upkeep must never stop the worker
            log.exception("artifact store upkeep failed; retrying in %.0f s", SPACE_CHECK_S)
        await asyncio.sleep(SPACE_CHECK_S)


async def create_server(settings: WorkerSettings, engine, store: ArtifactStore | None = None) -> RunningServers:
    """Build, bind and start both servers; health is NOT_SERVING until `set_serving(True)` (or engine.ready)."""
    settings.validate()
    s = settings.server
    store = store or getattr(engine, "artifact_store", None) or ArtifactStore(settings.artifacts)
    throttle = AuthThrottle(s.auth_max_failures, s.auth_failure_refill_s)
    interceptors = _interceptors(settings, throttle)
    credentials = _credentials(settings)
    health_servicer = BoundedHealthServicer(s.health_max_watchers)
    clock = ClockServicer()

    synthesis_options = _options(s, receive_cap(s.max_request_bytes), 64 * 1024 * 1024)
    if s.max_connection_age_s > 0:  # GOAWAY after this age; with no age grace set, running streams finish
        synthesis_options.append(("grpc.max_connection_age_ms", int(s.max_connection_age_s * 1000)))
    synthesis_server = grpc.aio.server(interceptors=interceptors, options=synthesis_options,
                                       maximum_concurrent_rpcs=s.max_calls)
    artifact_server = grpc.aio.server(interceptors=interceptors,
                                      options=_options(s, _ARTIFACT_REQUEST_BYTES, MAX_MESSAGE_BYTES),
                                      maximum_concurrent_rpcs=s.max_calls)
    synthesis_port = _bind(synthesis_server, s.host, s.port, credentials, "--port")
    artifact_port = _bind(artifact_server, s.host, s.artifact_port, credentials, "--artifact-port")
    endpoint = advertised_artifact_endpoint(settings, artifact_port)

    slow_readers = SlowReaderBounds(s.max_stream_buffer_bytes, s.max_buffered_audio_bytes, s.reader_stall_s)
    synthesis_pb2_grpc.add_SynthesisServicer_to_server(
        SynthesisServicer(engine, endpoint, lambda: _worker_info(settings, engine, endpoint, store),
                          max_request_bytes=s.max_request_bytes, slow_readers=slow_readers), synthesis_server)
    artifacts_pb2_grpc.add_ArtifactsServicer_to_server(ArtifactServicer(store, endpoint), artifact_server)
    for server, services in ((synthesis_server, (SYNTHESIS_SERVICE, CLOCK_SERVICE)),
                             (artifact_server, (ARTIFACTS_SERVICE, CLOCK_SERVICE))):
        clock_pb2_grpc.add_ClockServicer_to_server(clock, server)
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        reflection.enable_server_reflection(
            (*services, health.SERVICE_NAME, reflection.SERVICE_NAME), server)

    running = RunningServers(synthesis_server, artifact_server, synthesis_port, artifact_port, endpoint,
                             health_servicer, store, slow_readers, throttle)
    await running.set_serving(bool(getattr(engine, "ready", False)))
    for service in (ARTIFACTS_SERVICE, CLOCK_SERVICE):
        await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    await synthesis_server.start()
    await artifact_server.start()
    interval = min(60.0, settings.artifacts.max_age_s / 4)
    running._tasks.append(asyncio.create_task(_store_upkeep_loop(store, interval)))
    if getattr(engine, "metrics", None) is not None:
        running._tasks.append(asyncio.create_task(_watch_loop_lag(engine.metrics)))
        # one collector per engine: servers started again on the same engine (tests) replace the last one's
        previous = getattr(engine.metrics, "health_watchers", None)
        if previous is not None:
            engine.metrics.registry.unregister(previous)
        engine.metrics.health_watchers = WatcherCollector(health_servicer)
        engine.metrics.registry.register(engine.metrics.health_watchers)
    log.info("listening: synthesis %s, artifacts %s (advertised as %s)%s%s%s",
             host_port(s.host, synthesis_port), host_port(s.host, artifact_port), endpoint,
             ", TLS" if credentials else "", ", client certificates required" if s.tls_client_ca else "",
             ", bearer token required" if s.auth_token else "")
    warn_about_exposure(settings)
    return running
