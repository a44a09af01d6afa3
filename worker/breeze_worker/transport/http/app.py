"""The HTTP face: an aiohttp server on the worker's own event loop, beside the gRPC servers.

Routes (http_routes below): the official API (`POST /v1/audio/speech` as a form, `POST /v1/audio/speech/batch`,
`GET /health`; official.py), the OpenAI speech API on the same path with a JSON body (openai_speech.py), the
listening page (`GET /`, page.py) with what it calls (`GET /v1/info`, `GET /v1/jobs/{job_id}`,
`POST /v1/compare`). Every synthesis is an engine job like a gRPC one (jobs.py): the same validation,
admission, queue, limits and artifact.

The gate (auth.py) decides from the request head, before a byte of the body is read; TLS and client
certificates are the gRPC ports' (--tls-cert, --tls-key, --tls-client-ca). A client has --http-read-timeout-s
to send its head and again its body; a handler is cancelled when its client hangs up, which cancels its job.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import socket
import ssl
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.web_urldispatcher import _default_expect_handler

from breeze_worker import logs
from breeze_worker.config import WorkerSettings
from breeze_worker.errors import BreezeError
from breeze_worker.transport.auth import AuthThrottle
from breeze_worker.transport.http import audio, official, openai_speech, page
from breeze_worker.transport.http import errors as he
from breeze_worker.transport.http.auth import Gate, read_limited
from breeze_worker.transport.http.compare import Comparison
from breeze_worker.transport.http.errors import HttpError
from breeze_worker.transport.http.jobs import RecentJobs, StartedJob, start_job
from breeze_worker.transport.http.voices import Voices
from breeze_worker.transport.stream_relay import SlowReaderBounds

log = logging.getLogger(__name__)

_SMALL_BODY_BYTES = 64 * 1024  # a JSON body with no audio in it (the page's comparison request)


def tls_context(settings: WorkerSettings) -> ssl.SSLContext | None:
    """The gRPC ports' TLS (--tls-cert/--tls-key) and, with --tls-client-ca, their client certificates."""
    s = settings.server
    if s.tls_cert is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(s.tls_cert), str(s.tls_key))
    if s.tls_client_ca is not None:
        context.load_verify_locations(str(s.tls_client_ca))
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _break(request: web.Request, why: str) -> None:
    """End a response whose head and part of its body were sent by breaking the connection: the client sees a
    broken stream, never a clean end of a short audio file."""
    log.warning("%s; the response was cut off", why)
    if request.transport is not None:
        request.transport.abort()


class HttpFace:
    def __init__(self, settings: WorkerSettings, engine, store, artifact_endpoint: str,
                 slow_readers: SlowReaderBounds | None = None, auth_throttle: AuthThrottle | None = None) -> None:
        """`slow_readers` and `auth_throttle`: the gRPC server's, so HTTP and gRPC streams share one total of
        buffered audio and an address one budget of failed tokens (None: the HTTP face's own, from the same
        settings)."""
        self.settings = settings
        self.engine, self.store, self.artifact_endpoint = engine, store, artifact_endpoint
        server = settings.server
        self.slow_readers = slow_readers or SlowReaderBounds(server.max_stream_buffer_bytes,
                                                             server.max_buffered_audio_bytes, server.reader_stall_s)
        self.gate = Gate(server.auth_token, server.max_request_bytes,
                         auth_throttle or AuthThrottle(server.auth_max_failures, server.auth_failure_refill_s))
        self.recent = RecentJobs()
        self.voices = Voices(settings.http.voices_dir, server.max_request_bytes)
        self.comparison = Comparison(settings, engine, store, self.recent)
        self._runner: web.AppRunner | None = None
        self.port = 0

    # ---- lifecycle ----
    def application(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware], client_max_size=self.settings.server.max_request_bytes)
        post = dict(expect_handler=self._expect)
        app.router.add_get("/", page.serve_page)
        app.router.add_get("/favicon.ico", page.no_icon)
        app.router.add_get("/health", self.health)
        app.router.add_post("/v1/audio/speech", self.speech, **post)
        app.router.add_post("/v1/audio/speech/batch", self.batch, **post)
        app.router.add_get("/v1/info", self.info)
        app.router.add_get("/v1/jobs/{job_id}", self.job)
        app.router.add_post("/v1/compare", self.compare, **post)
        return app

    async def start(self) -> int:
        h = self.settings.http
        self._runner = web.AppRunner(self.application(), handler_cancellation=True, access_log=None,
                                     keepalive_timeout=h.read_timeout_s)
        await self._runner.setup()
        site = web.TCPSite(self._runner, h.host, h.port, ssl_context=tls_context(self.settings), reuse_port=False)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            raise OSError(f"cannot listen on {h.host}:{h.port} for HTTP ({exc}): pick another --http-port") from exc
        self.port = int(self._runner.addresses[0][1])
        self.comparison.start()
        return self.port

    async def stop(self) -> None:
        await self.comparison.stop()
        if self._runner is not None:
            await self._runner.cleanup()

    # ---- the gate and the error answers ----
    async def _expect(self, request: web.Request) -> web.StreamResponse | None:
        refusal = self.gate.refusal(request)
        if refusal is not None:
            return he.response(refusal, he.style_of(request))
        await _default_expect_handler(request)
        return None

    @web.middleware
    async def _middleware(self, request: web.Request,
                          handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        logs.bind(method=f"HTTP {request.method} {request.path}", peer=request.remote or "",
                  request_id=request.headers.get("X-Request-Id"))
        style = he.style_of(request)
        refusal = self.gate.refusal(request)
        if refusal is not None:
            return he.response(refusal, style)
        try:
            return await handler(request)
        except HttpError as exc:
            log.info("HTTP %s %s: %d %s", request.method, logs.clip(request.path), exc.status, exc.message)
            return he.response(exc, style)
        except BreezeError as exc:
            error = he.from_breeze(exc)
            if error.status >= 500 and error.status != 503:
                log.error("HTTP %s failed: %s", request.path, exc, exc_info=exc)
            else:
                log.info("HTTP %s rejected: %d %s", logs.clip(request.path), error.status, error.message)
            return he.response(error, style)
        except web.HTTPException:
            raise
        except Exception as exc:  # noqa: BLE001 - the one place that turns surprises into 500
            return he.response(he.unexpected(exc, f"HTTP {request.method} {request.path}"), style)

    # ---- synthesis ----
    def _request_id(self, request: web.Request) -> str | None:
        return request.headers.get("X-Request-Id") or None

    async def _start(self, synthesis, received_ns: int) -> StartedJob:
        return await start_job(self.engine, synthesis, self.recent, received_ns=received_ns,
                               slow_readers=self.slow_readers)

    async def speech(self, request: web.Request) -> web.StreamResponse:
        received_ns = time.time_ns()
        if request.content_type == "application/json":
            return await self._openai(request, received_ns)
        form = await official.read_form(request, self.settings.http.read_timeout_s,
                                        self.settings.server.max_request_bytes)
        job = await self._start(official.speech_request(form, self._request_id(request)), received_ns)
        reply = web.StreamResponse(headers={"X-Sample-Rate": str(job.record.sample_rate), "X-Sample-Format": "s16le",
                                            **job.headers(self.artifact_endpoint)})
        reply.content_type = audio.CONTENT_TYPES["pcm"]
        return await self._stream(request, reply, job, audio.Encoder("pcm", job.record.sample_rate), sse=False)

    async def _openai(self, request: web.Request, received_ns: int) -> web.StreamResponse:
        raw = await self._read_body(request, self.settings.server.max_request_bytes)
        body = openai_speech.parse(raw, self.voices, self._request_id(request))
        job = await self._start(body.request, received_ns)
        rate = job.record.sample_rate
        headers = {**job.headers(self.artifact_endpoint), "X-Sample-Rate": str(rate)}
        if body.stream:
            reply = web.StreamResponse(headers=headers)
            reply.content_type = "text/event-stream" if body.sse else audio.CONTENT_TYPES[body.response_format]
            return await self._stream(request, reply, job, audio.Encoder(body.response_format, rate), sse=body.sse)
        chunks: list[bytes] = []

        async def keep(pcm: bytes) -> None:
            chunks.append(pcm)

        try:
            finished = await job.audio(keep)
        finally:
            await job.close()
        if finished.artifact is None:
            headers["X-Artifact-Unavailable"] = logs.clip(finished.artifact_unavailable or "no artifact", 200)
        data = await asyncio.to_thread(audio.encode_whole, body.response_format, b"".join(chunks), rate)
        reply = web.Response(body=data, headers=headers)
        reply.content_type = audio.CONTENT_TYPES[body.response_format].split(";")[0]
        return reply

    async def _stream(self, request: web.Request, reply: web.StreamResponse, job: StartedJob,
                      encoder: audio.Encoder, sse: bool) -> web.StreamResponse:
        """The job's audio through `encoder` as it is generated (raw bytes, or server-sent events)."""
        async def send(data: bytes) -> None:
            if not data:
                return
            if sse:
                event = {"type": "speech.audio.delta", "audio": _b64(data)}
                data = f"data: {json.dumps(event)}\n\n".encode()
            await reply.write(data)

        self._bound_send_buffer(request)
        try:
            await reply.prepare(request)
        except BaseException:
            await job.close()
            raise
        try:
            finished = await job.audio(lambda pcm: send(encoder.feed(pcm)))
            await send(encoder.finish())
        except ConnectionError:  # the client went away: the job was cancelled with the relay
            log.info("job %s: the client closed the connection", job.record.job_id)
            return reply
        except BreezeError as exc:
            _break(request, f"job {job.record.job_id}: {exc}")
            return reply
        if sse:
            done = {"type": "speech.audio.done", "job_id": job.record.job_id, "artifact_id": job.record.artifact_id,
                    "usage": {"frames": finished.stats.frames, "audio_seconds": finished.stats.audio_seconds}}
            await reply.write(f"data: {json.dumps(done)}\n\n".encode())
        await reply.write_eof()
        return reply

    def _bound_send_buffer(self, request: web.Request) -> None:
        """A streamed response's socket buffers at most --max-stream-buffer-bytes (the kernel caps it at its
        wmem_max): left to grow, the kernel would hold megabytes of audio for a client that stopped reading,
        beyond the relay's bound (gRPC streams have HTTP/2's flow-control window instead)."""
        sock = request.transport.get_extra_info("socket") if request.transport is not None else None
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.settings.server.max_stream_buffer_bytes)

    async def batch(self, request: web.Request) -> web.Response:
        received_ns = time.time_ns()
        form = await official.read_form(request, self.settings.http.read_timeout_s,
                                        self.settings.server.max_request_bytes)
        model_cap = self.engine.runtime.model.generation_defaults.max_frames if self.engine.runtime else 1500
        wanted = official.batch_requests(form, self._request_id(request), model_cap)
        window = asyncio.Semaphore(self.settings.engine.max_active_streams)  # never more than the engine runs

        async def one(synthesis) -> tuple[StartedJob, bytes]:
            async with window:
                job = await self._start(synthesis, received_ns)
                chunks: list[bytes] = []

                async def keep(pcm: bytes) -> None:
                    chunks.append(pcm)

                try:
                    await job.audio(keep)
                finally:
                    await job.close()
                return job, b"".join(chunks)

        try:
            # new reference audio is decoded once: the first job takes it in, the others find it held
            first = [await one(wanted[0])] if wanted[0].reference is not None else []
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(one(r)) for r in wanted[len(first):]]
        except ExceptionGroup as failed:  # one job's failure ends the batch (the others were cancelled)
            raise failed.exceptions[0] from None
        results = first + [t.result() for t in tasks]
        segments = [pcm for _, pcm in results]
        rate = results[0][0].record.sample_rate
        return web.Response(body=b"".join(segments), content_type="application/octet-stream", headers={
            "X-Segment-Bytes": ",".join(str(len(s)) for s in segments), "X-Sample-Rate": str(rate),
            "X-Sample-Format": "s16le", "Cache-Control": "no-store",
            "X-Job-Ids": ",".join(job.record.job_id for job, _ in results),
            "X-Artifact-Ids": ",".join(job.record.artifact_id for job, _ in results),
            "X-Artifact-Endpoint": self.artifact_endpoint})

    async def _read_body(self, request: web.Request, limit: int) -> bytes:
        timeout_s = self.settings.http.read_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                return await read_limited(request, limit)
        except TimeoutError:
            raise HttpError(408, f"the request body did not arrive within {timeout_s:g} s (the worker's "
                                 "--http-read-timeout-s)", close=True) from None

    # ---- health, the page's calls ----
    async def health(self, request: web.Request) -> web.Response:
        """The official health answer: 200 {"status": "ok", "sample_rate"} once serving, 503 before and while
        draining."""
        if getattr(self.engine, "draining", False):
            return web.json_response({"status": "draining"}, status=503, headers={"Retry-After": "5"})
        if not getattr(self.engine, "ready", False):
            return web.json_response({"status": "loading"}, status=503, headers={"Retry-After": "5"})
        return web.json_response({"status": "ok", "sample_rate": self.engine.sample_rate})

    async def info(self, request: web.Request) -> web.Response:
        runtime = getattr(self.engine, "runtime", None)
        return web.json_response({
            "model": self.engine.model_description, "tiny_default": bool(self.engine.is_tiny_default),
            "ready": bool(self.engine.ready), "sample_rate": self.engine.sample_rate,
            "serving": None if runtime is None else {"precision": runtime.precision, "decode_path": runtime.decode_path,
                                                     "device": str(runtime.device)},
            "reference": self.comparison.describe(), "voices": self.voices.names(),
            "response_formats": audio.available(), "max_text_chars": self.settings.engine.max_text_chars,
            "max_request_bytes": self.settings.server.max_request_bytes,
            "artifact_endpoint": self.artifact_endpoint})

    async def job(self, request: web.Request) -> web.Response:
        record = self.recent.get(request.match_info["job_id"])
        if record is None:
            raise HttpError(404, f"job {logs.clip(request.match_info['job_id'])} is not among this worker's recent "
                                 "HTTP jobs", param="job_id")
        return web.json_response(record.to_json())

    async def compare(self, request: web.Request) -> web.Response:
        raw = await self._read_body(request, _SMALL_BODY_BYTES)
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise HttpError(400, f"the body must be JSON {{\"job_id\": ...}}: {exc}") from None
        job_id = body.get("job_id") if isinstance(body, dict) else None
        return web.json_response(await self.comparison.compare(job_id))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def start_http(settings: WorkerSettings, engine, store, artifact_endpoint: str,
                     slow_readers: SlowReaderBounds | None = None, auth_throttle: AuthThrottle | None = None
                     ) -> HttpFace:
    """The HTTP face, listening (its `port` bound); `stop()` closes it."""
    face = HttpFace(settings, engine, store, artifact_endpoint, slow_readers, auth_throttle)
    await face.start()
    return face
