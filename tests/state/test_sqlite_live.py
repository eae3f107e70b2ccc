"""The state file's clients' gates held live in each process (state/sqlite_limits.py): still
exact when several connections (the `--workers`) decide on one file, when a row is changed or
removed behind a process's back, and after a transaction that failed."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from meshroute_middleware.chat.spend import ClientRefused, ClientSpend
from meshroute_middleware.core.clients import Client
from meshroute_middleware.core.clients_budget import CLIENTS, ClientGates, client_row
from meshroute_middleware.http.request import ChatRequest
from meshroute_middleware.state.sqlite_limits import SqliteLimits
from meshroute_middleware.state.store import StateStore

pytestmark = pytest.mark.anyio
T0 = 1_796_040_000.0
BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 25}'
ALICE = Client("alice", hashlib.sha256(b"k").digest(), rpm=5)


async def _noop(message: Any) -> None:
    return None


def state_file(tmp_path: Path) -> str:
    path = str(tmp_path / "state.db")
    StateStore(path).open().close()  # the schema, as `meshroute serve` creates it
    return path


async def answered(spend: ClientSpend, client: Client = ALICE) -> bool:
    """One request of `client`, answered with usage 10 + 20 tokens; False when refused."""
    try:
        send = await spend.admit(client, ChatRequest(BODY, "m", None), _noop)
    except ClientRefused:
        return False
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "more_body": False,
                "body": b'{"usage": {"prompt_tokens": 10, "completion_tokens": 20}}'})
    return True


def requests_of(rows: list[dict[str, Any]]) -> int:
    return sum(r["requests"] for r in rows)


async def test_two_connections_taking_turns_hold_one_rpm_and_one_ledger(
        tmp_path: Path) -> None:
    path = state_file(tmp_path)
    spends = [ClientSpend(SqliteLimits(path).open(), clock=lambda: T0) for _ in range(2)]
    served = [await answered(spends[i % 2]) for i in range(12)]
    assert served.count(True) == 5  # both decided on one row, each seeing the other's turns
    assert served[:5] == [True] * 5
    for spend in spends:
        await spend.ledger.flush()
    assert requests_of(await spends[1].usage_rows("alice")) == 5
    rows = await spends[0].usage_rows("alice")
    assert [(r["prompt_tokens"], r["completion_tokens"]) for r in rows] == [(50, 100)]


async def test_a_row_removed_behind_a_process_is_not_decided_on_as_held(
        tmp_path: Path) -> None:
    path = state_file(tmp_path)
    spend = ClientSpend(SqliteLimits(path).open(), clock=lambda: T0)
    assert [await answered(spend) for _ in range(6)] == [True] * 5 + [False]
    with sqlite3.connect(path) as db:  # e.g. an operator resets the client's minute
        db.execute("DELETE FROM route_state WHERE section = 'clients'")
    db.close()
    assert await answered(spend)


async def test_a_row_another_process_changed_is_read_again(tmp_path: Path) -> None:
    path = state_file(tmp_path)
    mine, other = (ClientSpend(SqliteLimits(path).open(), clock=lambda: T0)
                   for _ in range(2))
    assert await answered(mine)  # mine holds alice's row live now
    assert [await answered(other) for _ in range(4)] == [True] * 4
    assert not await answered(mine)  # 5 in this minute: the row as the file holds it


async def test_a_failed_decision_leaves_nothing_held_that_the_file_does_not_hold(
        tmp_path: Path) -> None:
    store = SqliteLimits(state_file(tmp_path)).open()

    def admit_then_fail(gates: ClientGates) -> None:
        for _ in range(5):
            gates.admit(ALICE, 0, T0)
        raise RuntimeError("a bug after the gates changed")

    def make(first_id: int) -> ClientGates:
        return ClientGates(first_id=first_id)

    await store.transact_with([client_row("alice")], make, lambda g: g.admit(ALICE, 0, T0),
                              T0, 0)
    with pytest.raises(RuntimeError):
        await store.transact_with([client_row("alice")], make, admit_then_fail, T0, 0)
    out = await store.transact_with([client_row("alice")], make,
                                    lambda g: g.snapshot(T0)[CLIENTS], T0, 0)
    assert out.result[0]["requests"] == [[int(T0), 1]]  # the failed decision's 5: rolled back


async def test_the_ledger_rows_held_are_bounded_and_read_again_when_used(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from meshroute_middleware.state import sqlite_limits
    monkeypatch.setattr(sqlite_limits, "MAX_LIVE_LEDGER", 3)
    clock = [T0]
    spend = ClientSpend(SqliteLimits(state_file(tmp_path)).open(), clock=lambda: clock[0])
    free = Client("bob", hashlib.sha256(b"b").digest(), daily_tokens=10**9)
    for day in range(6):  # a ledger row a day, past the bound
        clock[0] = T0 + day * 86_400
        assert await answered(spend, free)
        await spend.ledger.flush()
    clock[0] = T0
    assert await answered(spend, free)  # the first day's row again, dropped from memory
    await spend.ledger.flush()
    rows = await spend.usage_rows("bob")
    assert [r["requests"] for r in sorted(rows, key=lambda r: r["day"])] == [2, 1, 1, 1, 1, 1]

