"""The worker's optional HTTP face (--http-port): the official Breeze TTS 2 API, the OpenAI speech API and a
listening page, on an aiohttp server that shares the gRPC servers' event loop and calls the same engine
(app.py says what is where)."""

from breeze_worker.transport.http.app import HttpFace, start_http

__all__ = ["HttpFace", "start_http"]
