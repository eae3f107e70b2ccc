"""The dashboard's first paint embeds the provider chains and the usage ledger as it embeds
the routes (issue 33: their panels appeared ~8 s after the page), and the page takes them in
before its first poll."""

from __future__ import annotations

import json
import re
import threading
from typing import Any

import anyio
import httpx
import pytest
from starlette.types import ASGIApp, Receive, Scope, Send

from ..conftest import FakeClock
from ..providers.fake_provider import FakeProvider
from ..providers.test_client_spend import T0, as_client, make_client, priced_doc, served
from ..upstream import ServerThread
from .browser import chromium_binary, open_page

DEADLINE_S = 60.0

SNAPSHOT = re.compile(r'<script id="snapshot" type="application/json">(.*?)</script>', re.S)


def _snapshot(url: str, **headers: str) -> Any:
    page = httpx.get(f"{url}/dashboard", headers=headers, timeout=30).text
    found = SNAPSHOT.search(page)
    assert found is not None, page[:200]
    return json.loads(found.group(1))


@pytest.fixture
def fakes() -> Any:
    fast, slow = FakeProvider("fast"), FakeProvider("slow", models=("small-model",))
    with fast.serve(), slow.serve():
        yield fast, slow


def test_the_page_holds_the_chains_and_the_usage_it_would_fetch(
        fakes: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = fakes
    with served(priced_doc(fast, slow), [make_client("alice")], FakeClock(T0)) as gw:
        assert gw.chat("alice").status_code == 200
        assert gw.chat("alice", model="slowco/small-model").status_code == 200
        doc = _snapshot(gw.url)
        chain = httpx.get(f"{gw.url}/v1/routing/chain", params={"model": "auto"}).json()
        usage = httpx.get(f"{gw.url}/v1/usage?group_by=client,route").json()["data"]
    assert set(doc) == {"routing", "nodes", "chains", "usage"}
    assert list(doc["chains"]) == ["auto"]  # no profile, no mesh model
    assert doc["chains"]["auto"] == chain
    assert [r["route"] for r in doc["chains"]["auto"]["chain"]] == ["fastco/big-model",
                                                                   "slowco/small-model"]
    assert doc["usage"] == usage and len(usage) == 2


def test_usage_stays_out_of_the_page_when_an_admin_token_guards_it(
        fakes: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = fakes
    with served(priced_doc(fast, slow), [make_client("alice")], FakeClock(T0),
                admin_token="admin-secret-token") as gw:
        assert gw.chat("alice").status_code == 200
        doc = _snapshot(gw.url)
    assert "usage" not in doc and "auto" in doc["chains"]


@pytest.mark.parametrize("headers", [{}, {"authorization": "Bearer key-alice"},
                                     {"x-api-key": "not-a-key"}])
def test_the_page_holds_the_usage_just_when_v1_usage_shows_it_for_the_same_request(
        fakes: tuple[FakeProvider, FakeProvider], headers: dict[str, str]) -> None:
    """One rule for both (`UsageAPI.open_to`): a page asked for with a key gets no ledger of
    every client's, as `/v1/usage` with that key shows none."""
    fast, slow = fakes
    with served(priced_doc(fast, slow), [make_client("alice")], FakeClock(T0)) as gw:
        assert gw.chat("alice").status_code == 200
        doc = _snapshot(gw.url, **headers)
        usage = httpx.get(f"{gw.url}/v1/usage?group_by=client,route", headers=headers)
    if headers:  # no client of this gateway's: /v1/usage refuses it, the page holds none
        assert usage.status_code == 401 and "usage" not in doc, doc.get("usage")
    else:
        assert doc["usage"] == usage.json()["data"] and doc["usage"]


class Stalled:
    """The gateway with its polled documents held back (until the test ends): what the page
    shows then, it had from its first paint."""

    def __init__(self, app: ASGIApp) -> None:
        self.app, self.release = app, threading.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in POLLED:
            while not self.release.is_set():
                await anyio.sleep(0.05)
        await self.app(scope, receive, send)


POLLED = frozenset({"/v1/routing", "/v1/nodes", "/v1/routing/chain", "/v1/usage",
                    "/v1/models"})
USAGE_ROWS = "document.querySelectorAll('#usage tbody tr').length"
CHAIN_ROWS = "document.querySelectorAll('#chains [data-model=\"auto\"] tr[data-route]').length"


@pytest.mark.anyio
@pytest.mark.skipif(chromium_binary() is None, reason="chromium is not installed")
async def test_chromium_paints_the_chain_and_usage_panels_before_any_poll_answers(
        fakes: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = fakes
    with served(priced_doc(fast, slow), [make_client("alice")], FakeClock(T0)) as gw:
        assert gw.chat("alice").status_code == 200
        stalled = Stalled(as_client(gw.gateway.app, {}))
        try:
            with ServerThread(stalled) as server:
                async with open_page(server.url + "/dashboard") as page:
                    chains = await page.wait_for(CHAIN_ROWS, DEADLINE_S)
                    usage = await page.wait_for(USAGE_ROWS, DEADLINE_S)
                    polls = await page.evaluate("document.body.dataset.polls || '0'")
                    stalled.release.set()
        finally:
            stalled.release.set()
    assert polls == "0"  # no poll had answered: the panels came with the page
    assert chains == 2 and usage == 2  # alice's route and her total
