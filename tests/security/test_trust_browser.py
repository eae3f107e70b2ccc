"""Issue 22, item 2: a web page in a browser on the tracker's machine, on another origin (a
second loopback port), in real headless Chromium. Its `no-cors` POSTs with `text/plain`
re-pointed gpu-a, spent a provider key and cleared cooldowns; a rebound name read the API.

Run inside scripts/isolated (loopback only). Skipped where chromium is not installed.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route

from meshroute_middleware.core import NodeRecord

from ..dashboard import browser
from ..providers.fake_provider import FakeProvider, Reply
from ..providers.gateway import ENV, gateway, providers_doc
from ..upstream import FakeChat, ServerThread

pytestmark = pytest.mark.skipif(browser.chromium_binary() is None,
                                reason="chromium is not installed")
REBOUND = "evil.example"  # Chromium resolves it to 127.0.0.1, as a rebinding DNS would

ATTACK = """<!doctype html><title>a page on another origin</title><script>
const GW = %(gw)s, REBOUND = %(rebound)s;
const writes = [["/v1/nodes", %(node)s], ["/v1/cooldowns/clear", ""],
                ["/v1/chat/completions", %(chat)s]];
async function attack() {
  const done = [];
  for (const [path, body] of writes) {  // what any page may send without a preflight
    try {
      await fetch(GW + path, {method: "POST", mode: "no-cors", body: body,
                              headers: {"Content-Type": "text/plain"}});
      done.push("sent " + path);
    } catch (e) { done.push(path + ": " + e); }
  }
  try {
    await fetch(REBOUND + "/v1/nodes", {method: "POST", mode: "no-cors", body: %(node)s,
                                        headers: {"Content-Type": "text/plain"}});
    done.push("sent rebound");
  } catch (e) { done.push("rebound: " + e); }
  window.done = done;
}
attack();
</script>"""


@pytest.fixture
def providers() -> Iterator[tuple[FakeProvider, FakeProvider]]:
    fast, slow = FakeProvider("fast"), FakeProvider("slow", models=("small-model",))
    with fast.serve(), slow.serve():
        yield fast, slow


def attacker_app(html: str) -> Starlette:
    async def page(request: Request) -> HTMLResponse:
        return HTMLResponse(html)
    return Starlette(routes=[Route("/", page)])


@pytest.mark.anyio
async def test_a_page_on_another_origin_cannot_write_spend_or_clear(
        providers: tuple[FakeProvider, FakeProvider], monkeypatch: pytest.MonkeyPatch) -> None:
    fast, slow = providers
    real, evil = FakeChat("real"), FakeChat("evil")
    fast.by_key[ENV["FAST_A"]] = Reply(401)  # key 1 gets revoked: only a clear brings it back
    with ServerThread(real.app()) as real_head, ServerThread(evil.app()) as evil_head, \
            tempfile.TemporaryDirectory() as tmp:
        nodes = Path(tmp) / "nodes.json"
        gpu_a = NodeRecord("gpu-a", "m", 0, 39, 40, real_head.url, 10.0)
        nodes.write_text(json.dumps([gpu_a.to_dict()]))
        with gateway(providers_doc(fast, slow), nodes_file=str(nodes)) as gw:
            assert gw.chat("fastco/big-model").status_code == 200  # key 1 revoked, key 2 served
            fast.by_key.clear()
            spent = len(fast.seen)
            port = gw.url.rsplit(":", 1)[1]
            repointed = NodeRecord("gpu-a", "m", 0, 39, 40, evil_head.url, 1e6).to_dict()
            chat = {"model": "fastco/big-model", "messages": [{"role": "user", "content": "x"}]}
            html = ATTACK % {"gw": json.dumps(gw.url),
                             "rebound": json.dumps(f"http://{REBOUND}:{port}"),
                             "node": json.dumps(json.dumps(repointed)),
                             "chat": json.dumps(json.dumps(chat))}
            monkeypatch.setattr(browser, "FLAGS", (*browser.FLAGS,
                                f"--host-resolver-rules=MAP {REBOUND} 127.0.0.1"))
            with ServerThread(attacker_app(html)) as attacker:
                async with browser.open_page(attacker.url + "/") as page:
                    done = await page.wait_for("window.done", 60)
                    # the rebound name's own page: what a rebinding script would read
                    await page.send("Page.navigate", url=f"http://{REBOUND}:{port}/v1/nodes")
                    seen = await page.wait_for(
                        "document.readyState === 'complete' && location.host.startsWith("
                        f"{json.dumps(REBOUND)}) && document.body.innerText", 60)
            assert done == ["sent /v1/nodes", "sent /v1/cooldowns/clear",
                            "sent /v1/chat/completions", "sent rebound"]
            # nothing happened: gpu-a not re-pointed, no provider request, key 1 still out
            node = gw.gateway.router.topology.node("gpu-a")
            assert node is not None and node.url == real_head.url and node.tps == 10.0
            assert len(fast.seen) == spent and len(slow.seen) == 0
            view = httpx.get(f"{gw.url}/v1/routing/chain", params={"model": "fastco/big-model"})
            assert view.json()["chain"][0]["keys"][0]["state"] == "revoked"
            assert json.loads(seen)["error"]["code"] == "invalid_host"
            assert "gpu-a" not in seen
            reasons = [e["reason"] for e in gw.gateway.telemetry.events.history()
                       if e.get("source") == "http"]
            assert reasons.count("403 origin_not_allowed") == 3
            assert reasons.count("421 invalid_host") >= 2  # the write, the page (+ favicon)
            # the next client's prompt still goes to the real gpu-a
            answer = httpx.post(f"{gw.url}/v1/chat/completions", timeout=30, json={
                "model": "m", "messages": [{"role": "user", "content": "x"}]})
            assert answer.status_code == 200 and evil.seen == [] and len(real.seen) == 1


def test_every_endpoint_refuses_a_rebound_host_name(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    with gateway(providers_doc(fast, slow)) as gw:
        for method, path in [("GET", "/v1/routing"), ("GET", "/metrics"),
                             ("GET", "/dashboard"), ("GET", "/v1/routing/events"),
                             ("GET", "/v1/nodes"), ("POST", "/v1/nodes"),
                             ("POST", "/v1/cooldowns/clear"), ("POST", "/v1/chat/completions")]:
            resp = httpx.request(method, gw.url + path, json={}, timeout=10,
                                 headers={"host": f"{REBOUND}:{gw.url.rsplit(':', 1)[1]}"})
            assert resp.status_code == 421, (method, path)
            assert resp.json()["error"]["code"] == "invalid_host"
        for host in ("127.0.0.1", "localhost", "LOCALHOST.", "[::1]:9", "a.localhost"):
            assert httpx.get(gw.url + "/healthz", headers={"host": host}).status_code == 200
        assert fast.seen == []
