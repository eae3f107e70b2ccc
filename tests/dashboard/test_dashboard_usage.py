"""The dashboard's usage panel in a real headless Chromium, against a live gateway whose
clients spent tokens at a fake provider: per client and route, the ledger's tokens and cost."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from ..conftest import FakeClock
from ..providers.fake_provider import FakeProvider, Reply
from ..providers.test_client_spend import T0, make_client, priced_doc, served
from .browser import chromium_binary, open_page

pytestmark = [pytest.mark.anyio, pytest.mark.skipif(
    chromium_binary() is None,
    reason="chromium is not installed (scripts/ensure-chromium installs it)")]
DEADLINE_S = 60.0
ROWS = """JSON.stringify([...document.querySelectorAll('#usage tbody tr')].map(tr =>
  [tr.className, tr.dataset.client, tr.dataset.route,
   ...['requests', 'prompt', 'completion', 'cost', 'errors'].map(c =>
     tr.querySelector('td.' + c).textContent)]))"""


@pytest.fixture
def fakes() -> Any:
    fast, slow = FakeProvider("fast"), FakeProvider("slow", models=("small-model",))
    with fast.serve(), slow.serve():
        yield fast, slow


async def test_the_usage_panel_shows_each_clients_routes_tokens_and_cost(
        fakes: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = fakes
    fast.default = Reply.ok(tokens=250, prompt_tokens=1000)  # 0.002 + 0.002 USD each
    slow.default = Reply.ok(tokens=4, prompt_tokens=9)
    clients = [make_client("alice"), make_client("bob")]
    with served(priced_doc(fast, slow), clients, FakeClock(T0)) as gw:
        for name, model in [("alice", "fastco/big-model"), ("alice", "fastco/big-model"),
                            ("alice", "slowco/small-model"), ("bob", "fastco/big-model")]:
            assert gw.chat(name, model=model).status_code == 200
        ledger = httpx.get(f"{gw.url}/v1/usage?group_by=client,route").json()["data"]
        async with open_page(gw.url + "/dashboard") as page:
            rows = json.loads(await page.wait_for(ROWS, DEADLINE_S, lambda v: v != "[]"))
            hidden = await page.evaluate("document.getElementById('usage').hidden")
    assert hidden is False
    assert rows == [
        ["route", "alice", "fastco/big-model", "2", "2000", "500", "$0.008000", "0"],
        ["route", "alice", "slowco/small-model", "1", "9", "4", "$0.0000", "0"],
        ["total", "alice", "all routes", "3", "2009", "504", "$0.008000", "0"],
        ["route", "bob", "fastco/big-model", "1", "1000", "250", "$0.004000", "0"],
        ["total", "bob", "all routes", "1", "1000", "250", "$0.004000", "0"]]
    assert [(r["client"], r["route"], r["requests"]) for r in ledger] == [
        ("alice", "fastco/big-model", 2), ("alice", "slowco/small-model", 1),
        ("bob", "fastco/big-model", 1)]


async def test_with_an_admin_token_the_page_sends_its_fragment_token(
        fakes: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = fakes
    with served(priced_doc(fast, slow), [make_client("alice")], FakeClock(T0),
                admin_token="adm-123") as gw:
        assert gw.chat("alice").status_code == 200
        async with open_page(gw.url + "/dashboard") as page:  # no token: no panel
            await page.wait_for("+document.body.dataset.polls >= 1", DEADLINE_S)
            assert await page.evaluate("document.getElementById('usage').hidden") is True
        async with open_page(gw.url + "/dashboard#token=adm-123") as page:
            rows = json.loads(await page.wait_for(ROWS, DEADLINE_S, lambda v: v != "[]"))
        async with open_page(gw.url + "/dashboard#token=wrong") as page:
            note = await page.wait_for(
                "document.getElementById('usage').hidden ? '' : "
                "document.getElementById('usage-table').textContent", DEADLINE_S)
    assert rows[0][:4] == ["route", "alice", "fastco/big-model", "1"]
    assert "not the admin token" in note
