"""What `serve` checks before gRPC binds its ports, so each failure is one line that says what to change.

gRPC's own failures here print raw core log lines and end in the same "Failed to bind" status whether the
port is taken or a certificate is bad, so the worker looks first: the TLS files are read and paired with
Python's `ssl` (the same OpenSSL checks gRPC's handshaker makes), and the port is tried with a plain socket.
"""

from __future__ import annotations

import errno
import socket
import ssl
from pathlib import Path

from breeze_worker.config import ServerSettings


class PreflightError(OSError):
    """A setting the worker cannot listen with; its message names the flag and what to change."""


def check_tls_files(s: ServerSettings) -> None:
    """--tls-cert, --tls-key and --tls-client-ca can be read, are PEM, and the key is the certificate's."""
    if s.tls_cert is None:
        return
    assert s.tls_key is not None  # settings.validate(): tls_cert and tls_key come together
    for flag, path in (("--tls-cert", s.tls_cert), ("--tls-key", s.tls_key), ("--tls-client-ca", s.tls_client_ca)):
        if path is not None and not Path(path).is_file():
            raise PreflightError(f"{flag} {path}: no such file; give the path of a PEM file")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(certfile=str(s.tls_cert), keyfile=str(s.tls_key))
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc) or "key values mismatch" in str(exc):
            raise PreflightError(f"--tls-key {s.tls_key} is not the private key of --tls-cert {s.tls_cert}: give "
                                 "the key the certificate was issued for") from None
        raise PreflightError(f"--tls-cert {s.tls_cert} / --tls-key {s.tls_key}: OpenSSL cannot read them as a "
                             "PEM certificate chain and its private key; both must be PEM files (-----BEGIN "
                             "...), the server's certificate first in the chain") from None
    except PermissionError as exc:
        raise PreflightError(f"{exc.filename}: this user cannot read it; change its permissions") from None
    if s.tls_client_ca is not None:
        try:
            context.load_verify_locations(cafile=str(s.tls_client_ca))
        except (ssl.SSLError, ValueError):
            raise PreflightError(f"--tls-client-ca {s.tls_client_ca}: no PEM CA certificate in it; give "
                                 "the PEM certificate(s) of the CA that signs the clients' certificates") from None


def port_in_use(host: str, port: int) -> bool:
    """Whether something already listens on `host`:`port` (port 0 asks for a free one: never in use)."""
    if port == 0:
        return False
    try:
        addresses = socket.getaddrinfo(host.strip("[]") or None, port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return False  # gRPC reports a host it cannot resolve
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds: TIME_WAIT is not "in use"
            try:
                probe.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return True
    return False


def in_use_error(address: str, port: int, flag: str) -> PreflightError:
    return PreflightError(f"cannot listen on {address}: the port is in use (another worker, or another program: "
                          f"`ss -ltnp 'sport = :{port}'` names it); stop it, or pick another port with {flag}")
