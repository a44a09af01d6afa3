"""The one channel factory: TLS (with an optional client certificate), bearer-token metadata, message sizes,
keepalive, load balancing and retry policy.

`ConnectionOptions` is what every SDK client and every CLI subcommand takes; `open_channel` /
`open_aio_channel` build a channel to one target from it. The synthesis and the artifact channel are
separate channels (separate connections), so a large download never queues behind audio chunks.

A target is anything gRPC resolves: `host:port`, a fleet as `dns:///name:port` (every address the name
resolves to) or `ipv4:host:port,host:port,...`. The synthesis channel (`balanced=True`) spreads calls over
every resolved address with gRPC's round_robin and health-checks each one (grpc.health.v1 Watch on the
Synthesis service), so a worker that is NOT_SERVING (warming up, draining) gets no new jobs. A Synthesize that
fails with UNAVAILABLE before its first message (JobStarted) is retried by gRPC on the next worker within the
call's deadline; once a response message arrived the call is committed and a failure is reported, never
retried, so audio is never duplicated.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import SupportsIndex, SupportsInt

import grpc
import grpc.experimental

DEFAULT_TARGET = "127.0.0.1:50051"
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

SYNTHESIS_SERVICE = "breeze.tts.v1.Synthesis"  # the health service name a worker reports while it takes jobs

# Retries on UNAVAILABLE only, for calls that are safe to repeat.
_RETRY_POLICY = {
    "maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}
_IDEMPOTENT = [{"service": "breeze.tts.v1.Clock"}, {"service": "breeze.tts.v1.Artifacts", "method": "Stat"},
               {"service": "breeze.tts.v1.Artifacts", "method": "Fetch"},
               {"service": SYNTHESIS_SERVICE, "method": "GetWorkerInfo"},
               {"service": "grpc.health.v1.Health", "method": "Check"}]
# Synthesize starts a job, so gRPC may repeat it only while it is uncommitted: a call commits at its first
# response message (JobStarted), so UNAVAILABLE before it (a draining worker's refusal, a queued job cut off
# by a crash, a connection that failed) goes to the next worker, and nothing after it is ever retried.
# 5 attempts is gRPC's ceiling; the call's deadline bounds them all.
_SYNTHESIZE_RETRY_POLICY = {
    "maxAttempts": 5, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}
# One worker, the first address that connects: artifact channels (an artifact lives on one worker) and the
# control channel (worker info, health, clock), which must reach a worker whatever its health.
SERVICE_CONFIG = json.dumps({"methodConfig": [{"name": _IDEMPOTENT, "retryPolicy": _RETRY_POLICY}]})
# The synthesis channel: round_robin over every resolved address, each health-checked on the Synthesis service.
FLEET_SERVICE_CONFIG = json.dumps({
    "loadBalancingConfig": [{"round_robin": {}}],
    "healthCheckConfig": {"serviceName": SYNTHESIS_SERVICE},
    "methodConfig": [
        {"name": _IDEMPOTENT, "retryPolicy": _RETRY_POLICY},
        {"name": [{"service": SYNTHESIS_SERVICE, "method": "Synthesize"}], "retryPolicy": _SYNTHESIZE_RETRY_POLICY},
    ],
})


def _addresses(target: str) -> list[str]:
    """The host:port addresses a gRPC target names (gRPC's syntax: a scheme it knows, else the whole target is
    a DNS name with an optional port)."""
    scheme, _, rest = target.partition(":")
    if scheme == "dns":
        return [rest[2:].partition("/")[2] if rest.startswith("//") else rest]  # dns://authority/host:port
    if scheme in ("ipv4", "ipv6"):
        return rest.split(",")
    if scheme in ("unix", "unix-abstract", "vsock", "xds", "google-c2p"):
        return []
    return [target]


def check_target(target: str, flag: str = "target") -> None:
    """ValueError when an address of `target` names a port that is not a number from 1 to 65535 (gRPC would
    dial another port: 66051 wraps to 515)."""
    for address in _addresses(target):
        if address.startswith("["):  # [IPv6]:port
            port = address.partition("]")[2].removeprefix(":")
        else:
            port = address.rpartition(":")[2] if address.count(":") == 1 else ""
        if port and not (port.isdigit() and 1 <= int(port) <= 65535):
            raise ValueError(f"{flag} {target}: {port!r} is not a port; a port is a number from 1 to 65535")


@dataclass(frozen=True)
class ConnectionOptions:
    """How to reach a worker or a fleet: the same set on every SDK client and CLI subcommand."""

    target: str = DEFAULT_TARGET  # the Synthesize endpoint: host:port, or a fleet (dns:///name:port, ipv4:a:p,b:p)
    artifact_target: str | None = None  # host:port of the Artifacts endpoint (None: what the worker advertises)
    tls_ca: Path | None = None  # PEM roots to trust; setting it turns TLS on
    tls: bool = False  # TLS with the system's roots (implied by tls_ca)
    tls_server_name: str | None = None  # override the name checked in the worker's certificate
    tls_cert: Path | None = None  # PEM client certificate chain for mutual TLS (with tls_key; turns TLS on)
    tls_key: Path | None = None  # PEM private key of tls_cert
    token: str | None = None  # bearer token, sent as `authorization: Bearer <token>`
    timeout_s: float | None = None  # deadline per call (None: no deadline)
    max_message_bytes: int = MAX_MESSAGE_BYTES
    extra_options: tuple[tuple[str, object], ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("a client certificate needs both --tls-cert and --tls-key")
        check_target(self.target, "--target")
        if self.artifact_target is not None:
            check_target(self.artifact_target, "--artifact-target")

    @property
    def uses_tls(self) -> bool:
        return self.tls or self.tls_ca is not None or self.tls_cert is not None

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def call_kwargs(self, timeout_s: float | None = None) -> dict:
        """metadata + timeout for one call (an explicit timeout wins over the default)."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        return {"metadata": self.metadata, "timeout": timeout}

    def with_target(self, target: str) -> ConnectionOptions:
        return replace(self, target=target)


DEFAULT_STREAM_WINDOW = 64 * 1024  # gRPC core's initial HTTP/2 stream window (grpc.http2.lookahead_bytes)


def fixed_stream_window(opts: ConnectionOptions) -> int | None:
    """The HTTP/2 stream window the options hold fixed, or None when BDP probing grows it (gRPC's default).

    With `grpc.http2.bdp_probe` off the window stays at `grpc.http2.lookahead_bytes` (64 KiB unless set);
    gRPC still lets one whole message in when a read waits for it, so a transfer keeps about
    max(window, chunk size) in flight per round trip.
    """
    extra = dict(opts.extra_options)
    if _int_option(extra.get("grpc.http2.bdp_probe", 1)):
        return None
    return _int_option(extra.get("grpc.http2.lookahead_bytes", DEFAULT_STREAM_WINDOW))


def _int_option(value: object) -> int:
    """A channel option's value as an int (options are typed `object`: gRPC takes ints and strings)."""
    if isinstance(value, (str, bytes, SupportsInt, SupportsIndex)):
        return int(value)
    raise TypeError(f"channel option value {value!r} is not a number")


def channel_options(opts: ConnectionOptions, balanced: bool = False, sync: bool = False) -> list[tuple[str, object]]:
    options: list[tuple[str, object]] = [
        ("grpc.max_receive_message_length", opts.max_message_bytes),
        ("grpc.max_send_message_length", opts.max_message_bytes),
        ("grpc.keepalive_time_ms", 20_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.initial_reconnect_backoff_ms", 100),
        # gRPC core reads this as the *connect timeout* floor: 100 ms failed every connection over a path
        # with more than ~0.3 s of round trip (found by the retrieval diagnosis tests); keep gRPC's 20 s
        ("grpc.min_reconnect_backoff_ms", 20_000),
        ("grpc.max_reconnect_backoff_ms", 2_000),
        ("grpc.enable_retries", 1),
        ("grpc.service_config", FLEET_SERVICE_CONFIG if balanced else SERVICE_CONFIG),
    ]
    if balanced:
        # gRPC keeps a request for its retries only up to this size (256 KiB by default), and commits a larger
        # one at once: a clone request with a few seconds of reference audio must still fail over
        options.append(("grpc.per_rpc_retry_buffer_size", opts.max_message_bytes))
        if sync:
            # the synchronous client's default stream reader (a shared polling thread) never completes a
            # Synthesize whose retry finds every worker unhealthy, not even at its deadline (grpcio 1.85);
            # the reader that polls the call from the iterating thread completes it
            options.append((grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1))
    if opts.tls_server_name:
        options.append(("grpc.ssl_target_name_override", opts.tls_server_name))
    return options + list(opts.extra_options)


def _credentials(opts: ConnectionOptions) -> grpc.ChannelCredentials:
    roots = Path(opts.tls_ca).read_bytes() if opts.tls_ca is not None else None
    if opts.tls_cert is None:
        return grpc.ssl_channel_credentials(root_certificates=roots)
    assert opts.tls_key is not None  # ConnectionOptions.__post_init__: tls_cert and tls_key come together
    return grpc.ssl_channel_credentials(root_certificates=roots, private_key=Path(opts.tls_key).read_bytes(),
                                        certificate_chain=Path(opts.tls_cert).read_bytes())


def open_channel(target: str, opts: ConnectionOptions, balanced: bool = False) -> grpc.Channel:
    """A synchronous channel to `target` with the options' TLS and settings (`balanced`: the synthesis channel)."""
    options = channel_options(opts, balanced, sync=True)
    if opts.uses_tls:
        return grpc.secure_channel(target, _credentials(opts), options=options)
    return grpc.insecure_channel(target, options=options)


def open_aio_channel(target: str, opts: ConnectionOptions, balanced: bool = False) -> grpc.aio.Channel:
    """An asyncio channel to `target` with the options' TLS and settings (`balanced`: the synthesis channel)."""
    if opts.uses_tls:
        return grpc.aio.secure_channel(target, _credentials(opts), options=channel_options(opts, balanced))
    return grpc.aio.insecure_channel(target, options=channel_options(opts, balanced))
