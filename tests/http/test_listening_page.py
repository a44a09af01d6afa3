"""The listening page in real headless Chromium: it loads with nothing from elsewhere, asks for the token, a
synthesis streams and plays to its end, and the FP32 comparison renders (waveforms, spectrograms, the agreement
table). On the CPU both sides are FP32, so the agreement is exact and the waveforms identical; the page says
what each side is."""

from __future__ import annotations

import json

import pytest
from cdp import Browser
from http_helpers import TOKEN

pytestmark = pytest.mark.timeout(900)


async def drawn_pixels(page, canvas_id: str) -> int:
    """How many pixels of a canvas differ from its background (0: nothing was drawn)."""
    return await page.evaluate(f"""(() => {{
        const c = document.getElementById({json.dumps(canvas_id)}), d = c.getContext("2d")
            .getImageData(0, 0, c.width, c.height).data;
        let n = 0;
        for (let i = 0; i < d.length; i += 4) if (d[i] !== 246 || d[i + 1] !== 247 || d[i + 2] !== 249) n++;
        return n; }})()""")


async def test_the_page_plays_a_synthesis_to_the_end_and_compares_with_fp32(served, tmp_path):
    async with Browser() as browser:
        page = await browser.open(served.url("/"))
        await page.wait_for("document.body.dataset.state !== 'loading'")
        assert await page.evaluate("document.body.dataset.state") == "error"  # no token yet: /v1/info refused
        assert "401" in await page.evaluate("document.getElementById('model').textContent")
        await page.evaluate(f"document.getElementById('token').value = {json.dumps(TOKEN)}; breeze.loadInfo()")
        assert await page.evaluate("document.body.dataset.state") == "idle"
        with_token = len(page.events)
        assert "fp32" in await page.evaluate("document.getElementById('serving-what').textContent")
        assert "tiny embedded default" in await page.evaluate("document.getElementById('reference-what').textContent")
        assert await page.evaluate("document.getElementById('compare').checked")

        await page.evaluate("document.getElementById('text').value = 'Hello from the page.'")
        run = await page.evaluate("breeze.synthesize()")
        assert "error" not in run, run
        assert run["played"] and run["chunks_played"] > 1  # every streamed chunk played to its end
        assert run["audio_s"] > 0 and abs(run["heard_s"] - run["audio_s"]) < 1e-6  # all of it, chunk by chunk
        assert run["span_s"] >= run["audio_s"] - 1e-6  # (longer where the stream ran dry: `gaps`)
        assert run["ttfa_ms"] > 0 and run["rtf"] > 0 and run["server"]["ttfa_s"] > 0
        compared = run["compare"]
        assert compared["serving_precision"] == compared["reference_precision"] == "fp32"
        assert compared["summary"]["top1_agreement"] == 1.0 and compared["summary"]["kl_max"] == 0.0
        assert compared["waveform"]["identical"]
        assert await page.evaluate("document.body.dataset.state") == "compared"
        rows = await page.evaluate("document.querySelectorAll('#agreement-table tr').length")
        assert rows == 1 + 1 + 16  # header, all, each codebook
        assert "identical" in await page.evaluate("document.getElementById('waveform-difference').textContent")
        for canvas in ("serving-wave", "serving-spec", "reference-wave", "reference-spec"):
            assert await drawn_pixels(page, canvas) > 100, canvas
        origins = await page.evaluate("[...new Set(performance.getEntriesByType('resource')"
                                      ".map((e) => new URL(e.name).origin))]")
        assert origins == [served.base]  # nothing fetched from anywhere else
        assert page.console_errors(since=with_token) == []
        await page.screenshot(tmp_path / "page.png")
        await page.close()


async def test_the_page_shows_an_error_from_the_worker(served):
    async with Browser() as browser:
        page = await browser.open(served.url("/"))
        await page.wait_for("document.body.dataset.state !== 'loading'")
        await page.evaluate(f"document.getElementById('token').value = {json.dumps(TOKEN)}; breeze.loadInfo()")
        await page.evaluate("document.getElementById('cfg_scale').value = '0'")
        run = await page.evaluate("breeze.synthesize()")
        assert run["error"] == "400: cfg_scale must be greater than 0."
        assert await page.evaluate("document.body.dataset.state") == "error"
        await page.close()
