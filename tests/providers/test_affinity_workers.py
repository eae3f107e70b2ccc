"""Provider-key affinity under `meshroute serve --workers 2` (issue 35): every turn of a
conversation lands on its one key, because each worker computes the same key order
(core/providers/affinity.py); a conversation moved off its first key (a 429) is told to the
other workers in their provider gossip (gossiped.py), so they keep it where its cache is.
Real processes, a fresh connection per turn (any worker may take any turn); and two routers
that gossip, on a fake clock."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gossip.checks import pack, unpack
from gossip.errors import MalformedMessage
from gossip.reports_wire import read_report, report_obj
from meshroute_middleware.core.providers.affinity import Turn, Verdict, key_order
from meshroute_middleware.core.providers.config import parse_providers_config
from meshroute_middleware.core.providers.keys import KeyGates
from meshroute_middleware.core.providers.peers import Peers, PeerState
from meshroute_middleware.core.providers.router import ProviderRouter
from meshroute_middleware.core.providers.scoring import OutcomeKind

from ..upstream import serve_process
from .fake_provider import FakeProvider, Reply
from .gateway import ENV
from .test_affinity import ROUTE, T0, CachingProvider, config_doc, take
from .test_serve_process import config_text


def test_every_turn_of_a_conversation_lands_on_one_key_across_two_workers(
        tmp_path: Path) -> None:
    fast, slow = CachingProvider("fast"), FakeProvider("slow", models=("small-model",))
    with fast.serve(), slow.serve():
        config = tmp_path / "meshroute.toml"
        config.write_text(config_text(fast, slow).replace("cache_ttl = 0", 'cache_ttl = "5m"'))
        flags = ["--config", str(config), "--state-file", str(tmp_path / "state.db"),
                 "--workers", "2", "--log-level", "warning"]
        keys: dict[str, list[str | None]] = {}
        cached: dict[str, list[int]] = {}
        with serve_process(flags, tmp_path / "log", ENV) as (url, _):
            for name in ("alpha", "beta", "gamma"):
                messages: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
                for turn in range(4):
                    messages.append({"role": "user", "content": f"{name} {turn}"})
                    seen = len(fast.seen)
                    with httpx.Client(timeout=30) as client:  # a new connection: any worker
                        answer = client.post(f"{url}/v1/chat/completions", json={
                            "model": "fastco/big-model", "messages": messages})
                    assert answer.status_code == 200, answer.text
                    body = answer.json()
                    messages.append(body["choices"][0]["message"])
                    keys.setdefault(name, []).extend(s.key for s in fast.seen[seen:])
                    cached.setdefault(name, []).append(
                        body["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0))
    for name in keys:
        assert len(keys[name]) == 4 and len(set(keys[name])) == 1, (name, keys[name])
        assert cached[name][0] == 0 and all(c > 0 for c in cached[name][1:]), cached


class Scripted(CachingProvider):
    """CachingProvider that answers its script first (a 429 when pushed)."""

    def _next(self, key: str | None) -> Reply:
        with self._lock:
            if self._script:
                return self._script.popleft()
        return super()._next(key)


COOL_S = 5  # the 429's Retry-After: the moved conversation's word has this long to spread


def test_a_conversation_moved_by_a_429_stays_on_its_new_key_across_two_workers(
        tmp_path: Path) -> None:
    """Turn 2 of a conversation meets a 429 on its first key and is served by the second;
    once the first key has cooled off, every later turn (a fresh connection each: either
    worker) still lands on the second key, where its cache is. With the memory per process
    the worker that did not serve turn 2 sent its turns back to the first key (then each of
    six turns stays only with probability 1/2)."""
    fast, slow = Scripted("fast"), FakeProvider("slow", models=("small-model",))
    with fast.serve(), slow.serve():
        config = tmp_path / "meshroute.toml"
        config.write_text(config_text(fast, slow).replace("cache_ttl = 0", 'cache_ttl = "5m"'))
        flags = ["--config", str(config), "--state-file", str(tmp_path / "state.db"),
                 "--workers", "2", "--log-level", "warning"]
        messages: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]

        def turn(url: str, text: str) -> list[str | None]:
            messages.append({"role": "user", "content": text})
            seen = len(fast.seen)
            with httpx.Client(timeout=30) as client:  # a new connection: any worker
                answer = client.post(f"{url}/v1/chat/completions", json={
                    "model": "fastco/big-model", "messages": messages})
            assert answer.status_code == 200, answer.text
            messages.append(answer.json()["choices"][0]["message"])
            return [s.key for s in fast.seen[seen:]]

        with serve_process(flags, tmp_path / "log", ENV) as (url, _):
            (first,) = turn(url, "one")
            fast.push(Reply.rate_limited(str(COOL_S)))
            cooled, second = turn(url, "two")  # a 429 on the first key, the second answers
            time.sleep(COOL_S + 1)  # the first key has cooled off
            later = [key for n in range(6) for key in turn(url, f"later {n}")]
    assert cooled == first and second != first
    assert later == [second] * 6, later


# -- gateway-wide: what one worker moved, the others hear ------------------------------------

def test_a_conversation_moved_off_a_cooling_key_stays_moved_on_another_worker() -> None:
    """Two workers (two ProviderRouters over one set of key gates, as the state file shares
    them) that gossip: a 429 moves a conversation off its first key at w0; once that key has
    cooled off, w1 sends the next turn to the key w0 moved it to (its cache), not back to
    the first key of its order (what it did when the memory was per process)."""
    cfg = parse_providers_config(config_doc())
    gates = KeyGates()
    w0, w1 = ProviderRouter(cfg, gates), ProviderRouter(cfg, gates)
    for w in (w0, w1):
        w.peers = Peers()
    turn = Turn(99, 500)
    first, second = key_order(99, ROUTE, 2)
    w0.record(take(w0, ROUTE, turn, T0), OutcomeKind.SUCCESS, T0, turn=turn)
    w0.record(take(w0, ROUTE, turn, T0 + 1), OutcomeKind.RATE_LIMITED, T0 + 1,
              retry_after_s=30.0, turn=turn)
    moved = take(w0, ROUTE, turn, T0 + 2)
    assert moved.key == second
    w0.record(moved, OutcomeKind.SUCCESS, T0 + 2, turn=turn)
    assert take(w1, ROUTE, turn, T0 + 40).key == first  # no word from w0 yet: its order
    assert w1.merge_peer("w0", w0.report(T0 + 41), T0 + 41)
    assert take(w1, ROUTE, turn, T0 + 42).key == second
    ranked = w1.rank(w1.resolve(ROUTE, ()), T0 + 42, turn=turn)
    assert ranked.affinity == Verdict.KEPT
    # w1 serves it there, then (its cache cold after a restart of w0's view) back on the
    # first key: that is told too, so w0 follows it back rather than keep its old word
    w1.record(take(w1, ROUTE, turn, T0 + 43), OutcomeKind.SUCCESS, T0 + 43, turn=turn)
    w1.affinity.served(turn, ROUTE, first, T0 + 50,
                       moved=w1.moved(turn, ROUTE, first, 2))
    assert w0.merge_peer("w1", w1.report(T0 + 51), T0 + 51)
    assert take(w0, ROUTE, turn, T0 + 52).key == first
    assert take(w0, ROUTE, turn, T0 + 50 + 301).key == first  # and after the TTL: its order


def test_moved_conversations_cross_the_wire_checked() -> None:
    state = PeerState(T0, moved={2**64 - 1: (ROUTE, 2, T0, 500, 300.0)})
    assert read_report(unpack(pack(report_obj(state)))).moved == state.moved
    for bad in ({"x1": [ROUTE, 2, T0, 500, 300.0]}, {"1": [ROUTE, 0, T0, 500, 300.0]},
                {"1": [ROUTE, 2, T0, -1, 300.0]}, {"1": [ROUTE, 2, T0, 5, 1e9]},
                {str(2**64): [ROUTE, 2, T0, 5, 300.0]}, {"1": [ROUTE, 2, T0]}):
        with pytest.raises(MalformedMessage):
            read_report({"t": T0, "a": bad})
