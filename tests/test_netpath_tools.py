"""The network-path test tools themselves: the delaying proxy and the namespace + veth + tbf harness."""

from __future__ import annotations

import re
import socket
import threading
import time

import pytest
from netpath.netns import VethLink, in_netns, namespaces
from netpath.proxy import DelayProxy, ProxyThread

PAYLOAD = 400_000


def serve_payload(host: str, netns: str | None = None) -> int:
    """A one-shot-per-connection server: reads one byte, sends PAYLOAD bytes, closes. Returns its port."""
    if netns:
        with in_netns(netns):
            srv = socket.socket()
    else:
        srv = socket.socket()
    srv.bind((host, 0))
    srv.listen(8)

    def loop():
        while True:
            conn, _ = srv.accept()
            with conn:
                conn.recv(1)
                conn.sendall(b"x" * PAYLOAD)

    threading.Thread(target=loop, daemon=True).start()
    return srv.getsockname()[1]


def fetch(port: int) -> tuple[int, float, float]:
    """(bytes received, seconds to the first byte, seconds to the end) through 127.0.0.1:port."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as c:
        t0 = time.perf_counter()
        c.sendall(b"g")
        n, first = 0, None
        while data := c.recv(65536):
            first = first if first is not None else time.perf_counter() - t0
            n += len(data)
        return n, first or 0.0, time.perf_counter() - t0


def test_proxy_adds_latency_each_way_and_drops_once():
    port = serve_payload("127.0.0.1")
    with ProxyThread([DelayProxy(("127.0.0.1", port), delay_s=0.05)]) as pt:
        n, first, _ = fetch(pt.proxies[0].port)
    assert n == PAYLOAD and 0.1 <= first < 0.3  # one round trip through the proxy: 2 x 50 ms
    proxy = DelayProxy(("127.0.0.1", port), drop_after_bytes=100_000, max_drops=1)
    with ProxyThread([proxy]):
        cut, _, _ = fetch(proxy.port)
        whole, _, _ = fetch(proxy.port)
    assert cut == 100_000 and whole == PAYLOAD
    assert proxy.stats.drops == 1 and proxy.stats.connections == 2


@pytest.mark.root
def test_veth_pair_with_tbf_limits_the_rate_and_is_torn_down():
    rate_mbit = 8.0
    with VethLink(rate_mbit=rate_mbit, burst_bytes=16 * 1024) as link:
        names = {link.client_ns, link.server_ns}
        assert names <= set(namespaces())
        port = serve_payload(link.server_addr, netns=link.server_ns)
        entry = DelayProxy((link.server_addr, port), upstream_netns=link.client_ns)
        with ProxyThread([entry]):
            n, _, seconds = fetch(entry.port)
        qdisc = link.qdisc("server")
    assert not names & set(namespaces())
    # the kernel's own account: tbf at the rate asked for, and it held packets back (overlimits) while the
    # payload went through; the transfer took at least the time the rate allows (a busy machine only adds)
    sent = re.search(r"qdisc tbf [^\n]* rate 8Mbit [^\n]*\n\s*Sent (\d+) bytes \d+ pkt \(dropped \d+, overlimits (\d+)",
                     qdisc)
    assert sent and int(sent.group(1)) >= PAYLOAD and int(sent.group(2)) > 0, qdisc
    expected = (PAYLOAD - 16 * 1024) * 8 / (rate_mbit * 1e6)
    assert n == PAYLOAD and seconds >= 0.8 * expected, (seconds, expected)
