"""The metrics listener (transport/metrics_http.py) on a real port: its probe routes (/healthz follows whether
the worker takes jobs, /livez answers while it serves), and at its connection bounds it closes the oldest
connection still waiting for its request, of the address over its share or of all, so a scrape is answered.
Against a worker process with hundreds of silent connections: tests/reliability/test_peer_bounds.py."""

from __future__ import annotations

import asyncio

from breeze_worker.transport.metrics_http import MetricsServer


async def _get(port: int, path: str, source: str = "127.0.0.1") -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    reply = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    return reply


async def _silent(port: int, source: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))


def test_healthz_follows_whether_jobs_are_taken_and_livez_answers_while_serving():
    async def main():
        taking = {"jobs": False}
        server = MetricsServer(lambda: "breeze_frames_total 0\n", lambda: taking["jobs"])
        port = await server.start("127.0.0.1", 0)
        try:
            assert (await _get(port, "/healthz")).startswith(b"HTTP/1.1 503 ")  # loading
            taking["jobs"] = True
            assert (await _get(port, "/healthz")).startswith(b"HTTP/1.1 200 ")
            taking["jobs"] = False  # draining
            assert (await _get(port, "/healthz")).startswith(b"HTTP/1.1 503 ")
            assert (await _get(port, "/livez")).startswith(b"HTTP/1.1 200 ")
            assert (await _get(port, "/metrics")).endswith(b"breeze_frames_total 0\n")
        finally:
            await server.stop()
    asyncio.run(main())


def test_at_its_bounds_the_oldest_silent_connection_makes_room():
    async def main():
        server = MetricsServer(lambda: "ok\n", lambda: True, max_connections=8, max_per_peer=3,
                               read_timeout_s=600)
        port = await server.start("127.0.0.1", 0)
        try:
            mine = [await _silent(port, "127.0.0.2") for _ in range(5)]  # over its share of 3
            await asyncio.sleep(0)
            assert (await asyncio.wait_for(mine[0][0].read(), 30)) == b""  # its two oldest were closed
            assert (await asyncio.wait_for(mine[1][0].read(), 30)) == b""
            others = [await _silent(port, f"127.0.0.{3 + n}") for n in range(6)]  # the listener is full
            assert (await _get(port, "/metrics", source="127.0.0.20")).startswith(b"HTTP/1.1 200 ")
            assert server.evicted >= 3
            assert (await asyncio.wait_for(mine[2][0].read(), 30)) == b""  # the oldest of all made room
            for _, writer in mine[3:] + others:
                writer.close()
        finally:
            await server.stop()
    asyncio.run(main())
