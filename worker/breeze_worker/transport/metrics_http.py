"""A small HTTP endpoint for Prometheus and for probes that cannot speak TLS or gRPC: `GET /metrics` (text
format), `GET /healthz` (200 while the worker takes jobs: loaded, warm and not draining; 503 otherwise) and
`GET /livez` (200 for as long as the listener answers: through a drain, until the artifact grace ends).

Plain asyncio streams on the gRPC servers' event loop, two fixed routes. prometheus-client keeps and
renders the numbers (`engine.metrics`); its own HTTP server is not used because it holds a thread per
connection with no time limit. This listener is reachable by anyone who can reach its port, so it
bounds what a client can make it hold: a request head of at most MAX_HEAD_BYTES (lines over
MAX_LINE_BYTES get 431, a request line that is not HTTP gets 400), `read_timeout_s` to send it (a
half-open or trickling connection is closed then), `max_connections` at once and `max_per_peer` from one
address. At either bound a new connection is not refused: the oldest one still waiting for its request (of
that address, or of all) is closed to make room. A scraper sends its request as soon as it connects, so
however many silent connections a peer opens, the scrape is answered.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

MAX_LINE_BYTES = 8 * 1024  # a scrape's request line and headers are ~100 bytes each
MAX_HEAD_BYTES = 32 * 1024
TEXT = "text/plain; charset=utf-8"


class _BadRequest(Exception):
    def __init__(self, status: str, body: str) -> None:
        super().__init__(status)
        self.status, self.body = status, body


async def _read_head(reader: asyncio.StreamReader) -> tuple[str, str]:
    """(method, path) of a request head; raises _BadRequest for one that is too long or not HTTP."""
    total = 0
    lines: list[bytes] = []
    while True:
        try:
            line = await reader.readline()
        except ValueError:  # the stream's limit: a line longer than MAX_LINE_BYTES
            raise _BadRequest("431 Request Header Fields Too Large", f"lines are limited to {MAX_LINE_BYTES} "
                                                                     "bytes\n") from None
        total += len(line)
        if total > MAX_HEAD_BYTES:
            raise _BadRequest("431 Request Header Fields Too Large", f"the request head is limited to "
                                                                     f"{MAX_HEAD_BYTES} bytes\n")
        if not line.endswith(b"\n"):  # the client closed (or half-closed) before the head ended
            raise ConnectionResetError("connection closed before the end of the request head")
        if line in (b"\r\n", b"\n"):
            break
        lines.append(line)
    parts = lines[0].decode("latin-1").split() if lines else []
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise _BadRequest("400 Bad Request", "expected an HTTP request such as 'GET /metrics HTTP/1.1'\n")
    return parts[0], parts[1]


class MetricsServer:
    def __init__(self, render: Callable[[], str], ready: Callable[[], bool],
                 content_type: str = "text/plain; version=0.0.4; charset=utf-8", *, max_connections: int = 256,
                 max_per_peer: int = 16, read_timeout_s: float = 5.0):
        self._render = render
        self._ready = ready
        self._content_type = content_type
        self._server: asyncio.base_events.Server | None = None
        self.max_connections, self.max_per_peer, self.read_timeout_s = max_connections, max_per_peer, read_timeout_s
        # the open connections, oldest first: their peer address, and whether their request head is still awaited
        self._open: dict[asyncio.StreamWriter, tuple[str, bool]] = {}
        self.evicted = 0  # connections closed to make room for a newer one
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._handle, host, port, limit=MAX_LINE_BYTES)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def _respond_to(self, method: str, path: str) -> tuple[str, str, str]:
        if method != "GET":
            return "405 Method Not Allowed", TEXT, "only GET\n"
        if path == "/metrics":
            return "200 OK", self._content_type, self._render()
        if path == "/healthz":
            return ("200 OK", TEXT, "ready\n") if self._ready() else ("503 Service Unavailable", TEXT,
                                                                     "not taking jobs (loading or draining)\n")
        if path == "/livez":
            return "200 OK", TEXT, "alive\n"
        return "404 Not Found", TEXT, "try /metrics, /healthz or /livez\n"

    def _make_room(self, peer: str) -> bool:
        """Close the oldest connection still waiting for its request, of `peer` when it holds its share, else of
        any peer when the listener is full; False when the listener is full of connections being answered."""
        waiting = [(w, p) for w, (p, head_awaited) in self._open.items() if head_awaited]
        if sum(p == peer for p, _ in self._open.values()) >= self.max_per_peer:
            waiting = [(w, p) for w, p in waiting if p == peer]
        elif len(self._open) < self.max_connections:
            return True
        if not waiting:
            return False
        oldest = waiting[0][0]
        del self._open[oldest]
        oldest.close()  # its handler's read ends; it then finds itself gone from `_open`
        self.evicted += 1
        return True

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peername = writer.get_extra_info("peername")
        peer = str(peername[0]) if isinstance(peername, tuple) else str(peername)
        if not self._make_room(peer):
            writer.close()
            return
        self._open[writer] = (peer, True)
        try:
            try:
                method, path = await asyncio.wait_for(_read_head(reader), timeout=self.read_timeout_s)
                if writer not in self._open:  # closed to make room while the request arrived
                    return
                self._open[writer] = (peer, False)
                status, content_type, body = self._respond_to(method, path)
            except _BadRequest as bad:
                status, content_type, body = bad.status, TEXT, bad.body
            data = body.encode()
            writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(data)}\r\n"
                         f"Connection: close\r\n\r\n".encode() + data)
            await asyncio.wait_for(writer.drain(), timeout=self.read_timeout_s)
        except (TimeoutError, ConnectionError) as exc:
            log.debug("metrics connection dropped: %s", exc or type(exc).__name__)
        except Exception:  # noqa: BLE001 - a bug in rendering must not end the listener
            log.exception("metrics request failed")
        finally:
            self._open.pop(writer, None)
            writer.close()
