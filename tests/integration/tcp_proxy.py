"""A small TCP proxy for tests: forwards to a target, can add latency and drop a connection mid-transfer.

    with TcpProxy("127.0.0.1:50052", drop_after_bytes=20_000) as proxy:
        client.fetch(..., endpoint=proxy.address)   # the first connection breaks after 20 000 bytes

Runs its own event loop in a thread. `drop_after_bytes` cuts the first `drops` connections once that
many bytes went from the target to the client; `delay_s` holds every forwarded piece that long.
`outage_s` makes each drop an outage: the proxy stops listening for that long (connections are
refused), then listens on the same port again. `stall_after_bytes` forwards that many bytes from the target
to each client, then holds the rest (the connection stays open, nothing more arrives; `stalled` is set).
`cut()` breaks every open connection at once, as a drop does (with its outage): for a test that cuts only
once the client has shown progress. `bytes_to_target` counts what the clients sent on.
"""

from __future__ import annotations

import asyncio
import threading


class TcpProxy:
    def __init__(self, target: str, *, drop_after_bytes: int | None = None, drops: int = 1,
                 delay_s: float = 0.0, outage_s: float = 0.0, stall_after_bytes: int | None = None) -> None:
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self.drop_after_bytes, self.drops_left, self.delay_s = drop_after_bytes, drops, delay_s
        self.outage_s = outage_s
        self.stall_after_bytes = stall_after_bytes
        self.stalled = threading.Event()  # a connection reached stall_after_bytes
        self.connections = 0
        self.dropped = 0
        self.bytes_to_target = 0  # bytes forwarded from clients to the target, all connections
        self.outages = 0  # outages over (the proxy listens again)
        self.address = ""
        self._tasks: set[asyncio.Task] = set()
        self._live: set[tuple] = set()  # (client writer, target writer) of each open connection
        self._loop = asyncio.new_event_loop()
        self._release = asyncio.Event()  # lets stalled connections end at exit
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tcp-proxy", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())
        self._started.set()
        self._loop.run_forever()

    async def _serve(self, port: int = 0) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", port)
        self.address = f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _outage(self, port: int) -> None:
        """Nothing listens on `port` (closed by the caller): wait `outage_s`, then listen on it again."""
        await asyncio.sleep(self.outage_s)
        await self._serve(port)
        self.outages += 1

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        try:
            await self._forward(client_r, client_w)
        finally:
            self._tasks.discard(task)

    async def _forward(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        limit = None
        if self.drop_after_bytes is not None and self.drops_left > 0:
            self.drops_left -= 1
            limit = self.drop_after_bytes
        try:
            target_r, target_w = await asyncio.open_connection(*self._target)
        except OSError:
            client_w.close()
            return
        done = asyncio.Event()
        pair = (client_w, target_w)
        self._live.add(pair)

        async def pump(reader, writer, cap, stall=None):
            sent = 0
            try:
                while not done.is_set():
                    data = await reader.read(4096)
                    if not data:
                        break
                    if self.delay_s:
                        await asyncio.sleep(self.delay_s)
                    if stall is not None and sent + len(data) >= stall:
                        writer.write(data[:max(stall - sent, 0)])
                        await writer.drain()
                        self.stalled.set()
                        await self._release.wait()  # hold: nothing more goes to the client
                        break
                    if cap is not None and sent + len(data) >= cap:
                        writer.write(data[:max(cap - sent, 0)])
                        self._drop([pair])
                        break
                    writer.write(data)
                    await writer.drain()
                    sent += len(data)
                    if writer is target_w:
                        self.bytes_to_target += len(data)
            except (ConnectionError, OSError):
                pass
            finally:
                done.set()
                for w in (client_w, target_w):
                    if not w.is_closing():
                        w.close()

        try:
            await asyncio.gather(pump(client_r, target_w, None),
                                 pump(target_r, client_w, limit, self.stall_after_bytes))
        finally:
            self._live.discard(pair)

    def _drop(self, pairs) -> None:
        """Break these connections (on the loop), starting the outage first: no reconnect can slip in between."""
        self.dropped += 1
        if self.outage_s:
            port = self._server.sockets[0].getsockname()[1]
            self._server.close()
            self._tasks.add(asyncio.create_task(self._outage(port)))
        for pair in pairs:
            for w in pair:
                w.transport.abort()

    def cut(self) -> None:
        """Break every open connection now, as a drop does (one drop, its outage included)."""
        async def cut_now():
            self._drop(list(self._live))

        asyncio.run_coroutine_threadsafe(cut_now(), self._loop).result(10)

    def __enter__(self) -> TcpProxy:
        self._thread.start()
        self._started.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        async def close():
            self._release.set()
            await asyncio.sleep(0)  # the stalled connections end on their own
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()
