"""Real mitmproxy in-process (DumpMaster on loopback) with the addon, and chat servers beside
it, all in one event loop on a background thread; the tests talk to it as clients do."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mitmproxy import options
from mitmproxy.tools.dump import DumpMaster

from meshroute_middleware.app.mitm import MeshRouteAddon
from node_agent.serving import serve_app

STARTUP_TIMEOUT_S = 20.0


def dead_url() -> str:
    """A loopback URL where nothing listens (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@dataclass
class Node:
    """A node record; `app` is served on a loopback port (its URL filled in), else `url`."""

    node_id: str
    start: int = 0
    end: int = 39
    tps: float = 10.0
    app: Any = None
    url: str = ""
    model: str = "m"
    layers: int = 40
    caps: list[str] | None = None  # None: none declared (the defaults)

    def record(self) -> dict[str, Any]:
        caps = {} if self.caps is None else {"caps": self.caps}
        return {"node_id": self.node_id, "model": self.model, "start": self.start,
                "end": self.end, "layers": self.layers, "url": self.url, "tps": self.tps,
                **caps}


@dataclass
class Mitm:
    """What a running harness exposes."""

    proxy: str  # http://127.0.0.1:PORT of mitmproxy
    side: str  # the addon's side server
    addon: MeshRouteAddon
    extra: dict[str, str] = field(default_factory=dict)  # name -> URL of extra apps


@contextlib.contextmanager
def running_mitm(tmp: Path, nodes: list[Node], extra_apps: dict[str, Any] | None = None,
                 forwarder: Any = None, **settings: str) -> Iterator[Mitm]:
    """Serve the nodes' apps, write the nodes file, run mitmproxy with the addon."""
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        stop = asyncio.Event()
        box["stop"] = (asyncio.get_running_loop(), stop)
        async with contextlib.AsyncExitStack() as stack:
            for node in nodes:
                if node.app is not None:
                    node.url = await stack.enter_async_context(serve_app(node.app))
            extra = {name: await stack.enter_async_context(serve_app(app))
                     for name, app in (extra_apps or {}).items()}
            path = tmp / "nodes.json"
            path.write_text(json.dumps([n.record() for n in nodes]))
            master = DumpMaster(options.Options(listen_host="127.0.0.1", listen_port=0),
                                with_termlog=False, with_dumper=False)
            addon = MeshRouteAddon(forwarder=forwarder)
            master.addons.add(addon)
            master.options.update(**{
                "meshroute_nodes_file": str(path), "meshroute_side_port": 0,
                "meshroute_mdns": "false", "meshroute_health_interval_s": "300", **settings})
            task = asyncio.ensure_future(master.run())
            async with asyncio.timeout(STARTUP_TIMEOUT_S):
                await addon.ready.wait()
            host, port = master.addons.get("proxyserver").listen_addrs()[0][:2]
            assert addon.side is not None
            box["mitm"] = Mitm(f"http://{host}:{port}", addon.side.url, addon, extra)
            ready.set()
            await stop.wait()
            master.shutdown()
            await task

    def target() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:  # surfaced to the test below
            box["error"] = exc
            ready.set()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    ready.wait(STARTUP_TIMEOUT_S + 10)
    if "mitm" not in box:
        raise RuntimeError(f"mitmproxy harness did not start: {box.get('error')!r}")
    try:
        yield box["mitm"]
    finally:
        loop, stop = box["stop"]
        loop.call_soon_threadsafe(stop.set)
        thread.join(20)
        assert not thread.is_alive(), "the harness did not stop"
        if "error" in box:
            raise box["error"]
