"""Issue 26's world: prefix chains, LRU prefix caches, prefill in the simulator, multi-turn
workloads, and that scenarios without them run as before."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from meshroute_middleware.core.prefix import (
    MAX_CHAIN,
    Prefix,
    PrefixCache,
    PrefixTable,
    chain,
    message_chain,
)
from meshroute_middleware.core.sim.engine import Simulator
from meshroute_middleware.core.sim.model import Conversations, NodeSpec, Scenario, caching, whole
from meshroute_middleware.core.sim.scenarios import CONVERSATION_SCENARIOS, SCENARIOS, by_name
from meshroute_middleware.core.sim.workload import draw_conversations


def msgs(*texts: str) -> list[dict[str, str]]:
    roles = ("system", "user", "assistant")
    return [{"role": roles[min(i, 1) if i < 2 else 1 + (i % 2)], "content": t}
            for i, t in enumerate(texts)]


# -- message chains ---------------------------------------------------------------------
def test_a_returning_conversation_shares_its_chain_up_to_the_new_message() -> None:
    turn1 = message_chain(msgs("be brief", "hello"))
    turn2 = message_chain(msgs("be brief", "hello", "hi there", "how are you?"))
    other = message_chain(msgs("be brief", "goodbye"))
    assert turn1 is not None and turn2 is not None and other is not None
    assert turn2.hashes[:2] == turn1.hashes
    assert other.hashes[0] == turn1.hashes[0] and other.hashes[1] != turn1.hashes[1]
    assert turn2.tokens[1] == turn1.prompt_tokens
    assert turn2.prompt_tokens > turn1.prompt_tokens


def test_the_chain_keeps_no_text_and_is_bounded() -> None:
    secret = "the password is swordfish"
    long = message_chain([{"role": "user", "content": secret}] * (MAX_CHAIN + 50))
    assert long is not None
    assert len(long.hashes) == MAX_CHAIN and len(long.tokens) == MAX_CHAIN
    assert all(isinstance(h, int) for h in long.hashes)
    assert secret not in repr(long)
    # the last entry still carries the whole prompt
    assert long.prompt_tokens == (MAX_CHAIN + 50) * long.tokens[0]


def test_bad_messages_give_no_chain_and_parts_hash_stably() -> None:
    assert message_chain(None) is None
    assert message_chain([]) is None
    assert message_chain(["not an object"]) is None
    parts = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert message_chain(parts) == message_chain(parts)
    hinted = message_chain(parts, "session-1")
    assert hinted is not None and hinted.session != 0


# -- the router's table -------------------------------------------------------------------
def test_the_table_says_how_much_of_a_prompt_each_route_served() -> None:
    table = PrefixTable()
    turn1 = chain([b"s", b"u1"], [500, 50])
    turn2 = turn1.extended(b"a1", 100).extended(b"u2", 40)
    table.served(turn1, "route-a")
    table.served(chain([b"s"], [500]), "route-b")
    # a whole prompt served: the message after it (its answer, in a conversation) is warm too
    assert table.warm(turn2) == {"route-a": 650, "route-b": 550}
    assert table.warm(turn1) == {"route-a": 550, "route-b": 550}
    assert table.warm(chain([b"x"], [10])) == {}


def test_the_table_is_bounded() -> None:
    table = PrefixTable(capacity=100)
    for k in range(1000):
        table.served(chain([str(k).encode()], [10]), "r")
    assert len(table) == 100


def test_a_session_hint_names_the_route_that_served_it() -> None:
    table = PrefixTable()
    table.served(Prefix((1,), (300,), session=7), "route-a")
    assert table.warm(Prefix((99,), (400,), session=7)) == {"route-a": 300}


# -- the server's cache ---------------------------------------------------------------------
def test_the_cache_matches_the_longest_prefix_and_evicts_lru_in_tokens() -> None:
    cache = PrefixCache(1000)
    a = chain([b"a", b"a1"], [300, 100])
    b = chain([b"b"], [500])
    cache.store(a)
    cache.store(b)
    assert cache.used == 900
    assert cache.match(a.extended(b"more", 50)) == 400
    c = chain([b"c"], [300])
    cache.store(c)  # over capacity: the least recently used (b, as a was just matched) goes
    assert cache.match(b) == 0
    assert cache.match(a) == 400 and cache.match(c) == 300
    assert cache.used == 700


def test_a_longer_turn_replaces_the_entry_it_extends() -> None:
    cache = PrefixCache(10_000)
    turn1 = chain([b"s", b"u"], [500, 50])
    cache.store(turn1)
    cache.store(turn1.extended(b"a", 100))
    assert len(cache) == 1 and cache.used == 650


def test_a_prompt_larger_than_the_cache_is_not_kept() -> None:
    cache = PrefixCache(100)
    cache.store(chain([b"big"], [500]))
    assert cache.used == 0 and cache.match(chain([b"big"], [500])) == 0


def test_a_cache_per_slot_keeps_each_slots_last_prompt_only() -> None:
    # llama.cpp --parallel 2 (issue 31): two conversations stay warm, a third evicts the
    # least recently used one whatever room the tokens leave; a returning turn that
    # extends its prompt keeps its slot.
    cache = PrefixCache(100_000, max_entries=2)
    a, b, c = (chain([name], [500]) for name in (b"a", b"b", b"c"))
    cache.store(a)
    cache.store(b)
    cache.store(a.extended(b"a2", 100))  # a's next turn: still two entries
    assert len(cache) == 2 and cache.match(b) == 500
    cache.store(c)  # a third conversation: a (the least recently used) goes
    assert cache.match(a) == 0
    assert cache.match(b) == 500 and cache.match(c) == 500


# -- the simulator ----------------------------------------------------------------------------
def one_node(cache_tokens: int, turns: int = 3, prefill: float = 1000.0) -> Scenario:
    node = caching("n", 50.0, prefill_tps=prefill, cache_tokens=cache_tokens)
    conv = Conversations(turns=(turns, turns), system_tokens=(1000, 1000),
                         user_tokens=(100, 100))
    return Scenario("t", "t", (node,), turns, noise_sigma=0.0, tokens=(100, 100),
                    conversations=conv)


def test_a_warm_turn_prefills_only_what_the_cache_lacks() -> None:
    trace = Simulator(one_node(100_000), "thompson", 1).run()
    first_token = 1 / 50.0
    # turn 1: 1,000 prompt tokens cold; turn 2: its 1,000 + 100 answer are cached, the new
    # 100-token message is prefilled; the same for turn 3
    assert trace.ttft_s[0] == pytest.approx(1.0 + first_token)
    assert trace.ttft_s[1] == pytest.approx(0.1 + first_token)
    assert trace.ttft_s[2] == pytest.approx(0.1 + first_token)
    assert trace.warm == [False, True, True]


def test_without_a_cache_every_turn_pays_its_whole_prompt() -> None:
    trace = Simulator(one_node(0), "thompson", 1).run()
    first_token = 1 / 50.0
    # prompts 1,000, 1,200, 1,400 tokens at 1,000 tok/s
    assert trace.ttft_s == pytest.approx([1.0 + first_token, 1.2 + first_token,
                                          1.4 + first_token])
    assert trace.warm == [False, False, False]


def test_a_cache_too_small_for_the_conversation_evicts_it() -> None:
    trace = Simulator(one_node(1050), "thompson", 1).run()
    assert trace.warm == [False, False, False]


def test_each_hop_of_a_chain_prefills_its_layers_from_its_own_cache() -> None:
    head = replace(NodeSpec("h", 0, 15, 32, 1.0 / (100.0 * 16)), prefill_tps=1000.0,
                   cache_tokens=100_000)
    tail = replace(NodeSpec("t", 16, 31, 32, 1.0 / (100.0 * 16)), prefill_tps=1000.0)
    conv = Conversations(turns=(2, 2), system_tokens=(1000, 1000), user_tokens=(100, 100))
    sc = Scenario("c", "c", (head, tail), 2, noise_sigma=0.0, tokens=(100, 100),
                  conversations=conv)
    trace = Simulator(sc, "thompson", 1).run()
    first_token = 1 / 50.0  # two hops at 100 tok/s over half the layers each
    assert trace.ttft_s[0] == pytest.approx(0.5 + 0.5 + first_token)
    # turn 2: the head holds 1,100 of 1,200 tokens, the cacheless tail prefills all 1,200
    assert trace.ttft_s[1] == pytest.approx(0.05 + 0.6 + first_token)


def test_conversations_arrive_concurrently_and_turns_in_order() -> None:
    sc = by_name("15-conv-roomy").scaled(300)
    sim = Simulator(sc, "thompson", 3)
    sim.run()
    by_index = sorted(sim.requests, key=lambda r: r.index)
    assert [r.index for r in by_index] == list(range(300))
    first_turns = [r for r in by_index[:sc.clients]]
    assert all(r.turn_of == 0 for r in first_turns)  # eight conversations open at once
    for r in sim.requests:
        if r.next_turn is not None:
            assert r.next_turn.index > r.index
            assert r.next_turn.arrival_s >= sim.done[r.index][0]
            assert r.next_turn.prompt is not None and r.prompt is not None
            assert r.next_turn.prompt.hashes[:len(r.prompt.hashes)] == r.prompt.hashes


def test_the_workload_has_growing_multi_turn_prompts_and_one_shots() -> None:
    sc = by_name("19-conv-mixed")
    assert sc.conversations is not None
    reqs = draw_conversations(sc, sc.conversations, random.Random(1))
    turns = [r.turn_of for r in reqs]
    assert max(turns) + 1 <= 30 and max(turns) >= 10
    firsts = [r for r in reqs if r.turn_of == 0]
    one_shots = sum(1 for r in firsts if r.next_turn is None)
    assert 0.3 < one_shots / len(firsts) < 0.7
    assert max(r.prompt.prompt_tokens for r in reqs if r.prompt) > 4000
    # the same seed draws the same workload (every policy faces the same conversations)
    again = draw_conversations(sc, sc.conversations, random.Random(1))
    assert [(r.tokens, r.prompt) for r in again] == [(r.tokens, r.prompt) for r in reqs]


def test_old_scenarios_have_no_prefill_and_no_cache() -> None:
    assert whole("x", 10.0).prefill_tps == 0.0 and whole("x", 10.0).cache_tokens == 0
    for sc in SCENARIOS:
        assert sc.conversations is None
        assert all(n.prefill_tps == 0.0 and n.cache_tokens == 0 for n in sc.nodes)
    sim = Simulator(SCENARIOS[0].scaled(50), "thompson", 1)
    sim.run()
    assert all(r.prompt is None and r.cached_tokens == -1 for r in sim.requests)
    assert {s.name for s in CONVERSATION_SCENARIOS}.isdisjoint(s.name for s in SCENARIOS)


def test_the_oracle_keeps_conversations_warm_on_a_roomy_mesh() -> None:
    trace = Simulator(by_name("15-conv-roomy").scaled(400), "oracle", 1).run()
    assert sum(trace.warm) / len(trace.warm) > 0.85


def test_a_long_conversation_costs_the_table_two_entries_per_route() -> None:
    table = PrefixTable()
    prompt = chain([b"system"], [500])
    for k in range(30):
        prompt = prompt.extended(f"user {k}".encode(), 50)
        table.served(prompt, "route-a")
        assert table.warm(prompt.extended(b"answer", 80).extended(b"next", 20)) == {
            "route-a": prompt.prompt_tokens + 80}
        prompt = prompt.extended(b"answer", 80)
    assert len(table) == 2
