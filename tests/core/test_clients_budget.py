"""Per-client limits, budgets and the ledger, decided on rows with a fake clock."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from meshroute_middleware.core.clients import Client
from meshroute_middleware.core.clients_budget import (
    DAY_S,
    Admission,
    ClientGates,
    Spent,
    cost_usd,
    usage_report,
)
from meshroute_middleware.core.providers.keys import Refusal

NO_CACHE = {"cached_tokens": 0, "cache_write_tokens": 0}  # nothing cached (issue 35)

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC).timestamp()


def client(**kw: object) -> Client:
    return Client("alice", b"\0" * 32, **kw)  # type: ignore[arg-type]


def spent(prompt: int, completion: int, usd: float = 0.0, route: str = "fastco/m",
          error: bool = False) -> Spent:
    return Spent(route, prompt, completion, usd, error)


def roundtrip(gates: ClientGates, now: float) -> ClientGates:
    """The rows as a store keeps them, loaded into fresh gates."""
    fresh = ClientGates()
    fresh.restore(gates.snapshot(now))
    return fresh


def test_rpm_refuses_the_request_past_the_limit_until_the_first_leaves_the_minute() -> None:
    c, g = client(rpm=2), ClientGates()
    assert isinstance(g.admit(c, 10, T0), Admission)
    assert isinstance(g.admit(c, 10, T0 + 5), Admission)
    refused = g.admit(c, 10, T0 + 6)
    assert refused == Refusal("rpm", T0 + 61)  # the first request's second + 1 + 60
    assert isinstance(g.admit(c, 10, T0 + 61), Admission)


def test_tpm_counts_the_estimate_in_flight_then_the_true_usage() -> None:
    c, g = client(tpm=100), ClientGates()
    a = g.admit(c, 60, T0)
    assert isinstance(a, Admission)
    assert isinstance(g.admit(c, 60, T0 + 1), Refusal)  # 60 in flight + 60 > 100
    g.settle(a, spent(10, 20), T0 + 1)  # 30 used, not 60
    assert isinstance(g.admit(c, 60, T0 + 2), Admission)
    r = g.admit(c, 60, T0 + 3)
    assert isinstance(r, Refusal) and r.reason == "tpm"


def test_a_request_larger_than_tpm_alone_is_refused_with_no_known_end() -> None:
    assert ClientGates().admit(client(tpm=100), 500, T0) == Refusal("tpm", None)


def test_daily_tokens_refuse_until_utc_midnight_and_reset_there() -> None:
    c, g = client(daily_tokens=1000), ClientGates()
    a = g.admit(c, 100, T0)
    assert isinstance(a, Admission)
    g.settle(a, spent(400, 550), T0 + 1)  # 950 of 1000
    midnight = (T0 // DAY_S + 1) * DAY_S
    assert g.admit(c, 100, T0 + 2) == Refusal("daily_tokens", midnight)
    assert isinstance(g.admit(c, 100, midnight), Admission)


def test_monthly_usd_refuses_once_spent_until_the_next_month() -> None:
    c, g = client(monthly_usd=1.0), ClientGates()
    a = g.admit(c, 10, T0)
    assert isinstance(a, Admission)
    g.settle(a, spent(1000, 1000, usd=1.25), T0)
    nxt = datetime(2027, 1, 1, tzinfo=UTC).timestamp()
    assert g.admit(c, 10, T0 + 10) == Refusal("monthly_usd", nxt)
    assert isinstance(g.admit(c, 10, nxt), Admission)


def test_no_limits_admit_everything() -> None:
    g = ClientGates()
    assert all(isinstance(g.admit(client(), 10**6, T0), Admission) for _ in range(500))


def test_settle_is_idempotent_and_fills_the_ledger_row() -> None:
    c, g = client(), ClientGates()
    a = g.admit(c, 10, T0)
    assert isinstance(a, Admission)
    g.settle(a, spent(7, 3, usd=0.5), T0)
    g.settle(a, spent(7, 3, usd=0.5), T0)
    b = g.admit(c, 10, T0)
    assert isinstance(b, Admission)
    g.settle(b, spent(0, 0, error=True), T0)
    rows = g.snapshot(T0)["usage"]
    assert rows == [{"name": "alice fastco/m", "key": int(T0 // DAY_S), "client": "alice",
                     "route": "fastco/m", "day": int(T0 // DAY_S), "requests": 2,
                     "prompt_tokens": 7, "completion_tokens": 3, "cost_usd": 0.5,
                     "errors": 1, **NO_CACHE}]


def test_rows_roundtrip_keeps_windows_budgets_and_reservations() -> None:
    c, g = client(rpm=2, daily_tokens=1000, monthly_usd=1.0), ClientGates()
    a = g.admit(c, 100, T0)
    assert isinstance(a, Admission)
    g.settle(a, spent(500, 400, usd=0.4), T0)
    b = g.admit(c, 50, T0)
    g = roundtrip(g, T0 + 1)
    assert g.admit(c, 10, T0 + 2) == Refusal("rpm", T0 + 61)
    [row] = g.snapshot(T0 + 2)["clients"]
    assert (row["day_tokens"], row["month_usd"], row["requests"]) == (900, 0.4,
                                                                      [[int(T0), 2]])
    assert isinstance(b, Admission)
    g.settle(b, spent(10, 10, usd=0.7), T0 + 70)  # the reservation was kept with the row
    assert g.admit(c, 10, T0 + 71) == Refusal(
        "monthly_usd", datetime(2027, 1, 1, tzinfo=UTC).timestamp())


def test_changed_only_snapshot_holds_just_the_rows_touched() -> None:
    g = ClientGates()
    g.admit(client(), 1, T0)
    g.snapshot(T0, changed_only=True)
    assert g.snapshot(T0, changed_only=True) == {"clients": [], "usage": []}
    g.admit(Client("bob", b"\0" * 32), 1, T0)
    assert [r["name"] for r in g.snapshot(T0, changed_only=True)["clients"]] == ["bob"]


@pytest.mark.parametrize(("prompt", "completion", "price", "usd"), [
    (1_000_000, 0, (2.0, 8.0), 2.0),
    (500_000, 250_000, (2.0, 8.0), 3.0),
    (1000, 1000, None, 0.0),  # a mesh route: free
    (1000, 1000, (0.0, 0.0), 0.0),
])
def test_cost_is_priced_per_million_tokens(prompt: int, completion: int,
                                           price: tuple[float, float] | None,
                                           usd: float) -> None:
    assert cost_usd(prompt, completion, price) == pytest.approx(usd)


def test_usage_report_groups_filters_and_sorts() -> None:
    day = int(T0 // DAY_S)
    rows = [
        {"client": "a", "route": "p/m", "day": day - 1, "requests": 1, "prompt_tokens": 1,
         "completion_tokens": 1, "cost_usd": 0.1, "errors": 0, **NO_CACHE},
        {"client": "a", "route": "q", "day": day, "requests": 2, "prompt_tokens": 2,
         "completion_tokens": 2, "cost_usd": 0.0, "errors": 1, **NO_CACHE},
        {"client": "b", "route": "p/m", "day": day, "requests": 4, "prompt_tokens": 4,
         "completion_tokens": 4, "cost_usd": 0.4, "errors": 0, **NO_CACHE},
    ]
    by_route = usage_report(rows, ("route",))
    assert [(r["route"], r["requests"]) for r in by_route] == [("p/m", 5), ("q", 2)]
    assert usage_report(rows, ("client",), client="a")[0]["cost_usd"] == pytest.approx(0.1)
    assert [r["requests"] for r in usage_report(rows, ("client",), since=T0)] == [2, 4]
    assert [r["day"] for r in usage_report(rows, ("day",))] == [day - 1, day]


def test_monthly_usd_holds_each_requests_worst_case_while_in_flight() -> None:
    """Issue 32: 50 requests at once against a budget worth 1.5 of them: one is let in."""
    c, g = client(monthly_usd=1.5), ClientGates()
    got = [g.admit(c, 10, T0, usd=1.0) for _ in range(50)]
    admitted = [a for a in got if isinstance(a, Admission)]
    assert len(admitted) == 1
    assert {r.reason for r in got if isinstance(r, Refusal)} == {"monthly_usd"}
    g.settle(admitted[0], spent(10, 5, usd=0.25), T0 + 1)  # the truth: cheaper than held
    assert isinstance(g.admit(c, 10, T0 + 2, usd=1.0), Admission)  # 0.25 + 1.0 <= 1.5
    assert isinstance(g.admit(c, 10, T0 + 2, usd=1.0), Refusal)


def test_a_worst_case_held_in_flight_survives_the_rows_roundtrip_and_expires() -> None:
    c, g = client(monthly_usd=1.0), ClientGates()
    assert isinstance(g.admit(c, 10, T0, usd=0.75), Admission)
    loaded = roundtrip(g, T0)  # what another worker loads from the shared store
    assert isinstance(loaded.admit(c, 10, T0 + 1, usd=0.5), Refusal)
    assert isinstance(loaded.admit(c, 10, T0 + 1, usd=0.25), Admission)
    later = T0 + 24 * 3600  # a reservation never settled (a crashed worker) expires
    assert isinstance(roundtrip(loaded, later).admit(c, 10, later, usd=0.9), Admission)


def test_spent_exactly_the_budget_refuses_even_a_free_request() -> None:
    c, g = client(monthly_usd=1.0), ClientGates()
    a = g.admit(c, 10, T0, usd=0.5)
    assert isinstance(a, Admission)
    g.settle(a, spent(10, 5, usd=1.0), T0 + 1)
    assert isinstance(g.admit(c, 10, T0 + 2), Refusal)
