"""The one channel factory: TLS (with an optional client certificate), bearer-token metadata, message sizes,
keepalive and retry policy.

`ConnectionOptions` is what every SDK client and every CLI subcommand takes; `open_channel` /
`open_aio_channel` build a channel to one target from it. The synthesis and the artifact channel are
separate channels (separate connections), so a large download never queues behind audio chunks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import grpc

DEFAULT_TARGET = "127.0.0.1:50051"
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

# Retries on UNAVAILABLE only, for calls that are safe to repeat (never Synthesize: it starts a job).
_RETRY_POLICY = {
    "maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}
SERVICE_CONFIG = json.dumps({"methodConfig": [{
    "name": [{"service": "breeze.tts.v1.Clock"}, {"service": "breeze.tts.v1.Artifacts", "method": "Stat"},
             {"service": "breeze.tts.v1.Artifacts", "method": "Fetch"},
             {"service": "breeze.tts.v1.Synthesis", "method": "GetWorkerInfo"},
             {"service": "grpc.health.v1.Health", "method": "Check"}],
    "retryPolicy": _RETRY_POLICY,
}]})


@dataclass(frozen=True)
class ConnectionOptions:
    """How to reach one worker: the same set on every SDK client and CLI subcommand."""

    target: str = DEFAULT_TARGET  # host:port of the Synthesize endpoint
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

    def with_target(self, target: str) -> "ConnectionOptions":
        return replace(self, target=target)


DEFAULT_STREAM_WINDOW = 64 * 1024  # gRPC core's initial HTTP/2 stream window (grpc.http2.lookahead_bytes)


def fixed_stream_window(opts: ConnectionOptions) -> int | None:
    """The HTTP/2 stream window the options hold fixed, or None when BDP probing grows it (gRPC's default).

    With `grpc.http2.bdp_probe` off the window stays at `grpc.http2.lookahead_bytes` (64 KiB unless set);
    gRPC still lets one whole message in when a read waits for it, so a transfer keeps about
    max(window, chunk size) in flight per round trip.
    """
    extra = dict(opts.extra_options)
    if int(extra.get("grpc.http2.bdp_probe", 1)):
        return None
    return int(extra.get("grpc.http2.lookahead_bytes", DEFAULT_STREAM_WINDOW))


def channel_options(opts: ConnectionOptions) -> list[tuple[str, object]]:
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
        ("grpc.service_config", SERVICE_CONFIG),
    ]
    if opts.tls_server_name:
        options.append(("grpc.ssl_target_name_override", opts.tls_server_name))
    return options + list(opts.extra_options)


def _credentials(opts: ConnectionOptions) -> grpc.ChannelCredentials:
    roots = Path(opts.tls_ca).read_bytes() if opts.tls_ca is not None else None
    if opts.tls_cert is None:
        return grpc.ssl_channel_credentials(root_certificates=roots)
    return grpc.ssl_channel_credentials(root_certificates=roots, private_key=Path(opts.tls_key).read_bytes(),
                                        certificate_chain=Path(opts.tls_cert).read_bytes())


def open_channel(target: str, opts: ConnectionOptions) -> grpc.Channel:
    """A synchronous channel to `target` with the options' TLS and settings."""
    if opts.uses_tls:
        return grpc.secure_channel(target, _credentials(opts), options=channel_options(opts))
    return grpc.insecure_channel(target, options=channel_options(opts))


def open_aio_channel(target: str, opts: ConnectionOptions) -> grpc.aio.Channel:
    """An asyncio channel to `target` with the options' TLS and settings."""
    if opts.uses_tls:
        return grpc.aio.secure_channel(target, _credentials(opts), options=channel_options(opts))
    return grpc.aio.insecure_channel(target, options=channel_options(opts))
