"""A small delaying TCP proxy (asyncio): latency each way, an optional mid-transfer drop.

Each accepted connection opens one upstream connection and two pipes. A pipe reads what arrives, stamps it
with `arrival + delay` (`delay_s` both ways, or `up_delay_s` / `down_delay_s` for one direction),
and a writer task releases it at that time, so the delay adds latency without
capping throughput (bytes in flight are not limited by the proxy). `drop_after_bytes` aborts a connection
(both sides, RST) once that many bytes have gone downstream (upstream -> client) on it, for the first
`max_drops` connections: the client sees a broken stream mid-transfer and must resume.

The listening socket and the upstream sockets can be made inside network namespaces (`listen_netns`,
`upstream_netns`; see netns.in_netns), which is how a test process on loopback reaches a worker across a
veth pair. `ProxyThread` runs proxies on their own event loop in a background thread for synchronous tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from dataclasses import dataclass, field

from netpath.netns import in_netns

log = logging.getLogger(__name__)
READ_SIZE = 64 * 1024
CONNECT_TIMEOUT_S = 10.0


@dataclass
class ProxyStats:
    connections: int = 0
    drops: int = 0
    bytes_down: int = 0  # upstream -> client
    bytes_up: int = 0  # client -> upstream
    # the most a message went out after its due time (the proxy's own lag on a busy host), per direction
    late_down_s: float = 0.0
    late_up_s: float = 0.0


class DelayProxy:
    def __init__(self, upstream: tuple[str, int], *, delay_s: float = 0.0, up_delay_s: float | None = None,
                 down_delay_s: float | None = None, drop_after_bytes: int | None = None,
                 max_drops: int = 1, listen_host: str = "127.0.0.1", listen_port: int = 0,
                 listen_netns: str | None = None, upstream_netns: str | None = None):
        self.upstream = upstream
        self.up_delay_s = delay_s if up_delay_s is None else up_delay_s  # client -> upstream
        self.down_delay_s = delay_s if down_delay_s is None else down_delay_s  # upstream -> client
        self.drop_after_bytes = drop_after_bytes
        self.max_drops = max_drops
        self.listen_host, self.listen_port = listen_host, listen_port
        self.listen_netns, self.upstream_netns = listen_netns, upstream_netns
        self.stats = ProxyStats()
        self.port = 0
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def address(self) -> str:
        return f"{self.listen_host}:{self.port}"

    async def start(self) -> int:
        ctx = in_netns(self.listen_netns) if self.listen_netns else contextlib.nullcontext()
        with ctx:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.listen_host, self.listen_port))
        sock.listen(64)
        sock.setblocking(False)
        self._server = await asyncio.start_server(self._accept, sock=sock)
        self.port = sock.getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):  # ends every pipe; the connection tasks then finish on their own
            writer.transport.abort()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=5)
        if self._server is not None:
            await self._server.wait_closed()

    async def _connect_upstream(self):
        ctx = in_netns(self.upstream_netns) if self.upstream_netns else contextlib.nullcontext()
        with ctx:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, self.upstream), CONNECT_TIMEOUT_S)
        except BaseException:
            sock.close()
            raise
        return await asyncio.open_connection(sock=sock)

    async def _accept(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        self.stats.connections += 1
        drop_at = None
        if self.drop_after_bytes is not None and self.stats.drops < self.max_drops:
            drop_at = self.drop_after_bytes
        try:
            c_writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            u_reader, u_writer = await self._connect_upstream()
        except (TimeoutError, OSError) as exc:
            log.warning("proxy: upstream %s unreachable: %s", self.upstream, exc)
            c_writer.transport.abort()
            self._tasks.discard(task)
            return
        self._writers.update((c_writer, u_writer))
        dropped = asyncio.Event()
        up = asyncio.create_task(self._pipe(c_reader, u_writer, "up", None, dropped))
        down = asyncio.create_task(self._pipe(u_reader, c_writer, "down", drop_at, dropped))
        drop_watch = asyncio.create_task(dropped.wait())
        try:
            await asyncio.wait({up, down, drop_watch}, return_when=asyncio.FIRST_COMPLETED)
            if dropped.is_set():
                self.stats.drops += 1
            else:  # one side finished: let the other flush, then close
                await asyncio.wait({up, down}, timeout=5)
        finally:
            for t in (up, down, drop_watch):
                t.cancel()
            await asyncio.gather(up, down, drop_watch, return_exceptions=True)
            for w in (c_writer, u_writer):
                if dropped.is_set():
                    w.transport.abort()
                else:
                    w.close()
                self._writers.discard(w)
            self._tasks.discard(task)

    async def _pipe(self, reader, writer, direction: str, drop_at: int | None, dropped: asyncio.Event) -> None:
        queue: asyncio.Queue = asyncio.Queue()
        sent = 0

        async def release():
            nonlocal sent
            while True:
                due, data = await queue.get()
                if data is None:
                    with contextlib.suppress(OSError):
                        writer.write_eof()
                    return
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                self._late(direction, time.monotonic() - due)
                if drop_at is not None and sent + len(data) >= drop_at:
                    writer.write(data[: drop_at - sent])
                    await writer.drain()
                    self._count(direction, drop_at - sent)
                    dropped.set()
                    return
                writer.write(data)
                sent += len(data)
                self._count(direction, len(data))
                await writer.drain()

        releaser = asyncio.create_task(release())
        try:
            while not releaser.done():
                data = await reader.read(READ_SIZE)
                delay = self.down_delay_s if direction == "down" else self.up_delay_s
                queue.put_nowait((time.monotonic() + delay, data or None))
                if not data:
                    break
            await releaser
        except (ConnectionError, OSError):
            pass
        finally:
            releaser.cancel()

    def _late(self, direction: str, late_s: float) -> None:
        if direction == "down":
            self.stats.late_down_s = max(self.stats.late_down_s, late_s)
        else:
            self.stats.late_up_s = max(self.stats.late_up_s, late_s)

    def _count(self, direction: str, n: int) -> None:
        if direction == "down":
            self.stats.bytes_down += n
        else:
            self.stats.bytes_up += n


@dataclass
class ProxyThread:
    """Run proxies on a private event loop in a daemon thread (for synchronous code). Context manager."""

    proxies: list[DelayProxy] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None

    def __enter__(self) -> ProxyThread:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="netpath-proxy", daemon=True)
        self._thread.start()
        for p in self.proxies:
            self.call(p.start())
        return self

    def call(self, coro, timeout: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def __exit__(self, *exc) -> None:
        for p in reversed(self.proxies):
            with contextlib.suppress(Exception):
                self.call(p.stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
