"""A gRPC proxy that buffers each streamed response until upstream ends, in its own process.

    python -m netpath.buffering --upstream 127.0.0.1:50052

Gateways and reverse proxies with response buffering on collect a whole response before they pass it
on. This proxy does that for any service: a unary call goes through as it is; for a server-streaming
method (`--streaming`, default the Artifacts Fetch and the Synthesize stream) it collects every upstream
message, then sends them to the client back to back. Bytes go through untouched (no stubs, no parsing).

It prints one JSON line {"address": "127.0.0.1:PORT"} when it listens, then one line per buffered call
{"method", "first_upstream_ns", "upstream_end_ns", "released_ns", "messages", "bytes"} (wall clock), and
stops when its stdin closes. `BufferingProxy` is the context manager that runs it and collects the lines.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import subprocess
import sys
import threading
import time

import grpc

from netpath.child import start_reporting_child

STREAMING = ("/breeze.tts.v1.Artifacts/Fetch", "/breeze.tts.v1.Synthesis/Synthesize")
_OPTIONS = [("grpc.max_receive_message_length", 64 * 1024 * 1024), ("grpc.max_send_message_length", 64 * 1024 * 1024)]


class _Handler(grpc.GenericRpcHandler):
    def __init__(self, channel: grpc.aio.Channel, streaming: tuple[str, ...]) -> None:
        self.channel, self.streaming = channel, streaming

    def service(self, details):
        if details.method in self.streaming:
            return grpc.unary_stream_rpc_method_handler(functools.partial(self._stream, details.method))
        return grpc.unary_unary_rpc_method_handler(functools.partial(self._unary, details.method))

    async def _unary(self, method: str, request: bytes, context):
        try:
            return await self.channel.unary_unary(method)(request, metadata=context.invocation_metadata())
        except grpc.aio.AioRpcError as err:
            await context.abort(err.code(), err.details())

    async def _stream(self, method: str, request: bytes, context):
        held, first, size = [], None, 0
        try:
            async for message in self.channel.unary_stream(method)(request, metadata=context.invocation_metadata()):
                first = first or time.time_ns()
                held.append(message)
                size += len(message)
        except grpc.aio.AioRpcError as err:
            await context.abort(err.code(), err.details())
        ended = time.time_ns()
        for message in held:
            await context.write(message)
        print(json.dumps({"method": method, "first_upstream_ns": first, "upstream_end_ns": ended,
                          "released_ns": ended, "messages": len(held), "bytes": size}), flush=True)


async def serve(upstream: str, streaming: tuple[str, ...]) -> None:
    channel = grpc.aio.insecure_channel(upstream, options=_OPTIONS)
    server = grpc.aio.server(options=_OPTIONS)
    server.add_generic_rpc_handlers((_Handler(channel, streaming),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(json.dumps({"address": f"127.0.0.1:{port}"}), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    threading.Thread(target=lambda: (sys.stdin.read(), loop.call_soon_threadsafe(stop.set)), daemon=True).start()
    await stop.wait()
    await server.stop(0)
    await channel.close()


class BufferingProxy:
    """Run the proxy in a child process: `address` to connect to, `calls` (after exit) what it buffered."""

    def __init__(self, upstream: str, streaming: tuple[str, ...] = STREAMING) -> None:
        self.args = [sys.executable, "-m", "netpath.buffering", "--upstream", upstream]
        for method in streaming:
            self.args += ["--streaming", method]
        self.proc: subprocess.Popen | None = None
        self.address = ""
        self.calls: list[dict] = []

    def __enter__(self) -> BufferingProxy:
        self.proc, ready = start_reporting_child(self.args, "buffering proxy")
        self.address = ready["address"]
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is None:
            return
        self.proc.stdin.close()
        timer = threading.Timer(30, self.proc.kill)  # a proxy that does not stop is killed
        timer.start()
        try:
            out = self.proc.stdout.read()
            self.proc.wait()
        finally:
            timer.cancel()
        self.calls = [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--upstream", required=True, help="host:port of the gRPC server behind the proxy")
    p.add_argument("--streaming", action="append", default=None,
                   help="a server-streaming method to buffer (/package.Service/Method); repeatable")
    args = p.parse_args()
    asyncio.run(serve(args.upstream, tuple(args.streaming or STREAMING)))


if __name__ == "__main__":
    main()
