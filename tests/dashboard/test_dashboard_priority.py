"""The dashboard's chain table under `strategy = "priority"` (issue 24), in headless Chromium
against a real gateway: each route's written position, and no score (a dash, never "null",
"NaN" or "undefined")."""

from __future__ import annotations

import json

import pytest

from ..providers.fake_provider import FakeProvider
from ..providers.gateway import gateway, providers_doc
from .browser import open_page
from .test_dashboard_browser import DEADLINE_S, needs_chromium

pytestmark = pytest.mark.anyio

CELLS = """JSON.stringify([...document.querySelectorAll(
  '#chains [data-model="auto"] tr[data-route]')].map(tr => [tr.dataset.route,
              tr.querySelector('.position').textContent.trim(),
              tr.querySelector('.score').textContent.trim(), tr.textContent]))"""


@needs_chromium
async def test_the_chain_table_shows_positions_and_no_score_under_priority() -> None:
    fast, slow = FakeProvider("fast"), FakeProvider("slow", models=("small-model",))
    with fast.serve(), slow.serve():
        doc = providers_doc(fast, slow, chain=("slowco/small-model", "fastco/big-model"),
                            routing={"strategy": "priority"})
        with gateway(doc) as gw:
            assert gw.chat().headers["x-meshroute-route"] == "slowco/small-model#1"
            async with open_page(gw.url + "/dashboard") as page:
                rows = json.loads(await page.wait_for(CELLS, DEADLINE_S, lambda v: v != "[]"))
                heading = await page.evaluate(
                    "document.querySelector('#chains [data-model=\"auto\"] h3').textContent")
    assert [(r[0], r[1], r[2]) for r in rows] == [("slowco/small-model", "1", "—"),
                                                  ("fastco/big-model", "2", "—")]
    for *_, text in rows:
        assert not any(junk in text for junk in ("null", "NaN", "undefined")), text
    assert "strategy priority (written order)" in heading
