"""The listening page (`GET /`): one self-contained HTML file (static/page.html: its script, styles and drawing
inline, nothing fetched from elsewhere, so it works on a worker without internet).

What it does (all through the routes a client would call): a form with the official fields (text,
instruction, CFG scale, seed, a reference upload with its transcript) posted to `POST /v1/audio/speech`; the
streamed PCM played as it arrives (Web Audio, each chunk scheduled after the previous one), with time to
first audio and real-time factor as the browser saw them and as the worker measured them
(`GET /v1/jobs/{id}`); the waveform and spectrogram of what played; and, where the worker holds the FP32
reference copy (--http-reference-fp32; the page says when it does not), the same job rendered at FP32
(`POST /v1/compare`) beside it, with both waveforms and spectrograms and the agreement figures of
`breeze-worker precision-check`. With a token, the page asks for it and sends it with every call.
"""

from __future__ import annotations

import functools
from importlib import resources

from aiohttp import web

# nothing but this origin: the page's own script and styles inline, its calls to the worker, audio from blobs
CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                           "connect-src 'self'; img-src 'self' data:; media-src 'self' blob:; base-uri 'none'; "
                           "form-action 'none'")


@functools.cache
def page_html() -> bytes:
    return resources.files("breeze_worker.transport.http").joinpath("static/page.html").read_bytes()


async def serve_page(request: web.Request) -> web.Response:
    return web.Response(body=page_html(), content_type="text/html", charset="utf-8",
                        headers={"Content-Security-Policy": CONTENT_SECURITY_POLICY, "Cache-Control": "no-cache",
                                 "X-Content-Type-Options": "nosniff"})


async def no_icon(request: web.Request) -> web.Response:
    """Browsers ask for an icon; the page has none (204, not a 404 in the console)."""
    return web.Response(status=204)
