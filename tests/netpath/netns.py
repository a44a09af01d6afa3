"""Two network namespaces joined by a veth pair, with an optional `tc ... tbf` rate limit on each end.

`VethLink` creates the namespaces `<prefix>c` (client side) and `<prefix>s` (server side), moves one veth end
into each, addresses them 10.<a>.<b>.1/30 and .2/30, and deletes both namespaces (and so the veth) on exit.
tbf shapes egress; netem is not used (it is missing from these kernels). Nothing outside the two namespaces
is touched.

`in_netns(name)` switches the *calling thread* into a namespace for as long as the block runs (setns), so a
socket created inside belongs to that namespace for good; the asyncio proxies use it to listen or connect
across the link while the test process stays in its own namespace. Needs root and iproute2.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass, field

from host_tools import need_root, need_tools

CLONE_NEWNET = 0x40000000
_counter = itertools.count()


def require_root_and_iproute2() -> None:
    """Skip the test (fail it in CI) when the harness cannot run here (host_tools.py)."""
    need_root("network namespaces")
    need_tools("ip", "tc")


def _run(*cmd: str) -> str:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {result.stderr.strip()}")
    return result.stdout


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns failed: {os.strerror(err)}")


@contextmanager
def in_netns(name: str):
    """Run the block with this thread in network namespace `name` (sockets made here stay in it)."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(target)
        os.close(own)


@dataclass
class VethLink:
    """client ns <-> veth (tbf each way) <-> server ns. Use as a context manager."""

    rate_mbit: float | None = None  # tbf rate on both ends; None = unshaped
    burst_bytes: int = 16 * 1024  # tbf bucket size (the first burst_bytes go at line rate)
    queue_latency_ms: float = 50.0  # tbf queue: packets waiting longer are dropped
    prefix: str = field(default_factory=lambda: f"bz{os.getpid() % 100000}x{next(_counter)}")
    client_ns: str = ""
    server_ns: str = ""
    client_addr: str = ""
    server_addr: str = ""
    _made: list[str] = field(default_factory=list)

    def __enter__(self) -> VethLink:
        require_root_and_iproute2()
        n = next(_counter)
        subnet = f"10.{200 + (os.getpid() % 50)}.{(n * 4) % 256}"
        self.client_ns, self.server_ns = f"{self.prefix}c", f"{self.prefix}s"
        self.client_addr, self.server_addr = f"{subnet}.1", f"{subnet}.2"
        veth_c, veth_s = f"{self.prefix}vc"[:15], f"{self.prefix}vs"[:15]
        try:
            for ns in (self.client_ns, self.server_ns):
                _run("ip", "netns", "add", ns)
                self._made.append(ns)
                _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "-n", self.client_ns, "link", "add", veth_c, "type", "veth", "peer", "name", veth_s,
                 "netns", self.server_ns)
            for ns, dev, addr in ((self.client_ns, veth_c, self.client_addr),
                                  (self.server_ns, veth_s, self.server_addr)):
                _run("ip", "-n", ns, "addr", "add", f"{addr}/30", "dev", dev)
                _run("ip", "-n", ns, "link", "set", dev, "up")
                if self.rate_mbit:
                    _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
                         "rate", f"{self.rate_mbit}mbit", "burst", str(self.burst_bytes),
                         "latency", f"{self.queue_latency_ms}ms")
        except BaseException:
            self.close()
            raise
        return self

    def qdisc(self, side: str = "server") -> str:
        """`tc -s qdisc` of one end (for evidence in test failures)."""
        ns = self.server_ns if side == "server" else self.client_ns
        return _run("ip", "netns", "exec", ns, "tc", "-s", "qdisc", "show")

    def close(self) -> None:
        while self._made:
            ns = self._made.pop()
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)

    def __exit__(self, *exc) -> None:
        self.close()


def namespaces() -> list[str]:
    """Names of the network namespaces that exist now (to check teardown)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]
