"""Which worker of a fleet holds an artifact, for `fetch`, `stat` and `delete` by id.

An artifact lives on the worker whose job wrote it (its `ArtifactRef.endpoint` names that worker's artifact
address). A fleet address reaches many workers: `dns:///name:port` (every address the name resolves to),
`ipv4:host:port,host:port,...` or `ipv6:[host]:port,...`. Given only an artifact id and such a target, the
client asks every worker the target resolves to, at once: each worker's `GetWorkerInfo` gives its artifact
address, and a `Stat` there says whether it holds the id. The first that does serves the call.

Who is asked, and so who sees the id and the bearer token: only the workers the target resolves to (those
`Synthesize` already sends the token to), and the artifact addresses they advertise, as for a single worker.
An id names no address, so a crafted id cannot send the client or its token anywhere else. With TLS, each
address resolved from a DNS name is checked against that name's certificate (unless --tls-server-name is set).

A plain `host:port` target is one worker: its artifact address comes from its own `GetWorkerInfo`, as before.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from breeze_client.channel import ConnectionOptions
from breeze_client.errors import BreezeClientError, InvalidArgument, NotFound, Unavailable

FLEET_SCHEMES = ("dns:", "ipv4:", "ipv6:")
DNS_DEFAULT_PORT = 443  # gRPC's, for a dns: target without a port


@dataclass(frozen=True)
class Member:
    """One worker of a fleet: its synthesis address, and the options to reach it (TLS name included)."""

    address: str
    options: ConnectionOptions


def is_fleet(target: str) -> bool:
    return target.startswith(FLEET_SCHEMES)


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _split(host_port: str, default_port: int | None = None) -> tuple[str, int]:
    if host_port.startswith("["):
        host, _, rest = host_port[1:].partition("]")
        port = rest.removeprefix(":")
    else:
        host, sep, port = host_port.rpartition(":")
        if not sep:
            host, port = host_port, ""
    if not port:
        if default_port is None:
            raise InvalidArgument(f"{host_port!r} has no port: write host:port")
        return host, default_port
    if not port.isdigit():
        raise InvalidArgument(f"{host_port!r}: the port must be a number")
    return host, int(port)


def members(options: ConnectionOptions, resolve: Callable[..., list] = socket.getaddrinfo) -> list[Member]:
    """The workers `options.target` resolves to, in gRPC's target syntax (one for a plain host:port)."""
    target = options.target
    if target.startswith(("ipv4:", "ipv6:")):
        listed = target.split(":", 1)[1].split(",")
        return [Member(_host_port(*_split(a.strip())), options) for a in listed if a.strip()]
    if not target.startswith("dns:"):
        return [Member(target, options)]
    rest = target.removeprefix("dns:")
    if rest.startswith("//"):  # dns://[authority]/name:port; the authority (a DNS server) is the system's here
        rest = rest[2:].split("/", 1)[1] if "/" in rest[2:] else rest[2:]
    host, port = _split(rest, DNS_DEFAULT_PORT)
    try:
        infos = resolve(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise Unavailable(f"{target}: the name {host} does not resolve ({exc.strerror}); check --target") from None
    named = options if options.tls_server_name or not options.uses_tls else replace(options, tls_server_name=host)
    addresses = dict.fromkeys(_host_port(info[4][0], port) for info in infos)  # unique, in the resolver's order
    return [Member(a, named.with_target(a)) for a in addresses]


def find_holder(target: str, artifact_id: str, answers: Iterable[tuple[Member, str | None | BreezeClientError]]) -> str:
    """The artifact address of the worker that holds `artifact_id`, from each member's answer: its artifact
    address when it holds the id, None when it does not, or the error that kept it from answering."""
    asked, failed = [], []
    for member, answer in answers:
        asked.append(member.address)
        if isinstance(answer, str):
            return answer
        if isinstance(answer, InvalidArgument):  # a malformed id: every worker would say so
            raise answer
        if isinstance(answer, BreezeClientError):
            failed.append(f"{member.address}: {answer.code}: {answer.message}")
    where = f"the {len(asked)} worker(s) {target} resolves to ({', '.join(asked)})"
    if failed and len(failed) == len(asked):
        raise Unavailable(f"no worker of {where} could be asked for {artifact_id}: {'; '.join(failed)}")
    unreachable = f"; {len(failed)} could not be asked ({'; '.join(failed)}): it may be there" if failed else ""
    raise NotFound(f"no worker holds {artifact_id}: asked {where}{unreachable}. An artifact stays on the worker "
                   "whose job wrote it until its retention ends: check the id, or pass --artifact-target with the "
                   "artifact address the job reported")
