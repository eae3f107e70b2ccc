"""Real headless Chromium driven over the DevTools protocol (aiohttp websocket), for tests."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp

# Debian's chromium, headless, no sandbox (containers), a fresh profile each run.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--no-first-run", "--no-default-browser-check", "--mute-audio", "--hide-scrollbars")
START_TIMEOUT_S = 60.0  # a cold chromium on a loaded two-core machine takes a few seconds


def chromium_binary() -> str | None:
    """The chromium executable on PATH, or None."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


class DevToolsError(RuntimeError):
    """Chromium did not start, or a DevTools command failed."""


class Page:
    """One page target: send commands, evaluate JavaScript, wait for a condition."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.requested: list[str] = []  # every URL the page asked for (Network domain)
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for msg in self.ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            data = json.loads(msg.data)
            if data.get("method") == "Network.requestWillBeSent":
                self.requested.append(data["params"]["request"]["url"])
            future = self._waiting.pop(data.get("id", -1), None)
            if future is not None and not future.done():
                future.set_result(data)
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(DevToolsError("the DevTools connection closed"))

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command; its result, or DevToolsError."""
        ident = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[ident] = future
        await self.ws.send_str(json.dumps({"id": ident, "method": method, "params": params}))
        answer = await asyncio.wait_for(future, START_TIMEOUT_S)
        if "error" in answer:
            raise DevToolsError(f"{method}: {answer['error']}")
        result: dict[str, Any] = answer.get("result", {})
        return result

    async def evaluate(self, expression: str) -> Any:
        """The JSON value of a JavaScript expression in the page."""
        result = await self.send("Runtime.evaluate", expression=expression,
                                 returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise DevToolsError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout_s: float,
                       accept: Callable[[Any], bool] = bool) -> Any:
        """Poll `expression` until `accept(value)`; its value, or TimeoutError with the last."""
        deadline = time.monotonic() + timeout_s
        value: Any = None
        while time.monotonic() < deadline:
            value = await self.evaluate(expression)
            if accept(value):
                return value
            await asyncio.sleep(0.2)
        raise TimeoutError(f"{expression!r} never held in {timeout_s} s; last value {value!r}")

    async def screenshot(self, path: Path, full_page: bool = True) -> None:
        """A PNG of the page (the whole page, not only the viewport, when full_page)."""
        params: dict[str, Any] = {"format": "png", "captureBeyondViewport": full_page}
        if full_page:
            size = await self.evaluate("[document.documentElement.scrollWidth,"
                                       " document.documentElement.scrollHeight]")
            params["clip"] = {"x": 0, "y": 0, "width": size[0], "height": size[1], "scale": 1}
        result = await self.send("Page.captureScreenshot", **params)
        path.write_bytes(base64.b64decode(result["data"]))

    async def close(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        await self.ws.close()


async def _devtools_port(profile: Path, process: subprocess.Popen[bytes]) -> int:
    """Chromium writes the port it chose (--remote-debugging-port=0) into its profile."""
    marker = profile / "DevToolsActivePort"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise DevToolsError(f"chromium exited with {process.returncode}")
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int(marker.read_text().splitlines()[0])
        await asyncio.sleep(0.05)
    raise DevToolsError(f"chromium wrote no DevTools port in {START_TIMEOUT_S} s")


@contextlib.asynccontextmanager
async def open_page(url: str, width: int = 1280, height: int = 800, *,
                    blocked: Sequence[str] = (), init_script: str = "") -> AsyncIterator[Page]:
    """Start headless chromium on a fresh profile, open `url` at width×height, yield the page.
    `blocked`: URL patterns the page's requests to fail (`*` a wildcard); `init_script`:
    JavaScript run in the page before any of its own."""
    binary = chromium_binary()
    if binary is None:
        raise DevToolsError("chromium is not installed (scripts/ensure-chromium installs it)")
    # Chromium's helper processes may still write to the profile as it is removed (seen
    # under stress-ng: "Directory not empty: 'Default'"): the whole process group is killed
    # below, and what a straggler leaves behind does not fail the test.
    with tempfile.TemporaryDirectory(prefix="meshroute-chromium-",
                                     ignore_cleanup_errors=True) as tmp:
        profile = Path(tmp)
        command = [binary, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0",
                   "--remote-debugging-address=127.0.0.1", f"--window-size={width},{height}",
                   "about:blank"]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   start_new_session=True)
        try:
            port = await _devtools_port(profile, process)
            async with aiohttp.ClientSession() as session:
                async with session.get(f"http://127.0.0.1:{port}/json/list") as resp:
                    targets = await resp.json()
                page_ws = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
                ws = await session.ws_connect(page_ws, max_msg_size=64 * 1024 * 1024)
                page = Page(ws)
                try:
                    await page.send("Emulation.setDeviceMetricsOverride", width=width,
                                    height=height, deviceScaleFactor=1, mobile=False)
                    await page.send("Page.enable")
                    await page.send("Network.enable")
                    if blocked:
                        await page.send("Network.setBlockedURLs", urls=list(blocked))
                    if init_script:
                        await page.send("Page.addScriptToEvaluateOnNewDocument",
                                        source=init_script)
                    await page.send("Page.navigate", url=url)
                    # the load event never comes (an EventSource stays open): wait for the DOM
                    await page.wait_for(f"location.href === {json.dumps(url)} && "
                                        "document.readyState !== 'loading'", START_TIMEOUT_S)
                    yield page
                finally:
                    await page.close()
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # its renderer and GPU helpers too
