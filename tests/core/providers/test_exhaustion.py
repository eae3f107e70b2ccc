"""Exhaustion: the status rule, Retry-After from the soonest reset, the reasons route by route."""

from __future__ import annotations

import json
import random
from typing import Any, get_args

import pytest

from meshroute_middleware.core.kinds import ErrorKind
from meshroute_middleware.core.providers.chain import Resolution
from meshroute_middleware.core.providers.config import ProvidersConfig, parse_providers_config
from meshroute_middleware.core.providers.exhaustion import (
    LIMITED,
    REASONS,
    UPSTREAM,
    Exhaustion,
    PassedOver,
    attempt_reason,
    exhaustion,
    exhaustion_status,
    soonest_reset,
)
from meshroute_middleware.core.providers.router import ChainAttempt, ProviderRouter
from meshroute_middleware.core.providers.scoring import OutcomeKind
from meshroute_middleware.http.errors import exhaustion_answer

from .conftest import MESH, T0


def run(router: ProviderRouter, model: str, tokens: int, now: float,
        answer: dict[str, tuple[OutcomeKind, str | None]]) -> tuple[str | None, Exhaustion | None,
                                                                     list[str]]:
    """The adapter's forward loop in miniature: `answer[route]` is what each route does."""
    res = router.resolve(model, MESH)
    passed: list[PassedOver] = []
    tried: list[str] = []
    for scored in router.rank(res, now, random.Random(0), tokens=tokens):
        got = router.acquire(scored.candidate, tokens, now)
        if isinstance(got, list):
            passed += got
            continue
        tried.append(got.route)
        kind, reason = answer.get(scored.candidate.route, (OutcomeKind.SUCCESS, None))
        over = router.record(got, kind, now, reason=reason, retry_after_s=None)
        if over is None:
            return got.route, None, tried
        passed.append(over)
    return None, router.exhausted(res, passed, now), tried


def error_of(ex: Exhaustion) -> dict[str, Any]:
    """The client's error object for `ex` (http/errors.py's table gives its code)."""
    error: dict[str, Any] = json.loads(exhaustion_answer(ex).body())["error"]
    return error


def test_every_reason_is_known() -> None:
    assert set(REASONS) == {"cooldown", "rpm", "rpd", "tpm", "tpd", "budget", "revoked",
                            "http_429", "http_5xx", "timeout", "connect", "context", "http_401",
                            "http_403", "capability", "upstream_invalid", "stream",
                            "redirect", "app_error"}
    with pytest.raises(ValueError):
        PassedOver("x", "broken")


@pytest.mark.parametrize(("status", "error", "reason"), [
    (429, None, "http_429"), (500, None, "http_5xx"), (503, None, "http_5xx"),
    (401, None, "http_401"), (403, None, "http_403"),
    (None, "timeout", "timeout"), (None, "connect", "connect"), (None, "context", "context")])
def test_attempt_reason(status: int | None, error: str | None, reason: str) -> None:
    assert attempt_reason(status, error) == reason


def test_a_client_status_is_no_route_failure() -> None:
    with pytest.raises(ValueError):
        attempt_reason(400)


def test_a_mesh_route_fails_over_to_a_provider_and_back(cfg: ProvidersConfig) -> None:
    router = ProviderRouter(cfg)
    pin = "qwen"
    res = router.resolve("auto:mesh-first", MESH)
    served, ex, tried = None, None, []
    for scored in router.rank(res, T0, pinned=pin):
        got = router.acquire(scored.candidate, 10, T0)
        assert isinstance(got, ChainAttempt)
        tried.append(got.route)
        over = (router.record(got, OutcomeKind.FAILURE, T0, reason="connect")
                if got.key is None else router.record(got, OutcomeKind.SUCCESS, T0))
        if over is None:
            served = got.route
            break
    assert (served, tried) == ("fastco/big-model#1", ["qwen", "fastco/big-model#1"])
    assert ex is None
    # qwen recovers: it is tried first again and serves.
    assert run(router, "qwen", 10, T0 + 1, {})[0] == "qwen"


def test_all_provider_routes_failing_upstream_is_502_upstream_failed(
        cfg: ProvidersConfig) -> None:
    router = ProviderRouter(cfg)
    answer = {"slowco/small-model": (OutcomeKind.FAILURE, "http_5xx"),
              "fastco/big-model": (OutcomeKind.FAILURE, "timeout")}
    served, ex, tried = run(router, "auto", 10, T0, answer)
    assert served is None and ex is not None
    assert ex.status == 502  # issue 24: was 429 rate_limit_error, whatever the failures
    assert ex.retry_after_s is None  # nothing said when to come back
    assert [r.route for r in ex.routes] == tried  # in the order they were tried
    assert sorted(r.to_dict().items() for r in ex.routes) == sorted([
        {"route": "fastco/big-model#1", "reason": "timeout", "until": None}.items(),
        {"route": "slowco/small-model#1", "reason": "http_5xx", "until": None}.items()])
    body = error_of(ex)
    assert body["code"] == "upstream_failed" and body["type"] == "server_error"
    assert "failed upstream (http_5xx, timeout)" in body["message"]
    assert ex.headers() == {}


@pytest.mark.parametrize(("reasons", "status"), [
    (["http_5xx"], 502), (["timeout", "connect"], 502), (["stream"], 502),
    (["http_401", "http_401"], 502), (["revoked", "revoked"], 502), (["http_403"], 502),
    (["redirect"], 502), (["app_error"], 502), (["http_5xx", "context"], 502),
    (["http_429"], 429), (["http_5xx", "http_429"], 429), (["revoked", "cooldown"], 429),
    (["budget", "http_5xx"], 429), (["rpm"], 429), (["tpd", "revoked", "timeout"], 429),
    (["context", "cooldown"], 429), ([], 503), (["context"], 503), (["client_error"], 503),
    (["capability", "http_5xx"], 502), (["capability"], 503)])
def test_the_one_status_rule(reasons: list[str], status: int) -> None:
    assert exhaustion_status(reasons) == status


def test_every_reason_and_error_kind_has_a_cause() -> None:
    """A new pass-over reason or error kind must be placed: limited, upstream, or neither."""
    known = set(REASONS) | set(get_args(ErrorKind))
    assert LIMITED | UPSTREAM | {"context", "client_error", "capability"} == known
    assert not LIMITED & UPSTREAM


def test_every_key_refused_says_so(cfg: ProvidersConfig) -> None:
    res = ProviderRouter(cfg).resolve("fastco/big-model", MESH)
    for reason in ("http_401", "revoked"):
        ex = exhaustion(res, [PassedOver("fastco/big-model#1", reason),
                              PassedOver("fastco/big-model#2", reason)], T0)
        assert ex.status == 502
        assert "refused every key" in ex.message and ex.retry_after_s is None


def test_a_limit_beside_a_failure_is_429_with_the_limits_reset(cfg: ProvidersConfig) -> None:
    res = ProviderRouter(cfg).resolve("auto", MESH)
    ex = exhaustion(res, [PassedOver("fastco/big-model#1", "http_5xx"),
                          PassedOver("slowco/small-model#1", "http_429", T0 + 7.5)], T0)
    assert (ex.status, ex.retry_after_s) == (429, 8)
    assert error_of(ex)["type"] == "rate_limit_error"


def test_retry_after_is_the_soonest_known_reset(cfg: ProvidersConfig) -> None:
    router = ProviderRouter(cfg)
    router.gates.rate_limited("fastco/big-model", 1, 90.5, T0)
    router.gates.rate_limited("fastco/big-model", 2, 30.2, T0)
    router.gates.rate_limited("slowco/small-model", 1, 600.0, T0)
    _, ex, tried = run(router, "auto", 10, T0, {})
    assert ex is not None and tried == []
    assert ex.status == 429 and ex.retry_after_s == 31  # whole seconds, rounded up
    assert ex.headers() == {"Retry-After": "31"}
    assert {(r.route, r.reason) for r in ex.routes} == {
        ("fastco/big-model#1", "cooldown"), ("fastco/big-model#2", "cooldown"),
        ("slowco/small-model#1", "cooldown")}
    assert soonest_reset(ex.routes, T0) == T0 + 30.2


def test_a_429_from_upstream_reports_its_cooldown(cfg: ProvidersConfig) -> None:
    router = ProviderRouter(cfg)
    _, ex, _ = run(router, "slowco/small-model", 10, T0,
                   {"slowco/small-model": (OutcomeKind.RATE_LIMITED, None)})
    assert ex is not None and ex.status == 429
    assert [(r.reason, r.until) for r in ex.routes] == [("http_429", T0 + 30.0)]
    assert ex.retry_after_s == 30


def test_larger_than_every_context_is_413(cfg: ProvidersConfig) -> None:
    router = ProviderRouter(cfg)
    _, ex, tried = run(router, "auto", 40_000, T0, {})
    assert ex is not None and ex.status == 413 and tried == []
    assert error_of(ex)["type"] == "invalid_request_error"
    assert {r.reason for r in ex.routes} == {"context"}


def test_larger_than_one_context_falls_over_to_the_bigger_one(cfg: ProvidersConfig) -> None:
    served, ex, _ = run(ProviderRouter(cfg), "auto", 10_000, T0, {})
    assert ex is None and served is not None and served.startswith("fastco/big-model#")


def test_a_mesh_route_has_no_context_so_no_413(cfg: ProvidersConfig) -> None:
    router = ProviderRouter(cfg)
    _, ex, _ = run(router, "auto:mesh-first", 40_000, T0,
                   {"qwen": (OutcomeKind.FAILURE, "connect")})
    assert ex is not None and ex.status == 502


def test_nothing_configured_is_503() -> None:
    router = ProviderRouter(parse_providers_config({}))
    ex = router.exhausted(router.resolve("auto", MESH), [], T0)
    assert ex.status == 503 and ex.routes == ()
    assert error_of(ex)["type"] == "server_error"


def test_a_mesh_only_chain_follows_the_same_rule(cfg: ProvidersConfig) -> None:
    res = Resolution("qwen", "balanced", ProviderRouter(cfg).resolve("qwen", MESH).candidates)
    assert exhaustion(res, [PassedOver("qwen", "connect")], T0).status == 502
    assert exhaustion(res, [PassedOver("qwen", "http_429")], T0).status == 429


@pytest.mark.parametrize(("limits", "reason"), [
    ({"rpm": 1}, "rpm"), ({"rpd": 1}, "rpd"), ({"tpm": 15}, "tpm"), ({"tpd": 15}, "tpd")])
def test_each_gate_shows_up_as_its_reason(limits: dict[str, int], reason: str) -> None:
    doc = {"providers": [{"name": "p", "base_url": "http://127.0.0.1:1/v1", "keys": ["env:K"],
                          "models": [{"id": "m", "tier": "small"}], **limits}]}
    router = ProviderRouter(parse_providers_config(doc))
    assert run(router, "p/m", 10, T0, {})[0] == "p/m#1"
    _, ex, _ = run(router, "p/m", 10, T0 + 1, {})
    assert ex is not None and ex.status == 429
    assert [r.reason for r in ex.routes] == [reason]


def test_the_budget_gate_shows_up_as_budget() -> None:
    doc = {"providers": [{"name": "p", "base_url": "http://127.0.0.1:1/v1", "keys": ["env:K"],
                          "models": [{"id": "m", "tier": "small", "monthly_tokens": 15}]}]}
    router = ProviderRouter(parse_providers_config(doc))
    run(router, "p/m", 10, T0, {})
    _, ex, _ = run(router, "p/m", 10, T0 + 1, {})
    assert ex is not None and [r.reason for r in ex.routes] == ["budget"]
    assert ex.retry_after_s is not None and ex.retry_after_s > 0


def test_a_route_key_listed_twice_keeps_its_first_reason(cfg: ProvidersConfig) -> None:
    res = ProviderRouter(cfg).resolve("fastco/big-model", MESH)
    passed = [PassedOver("fastco/big-model#1", "http_429", T0 + 30),
              PassedOver("fastco/big-model#1", "cooldown", T0 + 30),
              PassedOver("fastco/big-model#2", "rpm", T0 + 12)]
    ex = exhaustion(res, passed, T0)
    assert [(r.route, r.reason) for r in ex.routes] == [("fastco/big-model#1", "http_429"),
                                                         ("fastco/big-model#2", "rpm")]
    assert ex.retry_after_s == 12


def test_retry_after_is_the_soonest_reset_ahead_rounded_up() -> None:
    """The one Retry-After rule (the mesh path's 429 too): soonest ahead, whole seconds up."""
    from meshroute_middleware.core.providers.exhaustion import retry_after_s
    now = 1000.0
    assert retry_after_s([now + 7.0, None, now + 2.2, now - 5.0], now) == 3
    assert retry_after_s([now + 0.1], now) == 1  # never 0: "now" would invite a hot loop
    assert retry_after_s([None, now - 1.0], now) is None
    assert retry_after_s([], now) is None
