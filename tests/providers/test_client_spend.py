"""Clients' limits, budgets and usage through a real gateway on a loopback port (issue 24).

Authentication is branch "clients"' part: here a test-only ASGI wrapper (`as_client`) puts
the Client record where an authenticated request carries it (scope["state"][CLIENT_STATE]),
chosen by a test header, so limits, budgets and the ledger are tested on their own.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from starlette.types import ASGIApp, Receive, Scope, Send

from meshroute_middleware.app.config import GatewayConfig
from meshroute_middleware.app.gateway import build_gateway
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.core import RouterConfig
from meshroute_middleware.core.clients import CLIENT_STATE, Client
from meshroute_middleware.core.providers.config import parse_providers_config

from ..conftest import FakeClock
from ..upstream import ServerThread
from .fake_provider import FakeProvider, Reply
from .gateway import ENV, HI, providers_doc

NO_CACHE = {"cached_tokens": 0, "cache_write_tokens": 0}  # nothing cached (issue 35)

T0 = 1_796_040_000.0  # 2026-11-30 06:40 UTC
MIDNIGHT = 1_796_083_200.0  # 2026-12-01 00:00 UTC
NEXT_MONTH = MIDNIGHT  # the same instant: December starts at it
PRICE_IN, PRICE_OUT = 2.0, 8.0  # fastco/big-model, USD per million tokens
H_TEST_CLIENT = b"x-test-client"


def make_client(name: str, **limits: Any) -> Client:
    return Client(name, hashlib.sha256(f"key-{name}".encode()).digest(), **limits)


def as_client(app: ASGIApp, clients: dict[str, Client]) -> ASGIApp:
    """Test only: what branch "clients"' authentication does (the client named by the test
    header, or whose key digest the bearer key has), without its refusals."""
    by_digest = {c.key_digest: c for c in clients.values()}

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            name = headers.get(H_TEST_CLIENT)
            auth = headers.get(b"authorization", b"")
            found = clients[name.decode()] if name is not None else by_digest.get(
                hashlib.sha256(auth[7:]).digest()) if auth[:7].lower() == b"bearer " else None
            if found is not None:
                scope.setdefault("state", {})[CLIENT_STATE] = found
        await app(scope, receive, send)
    return wrapped


def priced_doc(fast: FakeProvider, slow: FakeProvider) -> dict[str, Any]:
    doc = providers_doc(fast, slow)
    doc["providers"][0]["models"][0].update(price_in=PRICE_IN, price_out=PRICE_OUT)
    return doc


class Served:
    def __init__(self, url: str, gateway: Any) -> None:
        self.url, self.gateway = url, gateway

    def chat(self, client: str | None, model: str = "fastco/big-model",
             **body: Any) -> httpx.Response:
        headers = {} if client is None else {H_TEST_CLIENT.decode(): client}
        return httpx.post(f"{self.url}/v1/chat/completions", headers=headers, timeout=30,
                          json={"model": model, "messages": HI, **body})

    def usage(self, **params: str) -> list[dict[str, Any]]:
        resp = httpx.get(f"{self.url}/v1/usage", params=params, timeout=10)
        assert resp.status_code == 200, resp.text
        rows: list[dict[str, Any]] = resp.json()["data"]
        return rows


@contextmanager
def served(doc: dict[str, Any], clients: list[Client], clock: FakeClock,
           **settings: Any) -> Iterator[Served]:
    base = ServeSettings(mdns=False, seed=3, router=RouterConfig(explore_share=0.0),
                         first_byte_timeout_s=2.0, connect_timeout_s=1.0,
                         state_file=":memory:", providers=parse_providers_config(doc))
    gw = build_gateway(GatewayConfig.build(replace(base, **settings), ENV), clock=clock)
    try:
        with ServerThread(as_client(gw.app, {c.name: c for c in clients})) as server:
            yield Served(server.url, gw)
    finally:
        if gw.store is not None:
            gw.store.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


def test_rpm_answers_429_client_rate_limited_with_retry_after_and_sends_nothing(
        providers: tuple[FakeProvider, FakeProvider], clock: FakeClock) -> None:
    fast, slow = providers
    with served(priced_doc(fast, slow), [make_client("alice", rpm=2)], clock) as gw:
        assert [gw.chat("alice").status_code for _ in range(2)] == [200, 200]
        refused = gw.chat("alice")
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "client_rate_limited"
        assert refused.json()["error"]["type"] == "rate_limit_error"
        assert refused.headers["retry-after"] == "61"  # the first request leaves the minute
        assert len(fast.seen) + len(slow.seen) == 2
        assert gw.chat(None).status_code == 200  # no client: not this client's limit
        clock.advance(61)
        assert gw.chat("alice").status_code == 200


def test_tpm_counts_true_usage(providers: tuple[FakeProvider, FakeProvider],
                               clock: FakeClock) -> None:
    fast, slow = providers
    fast.default = Reply.ok(tokens=8, prompt_tokens=5)  # 13 tokens an answer
    # the estimate: "hi" is 5 prompt tokens + max_tokens 10 = 15 reserved; 40 a minute
    with served(priced_doc(fast, slow), [make_client("alice", tpm=40)], clock) as gw:
        codes = [gw.chat("alice", max_tokens=10).status_code for _ in range(4)]
        assert codes == [200, 200, 429, 429]  # 26 used + 15 > 40
        assert gw.chat("alice", max_tokens=10).json()["error"]["code"] == "client_rate_limited"


def test_daily_tokens_answer_budget_exceeded_until_utc_midnight(
        providers: tuple[FakeProvider, FakeProvider], clock: FakeClock) -> None:
    fast, slow = providers
    fast.default = Reply.ok(tokens=8, prompt_tokens=5)
    with served(priced_doc(fast, slow), [make_client("alice", daily_tokens=30)], clock) as gw:
        assert [gw.chat("alice", max_tokens=1).status_code for _ in range(2)] == [200, 200]
        refused = gw.chat("alice", max_tokens=1)  # 26 used + 6 reserved > 30
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "budget_exceeded"
        assert int(refused.headers["retry-after"]) == math.ceil(MIDNIGHT - T0)
        assert len(fast.seen) == 2
        clock.now = MIDNIGHT
        assert gw.chat("alice", max_tokens=1).status_code == 200


def test_monthly_usd_is_priced_from_the_provider_models_prices(
        providers: tuple[FakeProvider, FakeProvider], clock: FakeClock) -> None:
    fast, slow = providers
    fast.default = Reply.ok(tokens=1000, prompt_tokens=500_000)  # 1.0 + 0.008 USD
    with served(priced_doc(fast, slow), [make_client("alice", monthly_usd=1.5)], clock) as gw:
        assert gw.chat("alice").status_code == 200  # 1.008 spent: under 1.5
        assert gw.chat("alice").status_code == 200  # 2.016: over, once spent
        refused = gw.chat("alice")
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "budget_exceeded"
        assert int(refused.headers["retry-after"]) == math.ceil(NEXT_MONTH - T0)
        slow_only = gw.chat("alice", model="slowco/small-model")  # the budget is the client's
        assert slow_only.status_code == 429
        assert len(fast.seen) == 2 and slow.seen == []


def test_usage_totals_match_what_the_provider_saw(
        providers: tuple[FakeProvider, FakeProvider], clock: FakeClock) -> None:
    fast, slow = providers
    fast.push(Reply.ok(tokens=3, prompt_tokens=11), Reply.ok(tokens=5, prompt_tokens=13),
              Reply.ok(tokens=7, prompt_tokens=17, usage=False))
    slow.push(Reply.ok(tokens=4, prompt_tokens=9))
    alice, bob = make_client("alice"), make_client("bob")
    with served(priced_doc(fast, slow), [alice, bob], clock) as gw:
        assert gw.chat("alice").status_code == 200  # JSON, usage 11 + 3
        assert gw.chat("alice", stream=True).status_code == 200  # SSE, usage 13 + 5
        # no usage sent: the prompt is the estimate (5 for "hi"), the chunks counted (7)
        assert gw.chat("bob", stream=True).status_code == 200
        other = gw.chat("bob", model="slowco/small-model")
        assert other.status_code == 200
        assert other.headers["x-meshroute-route"] == "slowco/small-model#1"
        assert gw.chat(None).status_code == 200  # no client: not in the ledger
        rows = gw.usage(group_by="client,route")
        by_route = gw.usage(group_by="route")
    assert len(fast.seen) == 4 and len(slow.seen) == 1
    cost = (11 + 13) * PRICE_IN / 1e6 + (3 + 5) * PRICE_OUT / 1e6
    bob_cost = 5 * PRICE_IN / 1e6 + 7 * PRICE_OUT / 1e6
    assert rows == [
        {"client": "alice", "route": "fastco/big-model", "requests": 2, "prompt_tokens": 24,
         "completion_tokens": 8, "cost_usd": pytest.approx(cost), "errors": 0, **NO_CACHE},
        {"client": "bob", "route": "fastco/big-model", "requests": 1, "prompt_tokens": 5,
         "completion_tokens": 7, "cost_usd": pytest.approx(bob_cost), "errors": 0, **NO_CACHE},
        {"client": "bob", "route": "slowco/small-model", "requests": 1, "prompt_tokens": 9,
         "completion_tokens": 4, "cost_usd": 0.0, "errors": 0, **NO_CACHE}]
    assert [(r["route"], r["requests"]) for r in by_route] == [("fastco/big-model", 3),
                                                               ("slowco/small-model", 1)]


def test_a_request_no_route_answered_is_an_error_of_route_none(
        providers: tuple[FakeProvider, FakeProvider], clock: FakeClock) -> None:
    fast, slow = providers
    fast.default = slow.default = Reply.error(500)
    with served(priced_doc(fast, slow), [make_client("alice")], clock) as gw:
        assert gw.chat("alice", model="auto").status_code != 200  # both routes tried, 500
        rows = gw.usage(group_by="client,route")
    assert rows == [{"client": "alice", "route": "none", "requests": 1, "prompt_tokens": 0,
                     "completion_tokens": 0, "cost_usd": 0.0, "errors": 1, **NO_CACHE}]


def test_the_client_metrics(providers: tuple[FakeProvider, FakeProvider],
                            clock: FakeClock) -> None:
    fast, slow = providers
    fast.default = Reply.ok(tokens=8, prompt_tokens=1_000_000)  # 2 USD + 64e-6
    with served(priced_doc(fast, slow), [make_client("alice", rpm=2)], clock) as gw:
        for _ in range(3):
            gw.chat("alice")
        text = httpx.get(f"{gw.url}/metrics", timeout=10).text
    assert ('meshroute_client_requests_total{client="alice",route="fastco/big-model",'
            'status="200"} 2.0') in text
    assert 'meshroute_client_requests_total{client="alice",route="none",status="429"} 1.0' \
        in text
    assert ('meshroute_client_tokens_total{client="alice",kind="prompt",'
            'route="fastco/big-model"} 2e+06') in text
    assert ('meshroute_client_tokens_total{client="alice",kind="completion",'
            'route="fastco/big-model"} 16.0') in text
    assert 'meshroute_client_cost_usd_total{client="alice"} 4.000128' in text


def test_budgets_and_usage_survive_a_restart(providers: tuple[FakeProvider, FakeProvider],
                                             clock: FakeClock, tmp_path: Path) -> None:
    fast, slow = providers
    fast.default = Reply.ok(tokens=8, prompt_tokens=5)
    alice = make_client("alice", daily_tokens=30)
    state = str(tmp_path / "state.db")
    with served(priced_doc(fast, slow), [alice], clock, state_file=state) as gw:
        assert [gw.chat("alice", max_tokens=1).status_code for _ in range(2)] == [200, 200]
    with served(priced_doc(fast, slow), [alice], clock, state_file=state) as gw:
        refused = gw.chat("alice", max_tokens=1)
        assert refused.json()["error"]["code"] == "budget_exceeded"
        rows = gw.usage()
    assert rows[0]["requests"] == 2 and rows[0]["prompt_tokens"] == 10
    assert rows[0]["completion_tokens"] == 16
    assert rows[0]["cost_usd"] == pytest.approx((10 * PRICE_IN + 16 * PRICE_OUT) / 1e6)
    assert len(fast.seen) == 2


def test_the_official_openai_client_sees_both_429s_with_their_codes(
        providers: tuple[FakeProvider, FakeProvider], clock: FakeClock) -> None:
    fast, slow = providers
    fast.default = Reply.ok(tokens=8, prompt_tokens=5)
    clients = [make_client("alice", rpm=1), make_client("bob", daily_tokens=15)]
    with served(priced_doc(fast, slow), clients, clock) as gw:
        codes = {}
        for name in ("alice", "bob"):
            client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=f"key-{name}",
                                   max_retries=0)
            client.chat.completions.create(model="fastco/big-model", messages=HI,  # type: ignore[arg-type]
                                           max_tokens=1)
            with pytest.raises(openai.RateLimitError) as caught:
                client.chat.completions.create(model="fastco/big-model",
                                               messages=HI, max_tokens=1)  # type: ignore[arg-type]
            codes[name] = (caught.value.code, caught.value.response.headers["retry-after"])
            client.close()
    assert codes == {"alice": ("client_rate_limited", "61"),
                     "bob": ("budget_exceeded", str(math.ceil(MIDNIGHT - T0)))}
    assert len(fast.seen) == 2


def test_a_chain_request_estimates_its_tokens_once_with_a_client_or_without(
        providers: tuple[FakeProvider, FakeProvider], clock: FakeClock,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from meshroute_middleware.chat.providers import chain
    from meshroute_middleware.core.providers import tokens
    from meshroute_middleware.http import request
    calls: list[int] = []

    def counted(payload: dict[str, Any]) -> tokens.TokenEstimate:
        calls.append(1)
        return tokens.estimate(payload)
    monkeypatch.setattr(chain, "estimate", counted)
    monkeypatch.setattr(request, "estimate", counted)
    fast, slow = providers
    with served(priced_doc(fast, slow), [make_client("alice", rpm=10)], clock) as gw:
        assert gw.chat("alice").status_code == 200
        assert len(calls) == 1  # intake's, read by the admission and by the chain
        assert gw.chat(None).status_code == 200
        assert len(calls) == 2  # no client: intake skips it, the chain counts it
