"""A minimal HTTP endpoint for Prometheus: `GET /metrics` (text format) and `GET /healthz` (200 when ready).

Plain asyncio streams, no web framework: two fixed routes on the same event loop as the gRPC servers.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

log = logging.getLogger(__name__)


class MetricsServer:
    def __init__(self, render: Callable[[], str], ready: Callable[[], bool]):
        self._render = render
        self._ready = ready
        self._server: asyncio.base_events.Server | None = None
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._handle, host, port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_line = await asyncio.wait_for(reader.readline(), timeout=5)
            while (await asyncio.wait_for(reader.readline(), timeout=5)) not in (b"\r\n", b"\n", b""):
                pass  # headers are not needed
            parts = request_line.decode("latin-1").split()
            path = parts[1] if len(parts) >= 2 else ""
            if parts and parts[0] != "GET":
                status, body = "405 Method Not Allowed", "only GET\n"
            elif path == "/metrics":
                status, body = "200 OK", self._render()
            elif path == "/healthz":
                status, body = ("200 OK", "ready\n") if self._ready() else ("503 Service Unavailable", "loading\n")
            else:
                status, body = "404 Not Found", "try /metrics or /healthz\n"
            data = body.encode()
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\n"
                f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data
            )
            await writer.drain()
        except (asyncio.TimeoutError, ConnectionError) as exc:
            log.debug("metrics request dropped: %s", exc)
        finally:
            writer.close()
