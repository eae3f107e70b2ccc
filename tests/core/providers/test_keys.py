"""Key gates: each limit, its reset time, round-robin, reservations, the 429 ladder, snapshots."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from meshroute_middleware.core.providers.config import Limits, Provider, ProviderModel
from meshroute_middleware.core.providers.keys import (
    COOLDOWN_LADDER_S,
    DAY_S,
    INFLIGHT_TTL_S,
    LADDER_RESET_S,
    RETRY_AFTER_MAX_S,
    KeyGates,
    Refusal,
    parse_retry_after,
)

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC).timestamp()  # noon UTC
MIDNIGHT = datetime(2026, 12, 1, tzinfo=UTC).timestamp()
MODEL = ProviderModel("big-model", "large", context=32768)
ROUTE = "fastco/big-model"


def provider(keys: int = 1, **limits: int) -> Provider:
    return Provider("fastco", "http://127.0.0.1:9/v1",
                    tuple(f"env:K{i}" for i in range(keys)), Limits(**limits), (MODEL,))


def send(gates: KeyGates, p: Provider, key: int, tokens: int, now: float,
         used: int | None = None, model: ProviderModel = MODEL) -> None:
    res = gates.reserve(p, model, key, tokens, now)
    gates.settle(res, used, now)


def test_a_key_without_limits_always_passes() -> None:
    gates, p = KeyGates(), provider()
    for i in range(1000):
        send(gates, p, 1, 10_000, T0 + i * 0.01)
    assert gates.check(p, MODEL, 1, 10_000, T0 + 10) is None


def test_rpm_is_a_sliding_minute_of_one_second_buckets() -> None:
    gates, p = KeyGates(), provider(rpm=3)
    for at in (0.2, 10.0, 20.0):
        send(gates, p, 1, 1, T0 + at)
    # The first request left at T0 + 60.2 exactly; its bucket [T0, T0 + 1) leaves at T0 + 61:
    # up to a second late, never early.
    assert gates.check(p, MODEL, 1, 1, T0 + 30) == Refusal("rpm", T0 + 61)
    assert gates.check(p, MODEL, 1, 1, T0 + 60.9) is not None
    assert gates.check(p, MODEL, 1, 1, T0 + 61.0) is None


def test_rpm_counts_a_request_from_the_moment_it_is_sent() -> None:
    gates, p = KeyGates(), provider(rpm=1)
    gates.reserve(p, MODEL, 1, 5, T0)  # still in flight
    assert gates.check(p, MODEL, 1, 1, T0 + 1) == Refusal("rpm", T0 + 61)


def test_tpm_counts_in_flight_estimates_then_settles_on_usage() -> None:
    gates, p = KeyGates(), provider(tpm=1000)
    res = gates.reserve(p, MODEL, 1, 800, T0)
    refusal = gates.check(p, MODEL, 1, 300, T0 + 1)
    assert refusal is not None and refusal.reason == "tpm"
    assert refusal.until is None  # only the in-flight request can free it: no time known
    gates.settle(res, 150, T0 + 2)  # usage says 150, not 800
    assert gates.check(p, MODEL, 1, 300, T0 + 3) is None
    assert gates.check(p, MODEL, 1, 900, T0 + 3) == Refusal("tpm", T0 + 2 + 61)


def test_settling_twice_counts_once() -> None:
    gates, p = KeyGates(), provider(tpd=100)
    res = gates.reserve(p, MODEL, 1, 10, T0)
    gates.settle(res, 60, T0)
    gates.settle(res, 60, T0)
    assert gates.check(p, MODEL, 1, 40, T0) is None
    assert gates.check(p, MODEL, 1, 41, T0) == Refusal("tpd", MIDNIGHT)


def test_a_settle_without_usage_keeps_the_estimate() -> None:
    gates, p = KeyGates(), provider(tpd=100)
    send(gates, p, 1, 70, T0, used=None)
    assert gates.check(p, MODEL, 1, 31, T0) == Refusal("tpd", MIDNIGHT)


def test_a_request_larger_than_the_limit_itself_has_no_reset_time() -> None:
    gates, p = KeyGates(), provider(tpm=100, tpd=50)
    assert gates.check(p, MODEL, 1, 60, T0) == Refusal("tpd", None)


def test_daily_counters_reset_at_utc_midnight() -> None:
    gates, p = KeyGates(), provider(rpd=2)
    send(gates, p, 1, 1, T0)
    send(gates, p, 1, 1, T0 + 3600)
    assert gates.check(p, MODEL, 1, 1, MIDNIGHT - 1) == Refusal("rpd", MIDNIGHT)
    assert gates.check(p, MODEL, 1, 1, MIDNIGHT) is None


def test_the_monthly_budget_refuses_until_the_next_utc_month() -> None:
    model = ProviderModel("big-model", "large", monthly_tokens=1000)
    gates, p = KeyGates(), provider()
    send(gates, p, 1, 0, T0, used=990, model=model)
    assert gates.month_tokens(ROUTE, 1, T0) == 990
    assert gates.check(p, model, 1, 10, T0) is None
    assert gates.check(p, model, 1, 11, T0) == Refusal("budget", MIDNIGHT)  # Dec 1st
    assert gates.month_tokens(ROUTE, 1, MIDNIGHT) == 0
    assert gates.check(p, model, 1, 11, MIDNIGHT) is None


def test_rate_windows_are_per_key_and_shared_by_the_models_of_a_provider() -> None:
    small = ProviderModel("small-model", "small")
    p = Provider("fastco", "http://127.0.0.1:9/v1", ("env:A", "env:B"), Limits(rpm=1),
                 (MODEL, small))
    gates = KeyGates()
    send(gates, p, 1, 1, T0)
    assert gates.check(p, small, 1, 1, T0) == Refusal("rpm", T0 + 61)
    assert gates.check(p, MODEL, 2, 1, T0) is None


def test_round_robin_among_keys_that_pass() -> None:
    gates, p = KeyGates(), provider(keys=3)
    picks = []
    for i in range(6):
        key, refused = gates.pick(p, MODEL, 1, T0 + i)
        assert refused == []
        picks.append(key)
    assert picks == [1, 2, 3, 1, 2, 3]


def test_round_robin_skips_a_refused_key_and_reports_it() -> None:
    gates, p = KeyGates(), provider(keys=3)
    gates.rate_limited(ROUTE, 2, 30.0, T0)
    picks = [gates.pick(p, MODEL, 1, T0 + 1)[0] for _ in range(4)]
    assert picks == [1, 3, 1, 3]
    gates.pick(p, MODEL, 1, T0 + 1)  # key 1: the cursor now points at key 2
    assert gates.pick(p, MODEL, 1, T0 + 1) == (3, [(2, Refusal("cooldown", T0 + 30))])


def test_no_key_passes_returns_every_refusal() -> None:
    gates, p = KeyGates(), provider(keys=2, rpd=1)
    send(gates, p, 1, 1, T0)
    gates.rate_limited(ROUTE, 2, None, T0)
    key, refused = gates.pick(p, MODEL, 1, T0 + 1)
    assert key is None
    assert sorted(refused, key=lambda kr: kr[0]) == [
        (1, Refusal("rpd", MIDNIGHT)), (2, Refusal("cooldown", T0 + COOLDOWN_LADDER_S[0]))]


def test_retry_after_sets_the_cooldown_and_is_capped() -> None:
    gates, p = KeyGates(), provider()
    assert gates.rate_limited(ROUTE, 1, 7.0, T0) == T0 + 7
    assert gates.check(p, MODEL, 1, 1, T0 + 6.9) == Refusal("cooldown", T0 + 7)
    assert gates.check(p, MODEL, 1, 1, T0 + 7) is None
    assert gates.rate_limited(ROUTE, 1, 86_400.0, T0 + 10) == T0 + 10 + RETRY_AFTER_MAX_S


def test_the_ladder_escalates_to_its_ceiling_and_restarts_after_quiet() -> None:
    gates = KeyGates()
    now, waits = T0, []
    for _ in range(len(COOLDOWN_LADDER_S) + 2):
        until = gates.rate_limited(ROUTE, 1, None, now)
        waits.append(until - now)
        now = until
    assert waits == [*COOLDOWN_LADDER_S, COOLDOWN_LADDER_S[-1], COOLDOWN_LADDER_S[-1]]
    assert max(waits) <= 1800.0  # well below the reference's 24 h benching
    quiet = now + LADDER_RESET_S + 1
    assert gates.rate_limited(ROUTE, 1, None, quiet) == quiet + COOLDOWN_LADDER_S[0]


def test_a_success_restarts_the_ladder() -> None:
    gates = KeyGates()
    gates.rate_limited(ROUTE, 1, None, T0)
    gates.rate_limited(ROUTE, 1, None, T0 + 30)
    gates.succeeded(ROUTE, 1)
    assert gates.rate_limited(ROUTE, 1, None, T0 + 200) == T0 + 200 + COOLDOWN_LADDER_S[0]


def test_clear_lifts_one_route_or_all() -> None:
    gates, p = KeyGates(), provider(keys=2)
    other = "fastco/other"
    gates.rate_limited(ROUTE, 1, 100.0, T0)
    gates.rate_limited(ROUTE, 2, 100.0, T0)
    gates.rate_limited(other, 1, 100.0, T0)
    assert gates.clear(ROUTE) == 2
    assert gates.check(p, MODEL, 1, 1, T0 + 1) is None
    assert gates.clear() == 1
    assert gates.rate_limited(ROUTE, 1, None, T0 + 2) == T0 + 2 + COOLDOWN_LADDER_S[0]


def test_key_states_for_the_chain_endpoint() -> None:
    gates, p = KeyGates(), provider(keys=3, rpd=1)
    gates.rate_limited(ROUTE, 1, 50.0, T0)
    send(gates, p, 2, 1, T0)
    assert gates.key_states(p, MODEL, T0 + 1) == [
        {"key": 1, "state": "cooldown", "until": T0 + 50, "reason": "cooldown", "limits": "local"},
        {"key": 2, "state": "limited", "until": MIDNIGHT, "reason": "rpd", "limits": "local"},
        {"key": 3, "state": "ready", "until": None, "reason": None, "limits": "local"}]


def test_snapshot_restore_keeps_windows_day_counters_and_cooldowns() -> None:
    gates, p = KeyGates(), provider(keys=2, rpm=2, rpd=3, tpd=1000)
    model = ProviderModel("big-model", "large", monthly_tokens=10_000)
    send(gates, p, 1, 10, T0, used=400, model=model)
    send(gates, p, 1, 10, T0 + 1, used=500, model=model)
    gates.rate_limited(ROUTE, 2, None, T0 + 2)
    snap = gates.snapshot(T0 + 3)
    assert "env:" not in repr(snap)
    again = KeyGates()
    again.restore(snap)
    assert again.snapshot(T0 + 3) == snap
    assert again.check(p, model, 1, 1, T0 + 3) == Refusal("rpm", T0 + 61)
    assert again.check(p, model, 1, 101, T0 + 120) == Refusal("tpd", MIDNIGHT)
    assert again.month_tokens(ROUTE, 1, T0 + 3) == 900
    assert again.check(p, model, 2, 1, T0 + 3) == Refusal(
        "cooldown", T0 + 2 + COOLDOWN_LADDER_S[0])


@pytest.mark.parametrize(("header", "seconds"), [
    ("5", 5.0), (" 2.5 ", 2.5), ("", None), (None, None), ("soon", None), ("-3", None),
    ("nan", None), ("99999999", RETRY_AFTER_MAX_S),
    ("Mon, 30 Nov 2026 12:00:30 GMT", 30.0)])
def test_parse_retry_after(header: str | None, seconds: float | None) -> None:
    assert parse_retry_after(header, T0) == seconds


def test_day_constant() -> None:
    assert DAY_S == 86_400.0


@pytest.mark.parametrize("seed", range(5))
def test_no_sliding_minute_ever_holds_more_than_rpm_or_tpm(seed: int) -> None:
    """Random bursts against rpm=10, tpm=500: every 60 s interval stays within both limits."""
    rng = random.Random(seed)
    gates, p = KeyGates(), provider(keys=1, rpm=10, tpm=500)
    now, sent = T0, []
    for _ in range(3000):
        now += rng.expovariate(1.0)  # ~6x what rpm allows
        tokens = rng.randint(1, 80)
        key, _ = gates.pick(p, MODEL, tokens, now)
        if key is not None:
            used = rng.randint(1, tokens)  # usage: what the upstream really counted
            send(gates, p, key, tokens, now, used=used)
            sent.append((now, used))
    times = [t for t, _ in sent]
    for i, start in enumerate(times):
        inside = [n for t, n in sent[i:] if t < start + 60]
        assert len(inside) <= 10
        assert sum(inside) <= 500
    assert len(sent) > 3000 / 6 * 0.5  # and it does not starve either (> half of rpm's share)


def test_a_reservation_never_settled_stops_counting_after_its_ttl() -> None:
    gates, p = KeyGates(), provider(tpm=100)
    gates.reserve(p, MODEL, 1, 90, T0)  # its task was lost: never settled
    assert gates.check(p, MODEL, 1, 20, T0 + 100) == Refusal("tpm", None)
    assert gates.check(p, MODEL, 1, 20, T0 + INFLIGHT_TTL_S) is None


def test_a_401_revokes_the_key_for_every_model_a_403_for_its_model_only() -> None:
    other = ProviderModel("other-model", "small", context=8192)
    gates, p = KeyGates(), provider(keys=2)
    gates.revoke("fastco", "big-model", 1, 401)
    gates.revoke("fastco", "big-model", 2, 403)
    assert gates.check(p, MODEL, 1, 1, T0) == Refusal("revoked")
    assert gates.check(p, other, 1, 1, T0) == Refusal("revoked")  # the key itself
    assert gates.check(p, MODEL, 2, 1, T0) == Refusal("revoked")
    assert gates.check(p, other, 2, 1, T0) is None  # only its access to big-model
    assert gates.pick(p, other, 1, T0)[0] == 2
    assert gates.check(p, MODEL, 2, 1, T0 + 365 * DAY_S) == Refusal("revoked")  # never lapses
    with pytest.raises(ValueError):
        gates.revoke("fastco", "big-model", 1, 500)


def test_a_revoked_key_shows_as_such_and_comes_back_when_cleared() -> None:
    gates, p = KeyGates(), provider(keys=3)
    gates.revoke("fastco", "big-model", 1, 401)
    gates.revoke("fastco", "big-model", 3, 403)
    assert gates.key_states(p, MODEL, T0) == [
        {"key": 1, "state": "revoked", "until": None, "reason": "http_401", "limits": "local"},
        {"key": 2, "state": "ready", "until": None, "reason": None, "limits": "local"},
        {"key": 3, "state": "revoked", "until": None, "reason": "http_403", "limits": "local"}]
    restarted = KeyGates()
    restarted.restore(gates.snapshot(T0))
    assert restarted.check(p, MODEL, 1, 1, T0) is None  # not persisted: a restart lifts it
    assert gates.clear(ROUTE, 1) == 1  # a route's key: its provider-wide revocation too
    assert gates.check(p, MODEL, 1, 1, T0) is None
    assert gates.clear("fastco/other", 3) == 0  # another route: the 403 stays
    assert gates.clear() == 1 and gates.check(p, MODEL, 3, 1, T0) is None
