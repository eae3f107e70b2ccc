"""The building blocks together over real HTTP: config → keyring → router → fake providers → store.

A minimal forward loop lives here (the gateway's is the integration step): it shows the blocks
suffice for round-robin keys, cooldown from Retry-After, fail-over, exhaustion with reasons,
restart persistence, and that no key string reaches a response body, the chain view or the
state file.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from meshroute_middleware.chat.keyring import Secret, resolve_keys
from meshroute_middleware.core.providers.config import parse_providers_config
from meshroute_middleware.core.providers.exhaustion import Exhaustion, PassedOver
from meshroute_middleware.core.providers.keys import parse_retry_after
from meshroute_middleware.core.providers.router import ChainAttempt, ProviderRouter
from meshroute_middleware.core.providers.scoring import OutcomeKind, classify_status
from meshroute_middleware.http.errors import exhaustion_answer
from meshroute_middleware.state.store import StateStore

from .fake_provider import FakeProvider, Reply

T0 = 1_796_040_000.0
ENV = {"FAST_A": "sk-fast-AAAA-secret", "FAST_B": "sk-fast-BBBB-secret",
       "SLOW_A": "sk-slow-CCCC-secret"}


@dataclass
class Answer:
    route: str | None
    tried: list[str]
    exhaustion: Exhaustion | None
    body: dict[str, Any]


class MiniGateway:
    """The forward loop in its simplest form, on a fake clock."""

    def __init__(self, fast: FakeProvider, slow: FakeProvider, rpd: int | None = None) -> None:
        doc: dict[str, Any] = {
            "routing": {"chain": ["fastco/big-model", "slowco/small-model"]},
            "providers": [
                {"name": "fastco", "base_url": fast.base_url, "keys": ["env:FAST_A",
                                                                      "env:FAST_B"],
                 "models": [{"id": "big-model", "tier": "large", "context": 4096}]},
                {"name": "slowco", "base_url": slow.base_url, "keys": ["env:SLOW_A"],
                 "models": [{"id": "small-model", "tier": "small", "context": 2048}]}]}
        if rpd is not None:
            doc["providers"][0]["rpd"] = rpd
        self.cfg = parse_providers_config(doc)
        self.secrets: dict[str, tuple[Secret, ...]] = resolve_keys(self.cfg, ENV)
        self.router = ProviderRouter(self.cfg)
        self.rng = random.Random(0)
        self.now = T0

    def ask(self, model: str = "auto", pinned: str | None = None, tokens: int = 50) -> Answer:
        res = self.router.resolve(model, ())
        passed: list[PassedOver] = []
        tried: list[str] = []
        for scored in self.router.rank(res, self.now, self.rng, pinned=pinned, tokens=tokens):
            got = self.router.acquire(scored.candidate, tokens, self.now)
            if isinstance(got, list):
                passed += got
                continue
            tried.append(got.route)
            over, body = self._send(got)
            if over is None:
                return Answer(got.route, tried, None, body)
            passed.append(over)
        ex = self.router.exhausted(res, passed, self.now)
        return Answer(None, tried, ex, json.loads(exhaustion_answer(ex).body()))

    def _send(self, got: ChainAttempt) -> tuple[PassedOver | None, dict[str, Any]]:
        c = got.candidate
        assert c.provider is not None and got.key is not None
        secret = self.secrets[c.provider.name][got.key - 1]
        try:
            resp = httpx.post(f"{c.provider.base_url}/chat/completions", timeout=5,
                              headers={"Authorization": f"Bearer {secret.reveal()}"},
                              json={"model": c.upstream_model, "messages": []})
        except httpx.TransportError:
            return self.router.record(got, OutcomeKind.FAILURE, self.now, reason="connect"), {}
        kind = classify_status(resp.status_code)
        usage = resp.json().get("usage", {}) if resp.status_code == 200 else {}
        over = self.router.record(
            got, kind, self.now, reason="http_5xx" if kind is OutcomeKind.FAILURE else None,
            used_tokens=usage.get("total_tokens"),
            retry_after_s=parse_retry_after(resp.headers.get("retry-after"), self.now))
        return over, resp.json()


def assert_no_key_in(*texts: str) -> None:
    for text in texts:
        for secret in ENV.values():
            assert secret not in text


def test_keys_round_robin_and_the_upstream_gets_its_own_model_id(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    gw = MiniGateway(fast, slow)
    routes = [gw.ask(pinned="fastco/big-model").route for _ in range(4)]
    assert routes == ["fastco/big-model#1", "fastco/big-model#2"] * 2
    assert fast.keys == [ENV["FAST_A"], ENV["FAST_B"]] * 2
    assert {s.model for s in fast.seen} == {"big-model"}


def test_a_429_cools_its_key_from_retry_after_and_the_chain_falls_over(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    fast.by_key[ENV["FAST_A"]] = Reply.rate_limited("20")
    gw = MiniGateway(fast, slow)
    first = gw.ask(pinned="fastco/big-model")
    assert first.tried == ["fastco/big-model#1", "slowco/small-model#1"]
    assert first.route == "slowco/small-model#1"
    view = gw.router.chain_view(gw.router.resolve("fastco/big-model", ()), gw.now)
    assert view["chain"][0]["keys"][0] == {"key": 1, "state": "cooldown", "until": T0 + 20,
                                           "reason": "cooldown", "limits": "local"}
    second = gw.ask(pinned="fastco/big-model")  # key 1 is cooling: key 2 serves
    assert second.route == "fastco/big-model#2"
    gw.now += 21
    fast.by_key.clear()
    assert gw.ask(pinned="fastco/big-model").route == "fastco/big-model#1"
    assert_no_key_in(json.dumps(view), json.dumps(first.body))


def test_exhaustion_lists_every_reason_and_the_soonest_reset(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    fast.default = Reply.rate_limited("40")
    slow.default = Reply.error(502)
    gw = MiniGateway(fast, slow)
    answer = gw.ask(pinned="fastco/big-model")
    assert answer.exhaustion is not None and answer.exhaustion.status == 429
    assert [(r["route"], r["reason"]) for r in answer.body["error"]["routes"]] == [
        ("fastco/big-model#1", "http_429"), ("slowco/small-model#1", "http_5xx")]
    again = gw.ask(pinned="fastco/big-model")  # key 2 now takes its own 429
    assert again.exhaustion is not None
    assert again.exhaustion.headers() == {"Retry-After": "40"}
    assert again.body["error"]["code"] == "rate_limited"
    gw.now += 10
    third = gw.ask()
    assert third.tried == ["slowco/small-model#1"]  # both fastco keys are cooling
    assert third.exhaustion is not None and third.exhaustion.headers() == {"Retry-After": "30"}
    assert_no_key_in(json.dumps(answer.body), json.dumps(again.body), json.dumps(third.body))


def test_too_large_for_every_context_is_413_without_sending(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    answer = MiniGateway(fast, slow).ask(tokens=5000)
    assert answer.exhaustion is not None and answer.exhaustion.status == 413
    assert fast.seen == [] and slow.seen == []


def test_the_daily_quota_survives_a_restart(providers: tuple[FakeProvider, FakeProvider],
                                            tmp_path: Path) -> None:
    fast, slow = providers
    state = tmp_path / "state.db"
    gw = MiniGateway(fast, slow, rpd=1)
    with StateStore(state).open() as store:
        assert [gw.ask(pinned="fastco/big-model").route for _ in range(2)] == [
            "fastco/big-model#1", "fastco/big-model#2"]
        store.save(gw.router.snapshot(gw.now, changed_only=True), gw.now)
    restarted = MiniGateway(fast, slow, rpd=1)
    restarted.now = gw.now + 60
    with StateStore(state).open() as store:
        restarted.router.restore(store.load())
    answer = restarted.ask(model="fastco/big-model")
    assert answer.exhaustion is not None
    assert {r["reason"] for r in answer.body["error"]["routes"]} == {"rpd"}
    assert len(fast.seen) == 2  # nothing was sent after the restart
    assert_no_key_in(state.read_bytes().decode("latin-1"))
