"""The dashboard read as a newcomer reads it, in a real headless Chromium: the routes in the
first paint, the request counts the gateway (and the demo's terminal) keep, numbers under
their headings, an x axis that fits the run, and each learned column explained."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from node_agent.serving import serve_app

from ..upstream import free_port
from .browser import Page, open_page
from .mesh import LLAMA, QWEN, Shard, live_mesh
from .test_dashboard_browser import (
    DEADLINE_S,
    NODES,
    ROWS,
    _fixture_app,
    _gateway_routes,
    needs_chromium,
)

pytestmark = [pytest.mark.anyio, needs_chromium]

POLLS = ["*/v1/routing*", "*/v1/nodes*"]  # the page's polls (and its event stream) fail
# Records every moment a panel shows an empty state ("no models yet", "no nodes yet").
EMPTY_WATCH = """window.__empty = [];
new MutationObserver(() => {
  for (const id of ["models", "charts", "nodes"]) {
    const el = document.getElementById(id);
    if (el && /no (models|nodes) yet/.test(el.textContent)) window.__empty.push(id);
  }
}).observe(document, {subtree: true, childList: true, characterData: true});"""
COUNTERS = """JSON.stringify([
  document.querySelector('#counters .requests').firstChild.textContent.trim(),
  +document.querySelector('#counters b.ok').textContent,
  +document.querySelector('#counters b.failed').textContent])"""


@pytest.mark.parametrize("polls", ["blocked", "allowed"])
async def test_the_first_paint_shows_the_live_routes_and_counts(polls: str) -> None:
    """The page carries the gateway's documents: its routes, nodes and request counts are
    there when the DOM is, before any poll could answer (none can, with the polls blocked)."""
    async with live_mesh(QWEN + LLAMA) as mesh:
        await mesh.traffic(["qwen-demo", "llama-8b"], 12)
        routes = await _gateway_routes(mesh)
        async with open_page(mesh.url + "/dashboard", init_script=EMPTY_WATCH,
                             blocked=POLLS if polls == "blocked" else ()) as page:
            shown = dict(json.loads(await page.evaluate(ROWS)))  # no waiting
            nodes = json.loads(await page.evaluate(NODES))
            counts = json.loads(await page.evaluate(COUNTERS))
            empty = await page.evaluate("window.__empty")
    assert set(shown) == set(routes) and sum(shown.values()) == sum(routes.values())
    assert len(nodes) == 7
    assert counts == ["requests", mesh.ok, mesh.failed] and mesh.ok == 12
    assert empty == []


async def test_before_its_first_document_the_page_says_loading_not_empty() -> None:
    """Served without the documents inside (an older gateway, a proxy) and with the polls
    failing, the panels say "loading…"; once a poll answers they show the routes, and no
    empty state ever showed while there were routes."""
    app = _fixture_app(time.time() + 42.0)
    async with serve_app(app, "127.0.0.1", 0) as url, \
            open_page(url + "/dashboard", blocked=POLLS, init_script=EMPTY_WATCH) as page:
        models = await page.evaluate("document.getElementById('models').textContent.trim()")
        await page.send("Network.setBlockedURLs", urls=[])
        shown = await page.wait_for(ROWS, DEADLINE_S, lambda v: v != "[]")
        empty = await page.evaluate("window.__empty")
    assert models == "loading…"
    assert dict(json.loads(shown)) == {"m|gpu[0-39]": 12}
    assert empty == []


async def test_the_header_counts_requests_as_their_clients_saw_them() -> None:
    """A node that refuses connections makes attempts fail and fall back: the call wall shows
    those failed attempts, the header counts the requests, every one answered (as the demo's
    terminal counts them: by what the client got)."""
    dead = Shard("dead", "qwen-demo", 0, 39, 40, 900.0)  # the best prior: tried first
    async with live_mesh(QWEN) as mesh, open_page(mesh.url + "/dashboard") as page:
        mesh.node_urls["dead"] = f"http://127.0.0.1:{free_port()}"  # nobody listens
        await mesh.register(dead)
        await mesh.traffic(["qwen-demo"], 12)
        assert mesh.ok == 12
        await page.wait_for("document.querySelectorAll('#wall .m-fail').length", DEADLINE_S)
        counts = json.loads(await page.wait_for(
            COUNTERS, DEADLINE_S, lambda v: json.loads(v)[1] == mesh.ok))
    assert counts == ["requests", 12, 0]


# Per table column: heading text, its text-align and its first cell's, and the horizontal
# extent of the heading's text and of the cell's content.
COLUMNS = """JSON.stringify([...document.querySelectorAll('#models table, #chains table')]
 .flatMap(t => {
  const extent = el => { const r = document.createRange(); r.selectNodeContents(el);
                         const b = r.getBoundingClientRect(); return [b.left, b.right]; };
  const first = t.querySelector('tbody tr'), ltr = {start: "left", end: "right"};
  const align = el => ltr[getComputedStyle(el).textAlign] || getComputedStyle(el).textAlign;
  return [...t.querySelectorAll('thead th')].map((th, i) => [th.textContent,
    align(th), align(first.children[i]),
    extent(th), extent(first.children[i])]);
}))"""


async def _fixture_page_ready(page: Page) -> None:
    await page.wait_for("document.querySelectorAll('#chains tr[data-route]').length "
                        "&& document.querySelectorAll('#models tr[data-signature]').length",
                        DEADLINE_S)


async def test_every_number_sits_under_its_heading() -> None:
    app = _fixture_app(time.time() + 42.0)
    async with serve_app(app, "127.0.0.1", 0) as url, open_page(url + "/dashboard") as page:
        await _fixture_page_ready(page)
        columns = json.loads(await page.evaluate(COLUMNS))
    headings = [c[0] for c in columns]
    assert {"coef.", "weight", "score", "reliability", "rate limit"} <= set(headings)
    for heading, th_align, td_align, (th_left, th_right), (td_left, td_right) in columns:
        assert th_align == td_align, heading
        if td_align == "right":  # a number's right edge is its heading's right edge
            assert abs(th_right - td_right) <= 2, (heading, th_right, td_right)
        else:
            assert abs(th_left - td_left) <= 2, (heading, th_left, td_left)
    numbers = [c for c in columns if c[0] in {"samples", "weight", "score", "headroom"}]
    assert all(c[2] == "right" for c in numbers)


# The chart of model m: its plot area (the grid lines' ends), its route line's first and last
# x, and its x-axis ticks (seconds before now) with the note above the charts.
AXIS = """JSON.stringify((() => {
  const svg = document.querySelector('svg.chart[data-model="m"]');
  const grid = svg.querySelector('line.grid');
  const xs = [...svg.querySelector('path.route').getAttribute('d').matchAll(/[ML]([-\\d.]+),/g)]
    .map(m => +m[1]);
  return {plot: [+grid.getAttribute('x1'), +grid.getAttribute('x2')],
          line: [xs[0], xs[xs.length - 1]],
          ticks: [...svg.querySelectorAll('text.tick')].map(t => +t.dataset.s),
          note: document.getElementById('chart-note').textContent};
})())"""


async def _axis(page: Page, run_s: float | None = None) -> dict[str, Any]:
    """The axis now or, with `run_s`, as it is drawn once the page saw data `run_s` ago."""
    if run_s is not None:
        await page.evaluate(f"state.firstT = nowS() - {run_s}; renderAll(); 0")
    return dict(json.loads(await page.evaluate(AXIS)))


async def test_the_x_axis_fits_the_run_and_grows_to_three_minutes() -> None:
    app = _fixture_app(time.time() + 42.0)
    async with serve_app(app, "127.0.0.1", 0) as url, open_page(url + "/dashboard") as page:
        await page.wait_for("document.body.dataset.polls >= 2", DEADLINE_S)  # a few seconds
        early = await _axis(page)
        two_minutes, long_run = await _axis(page, 100), await _axis(page, 1000)
    (left, right), (first, last) = early["plot"], early["line"]
    assert (last - first) / (right - left) >= 0.6, early  # not squeezed to one side
    assert max(early["ticks"]) < 60, early
    assert max(two_minutes["ticks"]) == 120 and "last 2 min" in two_minutes["note"]
    assert max(long_run["ticks"]) == 180 and "last 3 min" in long_run["note"]


LEARNED = ["estimate", "mean", "prior", "coef.", "share", "samples", "weight"]
TITLES = """JSON.stringify(Object.fromEntries([...document.querySelectorAll('#models th')]
  .map(th => [th.textContent, th.title])))"""


async def test_each_learned_column_and_the_epoch_is_explained() -> None:
    app = _fixture_app(time.time() + 42.0)
    async with serve_app(app, "127.0.0.1", 0) as url, open_page(url + "/dashboard") as page:
        await _fixture_page_ready(page)
        titles = json.loads(await page.evaluate(TITLES))
        epoch = await page.evaluate("document.querySelector('#models .epoch').title")
        help_line = await page.evaluate(
            "(h => h.hidden ? null : h.textContent)(document.getElementById('columns-help'))")
    explained = {name: titles.get(name, "") for name in LEARNED}
    assert all(len(text) > 20 for text in explained.values()), explained
    assert len(set(explained.values())) == len(LEARNED)  # each its own explanation
    assert "topology" in epoch
    assert help_line is not None
    for name in ("prior", "coef.", "weight", "epoch"):
        assert name in help_line
