"""The dashboard in a real headless Chromium (DevTools protocol) against a live gateway.

The page holds an EventSource open, so it never finishes loading: these tests drive it over
the DevTools protocol and poll the DOM until a condition holds, with generous deadlines.
"""

from __future__ import annotations

import asyncio
import copy
import importlib.resources
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from node_agent.serving import serve_app

from ..upstream import free_port
from .browser import Page, chromium_binary, open_page
from .mesh import LLAMA, QWEN, LiveMesh, Shard, live_mesh

pytestmark = pytest.mark.anyio
needs_chromium = pytest.mark.skipif(
    chromium_binary() is None,
    reason="chromium is not installed (scripts/ensure-chromium installs it)")
DEADLINE_S = 60.0  # DOM conditions: polls every 4 s, debounced refresh 0.5 s after events
FIXTURE = Path(__file__).parent / "fixtures" / "provider_chain.json"
PAGE = importlib.resources.files("meshroute_middleware") / "static" / "dashboard.html"

ROWS = """JSON.stringify([...document.querySelectorAll('#models tr[data-signature]')]
  .map(tr => [tr.dataset.signature, +tr.querySelector('.samples').textContent]))"""
NODES = """JSON.stringify(Object.fromEntries([...document.querySelectorAll('#nodes [data-node]')]
  .map(n => [n.dataset.node, n.querySelector('.layers i').style.width])))"""
MARKERS = """JSON.stringify([...document.querySelectorAll('svg.chart .marker')]
  .map(g => g.closest('svg').dataset.model + ': ' + g.dataset.label))"""


async def _rows(page: Page) -> dict[str, int]:
    return dict(json.loads(await page.evaluate(ROWS)))


async def _candidates(mesh: LiveMesh) -> list[dict[str, Any]]:
    async with mesh.session.get(mesh.url + "/v1/routing") as resp:
        doc = await resp.json()
    return [row for model in doc["models"].values() for row in model["candidates"]]


async def _gateway_routes(mesh: LiveMesh) -> dict[str, int]:
    return {row["signature"]: row["samples"] for row in await _candidates(mesh)}


# Per row: its estimate and mean cells and its legend entry's bold number.
SHOWN = """JSON.stringify(Object.fromEntries(
  [...document.querySelectorAll('#models tr[data-signature]')].map(tr => [tr.dataset.signature,
   [tr.querySelector('td.estimate').textContent, tr.querySelector('td.mean').textContent,
    document.querySelector(`.legend [data-signature="${CSS.escape(tr.dataset.signature)}"] b`)
      .textContent]])))"""


def _differs(text: str, value: float | None) -> bool:
    """Whether a shown number (one decimal, maybe followed by a gap arrow) is not `value`."""
    if value is None:
        return text.strip() != "—"
    return abs(float(text.split()[0]) - value) > 0.051


def _shown_wrong(row: dict[str, Any], shown: list[str] | None) -> bool:
    """Whether [estimate cell, mean cell, legend] is not what the gateway's row says."""
    estimate, mean = row["estimate_tps"], row["tps"]
    learned = mean if estimate is None else estimate
    return shown is None or any(map(_differs, shown, (estimate, mean, learned)))


async def _shows_the_gateways_speeds(page: Page, mesh: LiveMesh) -> None:
    """Until each row shows the gateway's estimate_tps and tps, its legend the estimate (the
    mean where there is none); AssertionError with what differs after the deadline."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        rows = await _candidates(mesh)
        shown = json.loads(await page.evaluate(SHOWN))
        assert any(r["estimate_tps"] is not None for r in rows)  # thompson keeps estimates
        wrong = [(r["signature"], r["estimate_tps"], r["tps"], shown.get(r["signature"]))
                 for r in rows if _shown_wrong(r, shown.get(r["signature"]))]
        if not wrong:
            return
        assert time.monotonic() < deadline, wrong
        await asyncio.sleep(0.5)


@needs_chromium
async def test_dashboard_lists_the_gateways_routes_and_follows_traffic_and_joins() -> None:
    async with live_mesh(QWEN + LLAMA) as mesh:
        await mesh.traffic(["qwen-demo", "llama-8b"], 30)
        routes = await _gateway_routes(mesh)
        assert len(routes) >= 5 and any(s.startswith("llama-8b|") for s in routes)
        async with open_page(mesh.url + "/dashboard") as page:
            shown = await page.wait_for(ROWS, DEADLINE_S,
                                        lambda v: set(dict(json.loads(v))) == set(routes))
            assert sum(dict(json.loads(shown)).values()) >= 30 - mesh.failed
            await _shows_the_gateways_speeds(page, mesh)

            nodes = json.loads(await page.wait_for(NODES, DEADLINE_S,
                                                   lambda v: len(json.loads(v)) == 7))
            assert nodes["gpu-a"] == "55%"  # layers 0-21 of 40
            assert nodes["cpu-c"] == "50%" and nodes["mini"] == "100%"
            assert await page.evaluate("document.getElementById('providers').hidden") is True
            lines = "document.querySelectorAll('svg.chart[data-model=\"llama-8b\"] path.route')"
            await page.wait_for(lines + ".length", DEADLINE_S)
            assert await page.evaluate("document.querySelectorAll('#wall .ev').length") >= 30

            # refresh: new traffic raises the sample counts shown, without a reload
            before = sum((await _rows(page)).values())
            await mesh.traffic(["qwen-demo", "llama-8b"], 20, seed=2)
            await page.wait_for(ROWS, DEADLINE_S,
                                lambda v: sum(dict(json.loads(v)).values()) >= before + 15)

            # a node joins: its routes, its shard bar and a topology marker appear
            late = Shard("cpu-b", "qwen-demo", 0, 39, 40, 22.0)
            await mesh.start_node(late, seed=9)
            await mesh.register(late)
            await page.wait_for(ROWS, DEADLINE_S,
                                lambda v: "qwen-demo|cpu-b[0-39]" in dict(json.loads(v)))
            nodes = json.loads(await page.wait_for(NODES, DEADLINE_S, lambda v: "cpu-b" in v))
            assert nodes["cpu-b"] == "100%"
            markers = json.loads(await page.wait_for(MARKERS, DEADLINE_S,
                                                     lambda v: "+cpu-b" in v))
            assert any(m.startswith("qwen-demo: ") and "+cpu-b" in m for m in markers)
            assert not any(m.startswith("llama-8b: ") and "cpu-b" in m for m in markers)

            # a node leaves: its routes and its bar go, the chart marks it
            await mesh.remove("gpu-b")
            await page.wait_for(ROWS, DEADLINE_S, lambda v: "gpu-b[" not in v)
            await page.wait_for(NODES, DEADLINE_S, lambda v: "gpu-b" not in v)
            await page.wait_for(MARKERS, DEADLINE_S, lambda v: "−gpu-b" in v)
            assert set(await _rows(page)) == set(await _gateway_routes(mesh))


def _fixture_app(chain_until: float, routing: dict[str, Any] | None = None) -> Starlette:
    """/dashboard and the endpoints it reads, answered from the static JSON fixture (its
    /v1/routing document replaced by `routing` when given)."""
    data: dict[str, Any] = json.loads(FIXTURE.read_text())
    if routing is not None:
        data["routing"] = routing
    chain = copy.deepcopy(data["chain"])
    chain["m"]["chain"][1]["keys"][1]["until"] = chain_until  # a cooldown ending soon

    async def chain_of(request: Request) -> Response:
        model = request.query_params.get("model", "")
        if model not in chain:
            return JSONResponse({"error": {"message": "no", "type": "x", "code": "x"}}, 404)
        return JSONResponse(chain[model])

    async def events(request: Request) -> Response:
        return Response(status_code=204)  # tells an EventSource not to reconnect

    async def dashboard(request: Request) -> Response:
        return HTMLResponse(PAGE.read_text())

    async def routing(request: Request) -> Response:
        return JSONResponse(data["routing"])

    async def nodes(request: Request) -> Response:
        return JSONResponse(data["nodes"])

    return Starlette(routes=[
        Route("/dashboard", dashboard), Route("/v1/routing", routing),
        Route("/v1/nodes", nodes), Route("/v1/routing/chain", chain_of),
        Route("/v1/routing/events", events)])


KEYS = """JSON.stringify([...document.querySelectorAll('#chains tr[data-route]')].map(tr =>
  [tr.dataset.route, [...tr.querySelectorAll('.key')].map(k => [k.dataset.state, k.title,
   k.textContent.trim()])]))"""


@needs_chromium
async def test_provider_panel_renders_chain_keys_and_cooldowns_from_the_endpoint() -> None:
    app = _fixture_app(time.time() + 42.0)
    async with serve_app(app, "127.0.0.1", 0) as url, open_page(url + "/dashboard") as page:
        rows = json.loads(await page.wait_for(KEYS, DEADLINE_S, lambda v: v != "[]"))
        assert await page.evaluate("document.getElementById('providers').hidden") is False
        assert [r[0] for r in rows] == ["m|gpu[0-39]", "provider:groq/llama-3.1-8b"]
        keys = rows[1][1]
        assert [k[0] for k in keys] == ["ready", "cooldown", "limited"]
        assert keys[1][1] == "429 from upstream"
        assert keys[2][1] == "daily token budget spent"
        seconds = int(keys[1][2].split()[-2])
        assert 0 < seconds <= 42  # counts down to `until`
        text = await page.evaluate("document.getElementById('chains').textContent")
        assert "strategy balanced" in text and "rpm 30 · tpm 6000" in text
        # self-contained: everything the page loaded came from the gateway (no CDN, offline)
        assert page.requested and all(u.startswith(url + "/") for u in page.requested)
        assert url + "/v1/routing/chain?model=m" in page.requested


def test_dashboard_page_is_self_contained() -> None:
    """No CDN, fonts or scripts from elsewhere: the page works offline (no browser needed)."""
    html = PAGE.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert "@import" not in html and "url(http" not in html
    assert "<script src" not in html and '<link rel="stylesheet"' not in html


CHAIN_ROWS = """JSON.stringify([...document.querySelectorAll('#chains [data-model]')].map(m =>
  [m.dataset.model, [...m.querySelectorAll('tr[data-route]')].map(tr => [tr.dataset.route,
   [...tr.querySelectorAll('.key')].map(k => k.dataset.state)])]))"""
WALL_LIMITED = """JSON.stringify([...document.querySelectorAll('#wall .m-limited')].map(el =>
  el.parentElement.textContent.replace(/\\s+/g, ' ').trim()))"""


@needs_chromium
async def test_the_demos_provider_chain_shows_its_429_cooldown_and_fallback() -> None:
    """`meshroute demo` running: the panel lists the chain `auto` (the fake provider, then
    the mesh model), its key cooling after the 429, and the call wall shows the 429 as the
    gateway's event stream published it."""
    port = free_port()
    demo = subprocess.Popen(
        [sys.executable, "-m", "meshroute_middleware.app.cli", "demo", "--plain", "--port",
         str(port), "--discovery", "http", "--leave-after", "0", "--join-after", "0",
         "--drift-after", "0", "--clients", "4"], stdout=subprocess.PIPE, text=True)
    try:
        assert demo.stdout is not None
        for line in demo.stdout:
            if "dashboard" in line:
                break
        async with open_page(f"http://127.0.0.1:{port}/dashboard") as page:
            chains = json.loads(await page.wait_for(
                CHAIN_ROWS, DEADLINE_S, lambda v: '"cooldown"' in v))
            limited = json.loads(await page.wait_for(WALL_LIMITED, DEADLINE_S,
                                                     lambda v: v != "[]"))
            # the header counts requests as the terminal does: the 429 failed no request
            header = await page.wait_for(
                "document.getElementById('counters').textContent", DEADLINE_S,
                lambda v: re.search(r"requests [1-9]\d* ok", v))
    finally:
        demo.send_signal(signal.SIGINT)
        out, _ = demo.communicate(timeout=30)
    assert [model for model, _ in chains] == ["auto"]  # a lone mesh model is no chain to show
    routes = dict(chains[0][1])
    assert set(routes) == {"fastco/big-model", "qwen-demo"}
    assert routes["fastco/big-model"] == ["cooldown"] and routes["qwen-demo"] == []
    assert "fastco/big-model#1" in limited[0] and "429 · cools" in limited[0], limited
    assert "summary:" in out and ", 0 failed;" in out  # the 429 reached no client
    assert header.endswith(" ok · 0 failed"), header


def _candidate(node: str, tps: float, estimate: float | None) -> dict[str, Any]:
    """A /v1/routing candidate row of a one-hop route over all 40 layers of model m."""
    row: dict[str, Any] = json.loads(FIXTURE.read_text())["routing"]["models"]["m"]["candidates"][0]
    return {**row, "signature": f"m|{node}[0-39]", "head": node, "tps": tps,
            "estimate_tps": estimate,
            "hops": [{"node_id": node, "start_layer": 0, "end_layer": 39}]}


def _routing(policy: str, candidates: list[dict[str, Any]]) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(FIXTURE.read_text())["routing"]
    doc["config"]["policy"] = policy
    best = max(row["tps"] for row in candidates)
    for row in candidates:  # ADR-0021's coefficient: the mean relative to the best mean
        row["coefficient"] = row["tps"] / best
    doc["models"]["m"]["candidates"] = candidates
    return doc


# Per route as the page shows it: the table's estimate and mean cells (text, and whether each
# is the charted number), the legend's bold number, and the chart line's newest point read
# back through the y axis (its top label and the zero line), independent of how it was drawn.
SPEEDS = r"""JSON.stringify(Object.fromEntries(
  [...document.querySelectorAll('#models tr[data-signature]')].map(tr => {
    const sig = tr.dataset.signature, est = tr.querySelector('td.estimate'),
          mean = tr.querySelector('td.mean');
    const svg = document.querySelector('svg.chart[data-model="m"]');
    const grid = [...svg.querySelectorAll('line.grid')].map(l => +l.getAttribute('y1'));
    const labels = [...svg.querySelectorAll('text')].map(t => t.textContent);
    const top = parseFloat(labels[grid.length - 1]);
    const path = [...svg.querySelectorAll('path.route')].find(p => p.dataset.signature === sig);
    const last = path && path.getAttribute('d').match(/([-\d.]+),([-\d.]+)$/);
    const line = last ? top * (grid[0] - +last[2]) / (grid[0] - grid[grid.length - 1]) : null;
    const legend = [...document.querySelectorAll('.legend [data-signature]')]
      .find(s => s.dataset.signature === sig);
    const text = td => td ? td.textContent.trim() : null,
          charted = td => td ? td.classList.contains('learned') : null;
    return [sig, {estimate: text(est), mean: text(mean), charted: [charted(est), charted(mean)],
                  best: tr.classList.contains('best'),
                  legend: legend ? legend.querySelector('b').textContent : null, line}];
  })))"""

SLOWED, SPED_UP, UNESTIMATED = "m|gpu[0-39]", "m|cpu[0-39]", "m|edge[0-39]"


@needs_chromium
@pytest.mark.parametrize("policy", ["thompson", "adr0021"])
async def test_chart_and_table_show_the_policys_estimate_where_it_has_one(policy: str) -> None:
    """A route that slowed down: the shared decayed mean still says 54.8 tok/s, the policy's
    estimate 33.8 (the demo's measured drift). The chart line and the legend follow the
    estimate, the table shows both; a route without an estimate (thompson before its first
    sample, or any route of a policy that keeps none) shows its mean."""
    estimates = {"thompson": (33.8, 48.0), "adr0021": (None, None)}[policy]
    doc = _routing(policy, [_candidate("gpu", 54.8, estimates[0]),
                            _candidate("cpu", 21.0, estimates[1]),
                            _candidate("edge", 12.5, None)])
    app = _fixture_app(time.time() + 42.0, doc)
    async with serve_app(app, "127.0.0.1", 0) as url, open_page(url + "/dashboard") as page:
        shown = json.loads(await page.wait_for(SPEEDS, DEADLINE_S,
                                               lambda v: len(json.loads(v)) == 3))
        note = await page.evaluate("document.getElementById('chart-note').textContent")
        head = await page.evaluate("[...document.querySelectorAll('#models th')]"
                                   ".map(th => th.textContent).join(' ')")
    want = {SLOWED: (54.8, estimates[0]), SPED_UP: (21.0, estimates[1]), UNESTIMATED: (12.5, None)}
    for sig, (mean, estimate) in want.items():
        row = shown[sig]
        learned = mean if estimate is None else estimate
        assert row["line"] == pytest.approx(learned, rel=0.01), row
        assert row["legend"] == f"{learned:.1f}", row
        assert row["mean"] == f"{mean:.1f}", row
        estimate_text = "—" if estimate is None else f"{estimate:.1f}"
        assert (row["estimate"] or "").split()[:1] == [estimate_text], row
        assert row["charted"] == [estimate is not None, estimate is None], row
    # the route marked best is the one the policy believes fastest, not the best mean
    assert [sig for sig, row in shown.items() if row["best"]] == [
        SPED_UP if policy == "thompson" else SLOWED]
    assert "estimate" in note and "mean" in note
    assert "estimate" in head and "mean" in head
    if policy == "thompson":  # the slowed route's estimate is flagged below its mean
        assert shown[SLOWED]["estimate"].endswith("▼"), shown[SLOWED]
        assert shown[SPED_UP]["estimate"].endswith("▲"), shown[SPED_UP]
