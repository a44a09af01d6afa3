"""A small Chrome DevTools Protocol driver for the page tests: the system's headless Chromium, driven over its
DevTools websocket (aiohttp's client), so a test can load a page, run its script as a user's click would, wait
on what the page reports, and read what the console said.

    async with Browser() as browser:
        page = await browser.open(url)
        await page.evaluate("breeze.synthesize()")
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import tempfile
from pathlib import Path

import aiohttp
from host_tools import need_tool

FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-quic", "--mute-audio",
         "--autoplay-policy=no-user-gesture-required", "--remote-debugging-port=0", "--window-size=1200,1400"]


class Page:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self.events: list[dict] = []  # every event the page sent (console messages, exceptions, loads)
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for message in self._ws:
            data = json.loads(message.data)
            if "id" in data and data["id"] in self._pending:
                self._pending.pop(data["id"]).set_result(data)
            else:
                self.events.append(data)

    async def send(self, method: str, **params) -> dict:
        call = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._pending[call] = future
        await self._ws.send_str(json.dumps({"id": call, "method": method, "params": params}))
        reply = await future
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply["result"]

    async def evaluate(self, expression: str):
        """The value of `expression` (a promise is awaited), run as if from a user's gesture."""
        result = await self.send("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True,
                                 userGesture=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout_s: float = 120) -> None:
        """Until `expression` is truthy in the page (the condition; the timeout only bounds a hang)."""
        async with asyncio.timeout(timeout_s):
            while not await self.evaluate(expression):
                await asyncio.sleep(0.05)

    def console_errors(self, since: int = 0) -> list[str]:
        """The errors the page reported from its `since`-th event on (exceptions, console.error, failed loads)."""
        found = []
        for event in self.events[since:]:
            if event.get("method") == "Runtime.exceptionThrown":
                found.append(json.dumps(event["params"]["exceptionDetails"])[:500])
            elif event.get("method") == "Runtime.consoleAPICalled" and event["params"]["type"] == "error":
                found.append(json.dumps(event["params"]["args"])[:500])
            elif event.get("method") == "Log.entryAdded" and event["params"]["entry"]["level"] == "error":
                found.append(event["params"]["entry"]["text"][:500])
        return found

    async def screenshot(self, path: Path) -> None:
        import base64

        shot = await self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(shot["data"]))

    async def close(self) -> None:
        await self._ws.close()
        self._reader.cancel()


class Browser:
    """Headless Chromium with a throwaway profile; `open(url)` -> a Page that has loaded `url`."""

    def __init__(self) -> None:
        self._exe = need_tool("chromium", "chromium-browser")
        # a helper process of the browser can still write its profile after the main one exited: a file left in
        # /tmp then is no verdict on the page
        self._profile = tempfile.TemporaryDirectory(prefix="breeze-cdp-", ignore_cleanup_errors=True)
        self._proc: subprocess.Popen | None = None
        self._session: aiohttp.ClientSession | None = None
        self._port = 0

    async def __aenter__(self) -> Browser:
        profile = self._profile.name
        self._proc = subprocess.Popen([self._exe, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      env=dict(os.environ, HOME=profile))
        active = Path(profile) / "DevToolsActivePort"
        async with asyncio.timeout(120):
            while not active.exists() or not active.read_text().strip():
                assert self._proc.poll() is None, "chromium exited before it listened"
                await asyncio.sleep(0.05)
        self._port = int(active.read_text().split()[0])
        self._session = aiohttp.ClientSession()
        return self

    async def open(self, url: str) -> Page:
        assert self._session is not None
        async with self._session.get(f"http://127.0.0.1:{self._port}/json/list") as reply:
            targets = await reply.json(content_type=None)
        target = next(t for t in targets if t["type"] == "page")
        ws = await self._session.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=64 * 1024 * 1024)
        page = Page(ws)
        for domain in ("Runtime", "Page", "Log"):
            await page.send(f"{domain}.enable")
        loaded = len(page.events)
        await page.send("Page.navigate", url=url)
        async with asyncio.timeout(120):
            while not any(e.get("method") == "Page.loadEventFired" for e in page.events[loaded:]):
                await asyncio.sleep(0.05)
        return page

    async def __aexit__(self, *exc) -> None:
        if self._session is not None:
            await self._session.close()
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)
        self._profile.cleanup()
