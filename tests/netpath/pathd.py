"""A network path in its own process: veth + tbf between two fresh namespaces, relays and delaying proxies.

    python -m netpath.pathd --rate-mbit 20 --delay-ms 25 --upstream 127.0.0.1:50051 --upstream 127.0.0.1:50052

For each upstream (a loopback address of this namespace) it starts a relay listening in the server-side
namespace and an entry proxy on 127.0.0.1 that connects from the client-side namespace with `--delay-ms`
added each way, then prints one JSON line {"entries": [...], ...} and serves until its stdin closes (or
SIGTERM), when it tears everything down. Running the path in its own process keeps the proxies' CPU and
GIL time out of the measured client. `PathProcess` is the context manager that starts and stops it;
its `qdisc()` reads both ends' tbf counters while the path is up (the JSON line's "qdisc" is from before
any traffic).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import threading
from contextlib import ExitStack

from netpath.child import start_reporting_child
from netpath.netns import VethLink, require_root_and_iproute2
from netpath.proxy import DelayProxy, ProxyThread


def serve(upstreams: list[str], rate_mbit: float | None, delay_ms: float, burst_bytes: int) -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with ExitStack() as stack:
        link = stack.enter_context(VethLink(rate_mbit=rate_mbit, burst_bytes=burst_bytes))
        entries = []
        for upstream in upstreams:
            host, port = upstream.rsplit(":", 1)
            relay = DelayProxy((host, int(port)), listen_host=link.server_addr, listen_netns=link.server_ns)
            stack.enter_context(ProxyThread([relay]))
            entry = DelayProxy((link.server_addr, relay.port), upstream_netns=link.client_ns,
                               delay_s=delay_ms / 1000.0)
            stack.enter_context(ProxyThread([entry]))
            entries.append(entry.address)
        print(json.dumps({"entries": entries, "client_ns": link.client_ns, "server_ns": link.server_ns,
                          "qdisc": link.qdisc("server")}), flush=True)
        threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
        stop.wait()


class PathProcess:
    """Start `python -m netpath.pathd` and read its entries; closing stdin tears the path down."""

    def __init__(self, upstreams: list[str], *, rate_mbit: float | None, delay_ms: float,
                 burst_bytes: int = 32 * 1024) -> None:
        self.args = [sys.executable, "-m", "netpath.pathd", "--delay-ms", str(delay_ms),
                     "--burst-bytes", str(burst_bytes)]
        if rate_mbit:
            self.args += ["--rate-mbit", str(rate_mbit)]
        for u in upstreams:
            self.args += ["--upstream", u]
        self.proc: subprocess.Popen | None = None
        self.info: dict = {}

    @property
    def entries(self) -> list[str]:
        return self.info["entries"]

    def qdisc(self) -> str:
        """`tc -s qdisc` of both ends now (run after the traffic, its counters show what tbf shaped)."""
        out = []
        for side in ("server_ns", "client_ns"):
            result = subprocess.run(["ip", "netns", "exec", self.info[side], "tc", "-s", "qdisc", "show"],
                                    capture_output=True, text=True, timeout=30)
            out.append(f"# {side[:-3]} side ({self.info[side]})\n{result.stdout or result.stderr}")
        return "".join(out)

    def __enter__(self) -> PathProcess:
        require_root_and_iproute2()  # here, in the test: the path process could only fail
        self.proc, ready = start_reporting_child(self.args, "path process")
        self.info = ready
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is None:
            return
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            self.proc.wait(timeout=30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--upstream", action="append", required=True, help="host:port to reach through the path")
    p.add_argument("--rate-mbit", type=float, default=None, help="tbf rate each way (default: unshaped)")
    p.add_argument("--delay-ms", type=float, default=0.0, help="added one-way delay, each way")
    p.add_argument("--burst-bytes", type=int, default=32 * 1024, help="tbf bucket size")
    args = p.parse_args()
    serve(args.upstream, args.rate_mbit, args.delay_ms, args.burst_bytes)


if __name__ == "__main__":
    main()
