"""Issue 26: prefix-cache affinity learned by thompson, and the fixed rules beside it."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from meshroute_middleware.core import Arm, NodeRecord, Outcome, Router, RouterConfig
from meshroute_middleware.core.policies.cache_rules import (
    BALANCE_ABS,
    CacheAwarePolicy,
    LeastLoadedPolicy,
    SessionStickyPolicy,
)
from meshroute_middleware.core.policies.first_token import FirstTokens
from meshroute_middleware.core.policies.prefill import PrefillFit, PrefillModel
from meshroute_middleware.core.policies.thompson import ThompsonPolicy
from meshroute_middleware.core.prefix import (
    PrefixTable,
    chain,
    message_chain,
    message_key,
    session_key,
)
from meshroute_middleware.core.providers.chain import MAX_SESSION_ID_BYTES
from meshroute_middleware.core.routes import Hop, make_route
from meshroute_middleware.core.saturation import CURVES
from meshroute_middleware.core.sim.engine import Simulator
from meshroute_middleware.core.sim.metrics import route_share
from meshroute_middleware.core.sim.model import NodeSpec
from meshroute_middleware.core.sim.scenarios import by_name
from meshroute_middleware.http.errors import RequestError
from meshroute_middleware.http.request import check_session_id, parse_chat


def arm(name: str, in_flight: int = 0, prior: float = 10.0) -> Arm:
    node = NodeRecord(name, "m", 0, 31, 32, f"http://{name}.test", prior)
    return Arm(make_route("m", [Hop(node, 0, 31)]), None, in_flight)


# -- what a warm prefix saves -------------------------------------------------------------
def test_the_fit_recovers_base_and_prefill_cost_from_warm_and_cold_samples() -> None:
    rng = random.Random(4)
    fit = PrefillFit()
    for _ in range(300):
        uncached = rng.choice([100, 300, 2000, 5000])
        fit.add(uncached, 0.2 + uncached / 1000.0 * rng.lognormvariate(0.0, 0.1))
    base, slope = fit.solve(0.0, 0.0, 2.0)
    assert base == pytest.approx(0.2, abs=0.1)
    assert slope == pytest.approx(1.0, rel=0.1)  # seconds per 1,000 tokens


def test_the_slope_is_learned_not_assumed() -> None:
    model = PrefillModel()
    assert model.prefill_s("m", "r", 5000) == 0.0  # nothing seen: a warm prefix saves nothing
    for _ in range(50):  # prompts cost nothing on this route whatever their length
        model.add("m", "r", 100, 0.3)
        model.add("m", "r", 5000, 0.3)
    assert model.prefill_s("m", "r", 5000) == pytest.approx(0.0, abs=0.01)


@pytest.mark.parametrize(("cold_s", "warm_s"), [(3.6, 0.2), (3.6, 3.5)])
def test_first_turns_of_one_size_are_read_as_prefill_until_warm_turns_tell(
        cold_s: float, warm_s: float) -> None:
    # A real llama-server (issue 31): four conversations' cold first turns of ~320 tokens
    # take 3.6 s each. Every sample at one size cannot split base from slope: the time is
    # the prefill's, so moving a returning turn is priced at its whole cold prefill.
    model = PrefillModel()
    for _ in range(4):
        model.add("m", "r", 320, cold_s)
    assert model.prefill_s("m", "r", 320) > 0.75 * cold_s  # the ridge split gave 0.1x
    # warm turns (18 uncached tokens) then say what a warm prefix saves: nearly all of it
    # on a caching server, nothing on one whose first token costs the same warm or cold
    for _ in range(8):
        model.add("m", "r", 18, warm_s)
    assert model.prefill_s("m", "r", 320) == pytest.approx(cold_s - warm_s, abs=0.4)


def test_an_answer_that_came_whole_teaches_no_prefill() -> None:
    # Not streamed: the first byte is the last, so its time is decode and prefill together.
    # Read as a first token it made a serial node decoding at 22 tok/s look twice as fast.
    policy = ThompsonPolicy()
    for k in range(20):
        policy.observe("m|a[0-31]", Outcome(200, 1.2, 1.2, uncached_tokens=400, concurrency=1.0),
                       float(k))
    estimate = policy.estimate("m|a[0-31]")
    assert estimate is not None and estimate == pytest.approx(200 / 1.2, rel=0.1)
    probe = arm("a")
    probe.prefix = chain([b"system", b"user"], [300, 100])
    assert policy.expected_ttft(probe) is None  # nothing learnt of the prefill


def test_a_route_fed_cold_prompts_is_not_learnt_slower() -> None:
    # Two routes decoding at the same 50 tok/s: A receives only cold 5,000-token prompts
    # (5 s of prefill), B warm ones. With affinity the prefill is left out of the speed.
    def learn(policy: ThompsonPolicy) -> tuple[float, float]:
        for k in range(200):
            for sig, uncached in (("m|a", 5000), ("m|b", 200)):
                ttfb = 0.1 + uncached / 1000.0
                policy.observe(sig, Outcome(200, ttfb + 4.0, ttfb, uncached_tokens=uncached,
                                            concurrency=1.0), float(k))
        a, b = policy.estimate("m|a"), policy.estimate("m|b")
        assert a is not None and b is not None
        return a, b

    a, b = learn(ThompsonPolicy())
    assert a == pytest.approx(b, rel=0.1)
    blind_a, blind_b = learn(ThompsonPolicy(affinity=False))
    assert blind_a < 0.6 * blind_b


# -- decisions ------------------------------------------------------------------------------
def test_requests_without_a_prompt_are_decided_as_before() -> None:
    def decisions(policy: str) -> list[str]:
        now = [0.0]
        router = Router(RouterConfig(policy=policy), clock=lambda: now[0],
                        rng=random.Random(5))
        for name, tps in (("a", 60.0), ("b", 50.0), ("c", 40.0)):
            router.upsert_node(NodeRecord(name, "m", 0, 31, 32, f"http://{name}.test", tps))
        speeds = {"a": 60.0, "b": 50.0, "c": 40.0}
        out = []
        for k in range(300):
            d = router.choose("m", max_tokens=256)
            tps = speeds[d.route.head.node_id] * (1.0 + 0.1 * ((k * 7) % 5 - 2) / 2)
            now[0] += 1.0
            router.record(d, Outcome(200, 200 / tps, 0.1))
            out.append(d.signature)
        return out

    assert decisions("thompson") == decisions("thompson-blind")


def run(scenario: str, policy: str, requests: int, seed: int = 1) -> Simulator:
    sim = Simulator(by_name(scenario).scaled(requests), policy, seed)
    sim.run()
    return sim


def test_thompson_learns_to_keep_conversations_on_their_warm_route() -> None:
    ours = Simulator(by_name("15-conv-roomy").scaled(600), "thompson", 2).run()
    blind = Simulator(by_name("15-conv-roomy").scaled(600), "thompson-blind", 2).run()
    ours_warm = sum(ours.warm) / len(ours.warm)
    blind_warm = sum(blind.warm) / len(blind.warm)
    assert ours_warm > blind_warm + 0.05
    assert sum(ours.ttft_s) < 0.6 * sum(blind.ttft_s)


def test_affinity_breaks_when_the_warm_node_slows() -> None:
    # Scenario 16 at 900 turns: node a slows 5x at turn 300 and recovers at 600. Soon after
    # the slowdown thompson sends it few turns although a third of the conversations are warm
    # there; session-sticky keeps sending them.
    def share(policy: str) -> float:
        sim = run("16-conv-slowdown", policy, 900)
        t0 = next(r.arrival_s for r in sim.requests if r.index == 400)
        t1 = next(r.arrival_s for r in sim.requests if r.index == 600)
        value = route_share(sim.requests, ("a",), t0, t1)
        assert value is not None
        return value

    assert share("thompson") < 0.05
    assert share("session-sticky") > 0.15


def test_a_conversation_moves_when_its_warm_route_saturates() -> None:
    # Scenario 17: 16 conversations, the fast node runs 4 at once and slows steeply beyond:
    # sticking to it queues (session-sticky), ignoring caches prefills (thompson-blind).
    def mean_ttft(policy: str) -> float:
        sim = run("17-conv-saturates", policy, 800)
        return sum(r.ttfb_s for r in sim.requests) / len(sim.requests)

    ours = mean_ttft("thompson")
    assert ours < 0.5 * mean_ttft("session-sticky")
    assert ours < 0.5 * mean_ttft("thompson-blind")


# -- the fixed rules ------------------------------------------------------------------------
def test_session_sticky_keeps_a_conversation_and_moves_only_a_leaving_routes() -> None:
    policy, rng = SessionStickyPolicy(), random.Random(1)
    arms = [arm("a"), arm("b"), arm("c")]
    picks = {}
    for k in range(60):
        prompt = chain([f"conv-{k}".encode()], [100])
        for a in arms:
            a.prefix = prompt
        picks[k] = arms[policy.choose(arms, 0.0, rng)[0]].signature
        later = prompt.extended(b"answer", 50)
        for a in arms:
            a.prefix = later
        assert arms[policy.choose(arms, 0.0, rng)[0]].signature == picks[k]
    assert len(set(picks.values())) == 3
    fewer = [a for a in arms if a.signature != "m|a"]
    for k in range(60):
        prompt = chain([f"conv-{k}".encode()], [100])
        for a in fewer:
            a.prefix = prompt
        now = fewer[policy.choose(fewer, 0.0, rng)[0]].signature
        if picks[k] != "m|a":
            assert now == picks[k]


def test_least_loaded_takes_the_fewest_in_flight() -> None:
    arms = [arm("a", 3), arm("b", 1), arm("c", 2)]
    assert LeastLoadedPolicy().choose(arms, 0.0, random.Random(0))[0] == 1


def test_the_cache_aware_rule_takes_the_warm_route_until_the_load_is_out_of_balance() -> None:
    policy, rng = CacheAwarePolicy(), random.Random(0)
    prompt = chain([b"s", b"u"], [1000, 100])
    arms = [arm("a", 2), arm("b", 0), arm("c", 1)]
    for a in arms:
        a.prefix = prompt
    arms[0].warm_tokens = 1000
    assert policy.choose(arms, 0.0, rng)[0] == 0
    arms[0].in_flight = BALANCE_ABS + 1
    assert policy.choose(arms, 0.0, rng)[0] == 1
    arms[0].in_flight, arms[0].warm_tokens = 2, 100  # too little of the prompt is warm
    assert policy.choose(arms, 0.0, rng)[0] == 1


def test_the_router_knows_which_route_served_a_prefix_and_tells_the_policy() -> None:
    seen: list[list[tuple[str, int]]] = []

    class Spy(LeastLoadedPolicy):
        def choose(self, arms, now, rng):  # type: ignore[no-untyped-def]
            seen.append([(a.signature, a.warm_tokens) for a in arms])
            return super().choose(arms, now, rng)

    router = Router(clock=lambda: 0.0, policy=Spy())
    for name in ("a", "b"):
        router.upsert_node(NodeRecord(name, "m", 0, 31, 32, f"http://{name}.test", 10.0))
    turn1 = chain([b"system", b"user"], [800, 100])
    d = router.choose("m", prefix=turn1)
    assert d.uncached_tokens == 900
    router.record(d, Outcome(50, 2.0, 1.0))
    turn2 = turn1.extended(b"answer", 50).extended(b"user 2", 30)
    d2 = router.choose("m", prefix=turn2)
    # the prompt it served and the answer it generated
    assert dict(seen[-1]) == {d.signature: 950, **{s: 0 for s, _ in seen[-1]
                                                    if s != d.signature}}
    assert d2.prefix == turn2
    failed = router.choose("m", prefix=chain([b"other"], [10]))
    router.record(failed, Outcome(0, 1.0, 0.0, "stream"))
    assert router.prefixes.warm(chain([b"other"], [10])) == {}  # a failure cached nothing


# -- x-session-id as a hint -----------------------------------------------------------------
def test_a_session_id_recognises_a_conversation_whose_history_was_trimmed() -> None:
    seen: list[dict[str, int]] = []

    class Spy(LeastLoadedPolicy):
        def choose(self, arms, now, rng):  # type: ignore[no-untyped-def]
            seen.append({a.signature: a.warm_tokens for a in arms})
            return super().choose(arms, now, rng)

    router = Router(clock=lambda: 0.0, policy=Spy())
    for name in ("a", "b"):
        router.upsert_node(NodeRecord(name, "m", 0, 31, 32, f"http://{name}.test", 10.0))
    first = message_chain([{"role": "system", "content": "s" * 4000},
                           {"role": "user", "content": "u" * 400}], "conv-7")
    assert first is not None
    d = router.choose("m", prefix=first)
    router.record(d, Outcome(50, 2.0, 1.0))
    # the client summarised the history: no message in common with what was served
    summary = [{"role": "user", "content": "a summary " * 40}]
    hinted, unhinted = message_chain(summary, "conv-7"), message_chain(summary)
    assert hinted is not None and unhinted is not None
    router.choose("m", prefix=unhinted)
    assert set(seen[-1].values()) == {0}  # without the hint: a new conversation
    router.choose("m", prefix=hinted)
    assert seen[-1][d.signature] == hinted.prompt_tokens  # with it: the route that served it
    assert all(v == 0 for s, v in seen[-1].items() if s != d.signature)
    other = message_chain(summary, "conv-8")
    assert other is not None
    router.choose("m", prefix=other)
    assert set(seen[-1].values()) == {0}  # another session's id is another conversation


def test_the_session_hints_are_bounded_and_keep_no_id() -> None:
    table = PrefixTable(sessions=4)
    prompts = [chain([b"m"], [100], session_key(f"s{k}")) for k in range(6)]
    for p in prompts:
        table.served(p, "m|a")
    assert len(table._sessions) == 4
    assert all(isinstance(k, int) for k in table._sessions)  # hashes, not the ids
    summary = chain([b"other"], [50], session_key("s0"))
    assert table.warm(summary) == {}  # the oldest hint was forgotten
    assert table.warm(chain([b"other"], [50], session_key("s5"))) == {"m|a": 50}


def test_the_session_hint_reaches_the_prefix_from_the_edge() -> None:
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
    assert parse_chat(body, session_id="conv-1").prefix == message_chain(
        [{"role": "user", "content": "hi"}], "conv-1")
    assert parse_chat(body, session_id="conv-1").prefix != parse_chat(body).prefix
    scope = {"type": "http", "headers": [(b"x-session-id", b"conv-1")]}
    assert check_session_id(scope) == "conv-1"
    assert check_session_id({"type": "http", "headers": []}) is None
    with pytest.raises(RequestError) as err:
        check_session_id({"type": "http",
                          "headers": [(b"x-session-id", b"s" * (MAX_SESSION_ID_BYTES + 1))]})
    assert err.value.status == 400


# -- what is in flight: the wait for a slot -------------------------------------------------
def _learnt_knee(policy: ThompsonPolicy, sig: str, s1: float, knee: int, slowdown: float,
                 upto: int = 6) -> None:
    """Samples of a route whose batch holds `knee` requests, each slowed by `slowdown` per
    neighbour, the rest queueing (scenario 17's nodes), at 1..upto in flight; warm and
    cold prompts of a 1,000 tok/s prefill."""
    t = 0.0
    for _ in range(40):
        for c in range(1, upto + 1):
            speed = s1 / (1 + slowdown * (min(c, knee) - 1)) * min(1.0, knee / c)
            for uncached in (0, 2000):
                t += 1.0
                ttfb = 0.1 + uncached / 1000
                policy.observe(sig, Outcome(200, ttfb + 200 / speed, ttfb,
                                            uncached_tokens=uncached, concurrency=float(c)), t)


def test_a_warm_turn_leaves_a_full_batch_when_the_wait_costs_more_than_its_prefill() -> None:
    # Route a is fast but runs 4 at once (the rest queue); b is a third as fast with room.
    # The conversation is warm on a (1,500 tokens). With 3 others on a it stays; with 5 it
    # would wait for half an answer's time before its first token: a cold prefill on b is
    # sooner. Scored by tokens/s alone (before) it stayed and queued.
    policy = ThompsonPolicy()
    _learnt_knee(policy, "m|a[0-31]", 90.0, 4, 0.25)
    _learnt_knee(policy, "m|b[0-31]", 30.0, 16, 0.05)
    prompt = chain([b"system", b"user"], [1500, 100])

    def stays(in_flight: int) -> float:
        rng, wins = random.Random(3), 0
        for _ in range(200):
            arms = [arm("a", in_flight), arm("b", 3)]
            for a in arms:
                a.prefix = prompt
            arms[0].warm_tokens = 1500
            wins += policy.choose(arms, 500.0, rng)[0] == 0
        return wins / 200

    assert stays(3) > 0.9
    assert stays(5) < 0.1


def test_the_wait_for_a_slot_is_learned_from_first_tokens_where_the_knee_cannot_tell_it() -> None:
    # Route a was only ever measured at 1-4 in flight (its curve past 4 is unknown), but the
    # first tokens of requests that began with 4 ahead came 3 s late: a warm turn arriving
    # with 4 in flight there moves to b, cold; with 2 ahead it stays.
    policy = ThompsonPolicy()
    _learnt_knee(policy, "m|b[0-31]", 30.0, 16, 0.05)
    t = 0.0
    for _ in range(40):
        for ahead in range(5):
            c = min(ahead + 1, 4)
            wait = 3.0 if ahead >= 4 else 0.0
            for uncached in (0, 2000):
                t += 1.0
                ttfb = 0.1 + uncached / 1000 + wait
                policy.observe("m|a[0-31]", Outcome(
                    200, ttfb + 200 / (90.0 / (1 + 0.25 * (c - 1))), ttfb,
                    uncached_tokens=uncached, concurrency=float(c), ahead=ahead), t)
    prompt = chain([b"system", b"user"], [1500, 100])

    def stays(in_flight: int) -> float:
        rng, wins = random.Random(3), 0
        for _ in range(200):
            arms = [arm("a", in_flight), arm("b", 3)]
            for a in arms:
                a.prefix = prompt
            arms[0].warm_tokens = 1500
            wins += policy.choose(arms, t, rng)[0] == 0
        return wins / 200

    assert stays(2) > 0.9
    assert stays(4) < 0.1


def test_the_router_tells_the_policy_how_many_were_ahead() -> None:
    seen: list[int] = []

    class Spy(LeastLoadedPolicy):
        def observe(self, signature: str, outcome: Outcome, now: float) -> None:
            seen.append(outcome.ahead)

    router = Router(clock=lambda: 0.0, policy=Spy())
    router.upsert_node(NodeRecord("a", "m", 0, 31, 32, "http://a.test", 10.0))
    first, second = router.choose("m"), router.choose("m")
    router.record(second, Outcome(50, 2.0, 1.0))
    router.record(first, Outcome(50, 2.0, 1.0))
    third = router.choose("m")
    router.record(third, Outcome(50, 2.0, 1.0))
    assert seen == [1, 0, 0]


def test_the_inlined_message_chain_is_the_chain_of_the_message_keys() -> None:
    rng = random.Random(1)
    contents: list[object] = ["hi", "x" * 999, [{"type": "text", "text": "a"}], None, 5,
                              "\ud800"]
    for _ in range(500):
        messages = [{"role": rng.choice(["user", "system", None]),
                     "content": rng.choice(contents)} for _ in range(rng.choice([1, 3, 300]))]
        session = rng.choice([None, "s1"])
        keys = [message_key(m["role"], m["content"]) for m in messages]
        assert message_chain(messages, session) == chain(
            [k for k, _ in keys], [n for _, n in keys], session_key(session))


def test_a_new_conversation_goes_to_the_least_loaded_of_routes_about_as_fast() -> None:
    # Three equal routes with room (no slowdown per neighbour) and 3, 2 and 1 in flight, a
    # prompt none of them holds: the posterior's noise alone picked (c about a fifth of the
    # time); now the least loaded takes it. A warm turn stays warm, and a route three times
    # as fast still wins with more in flight.
    def learnt(speeds: dict[str, float]) -> ThompsonPolicy:
        policy = ThompsonPolicy()
        for name, s1 in speeds.items():
            _learnt_knee(policy, f"m|{name}[0-31]", s1, 16, 0.0)
        for name, s1 in speeds.items():  # one more sample each: all as fresh (no drift)
            policy.observe(f"m|{name}[0-31]", Outcome(
                200, 0.1 + 200 / s1, 0.1, uncached_tokens=0, concurrency=1.0), 480.0)
        return policy

    prompt = chain([b"system", b"user"], [1500, 100])

    def share(policy: ThompsonPolicy, pick: int, warm: int = -1) -> float:
        rng, wins = random.Random(3), 0
        for _ in range(200):
            arms = [arm(name, n) for name, n in zip("abc", (3, 2, 1), strict=True)]
            for a in arms:
                a.prefix = prompt
            if warm >= 0:
                arms[warm].warm_tokens = 1500
            wins += policy.choose(arms, 480.0, rng)[0] == pick
        return wins / 200

    equal = learnt({"a": 60.0, "b": 60.0, "c": 60.0})
    assert share(equal, pick=2) > 0.95
    assert share(equal, pick=0, warm=0) > 0.9
    assert share(learnt({"a": 90.0, "b": 30.0, "c": 30.0}), pick=0) > 0.9


def test_before_any_answer_new_conversations_spread_by_what_is_in_flight() -> None:
    # A cold start (scenario 17): every route has requests in flight and none answered yet,
    # so speeds and batch sizes are only the advertised priors. A prompt no route holds goes
    # to the least loaded of the routes advertised at a quarter of the fastest's speed or
    # more; by the prior's draw it mostly went to the fastest-advertised, whose small batch
    # may already be full, and by in-flight counts alone to a route advertised at a fifth.
    def picks(routes: tuple[tuple[str, int, float], ...]) -> list[int]:
        policy = ThompsonPolicy()
        prompt = chain([b"system", b"user"], [1500, 100])
        rng, wins = random.Random(3), [0] * len(routes)
        for _ in range(200):
            arms = [arm(name, n, prior) for name, n, prior in routes]
            for a in arms:
                a.prefix = prompt
            wins[policy.choose(arms, 0.0, rng)[0]] += 1
        return wins

    assert picks((("a", 5, 90.0), ("b", 3, 60.0), ("c", 2, 30.0))) == [0, 0, 200]
    assert picks((("a", 5, 60.0), ("b", 3, 60.0), ("c", 2, 12.0))) == [0, 200, 0]


# -- the announced batch ---------------------------------------------------------------------
def test_a_full_batch_announced_draws_lower_before_any_sample() -> None:
    # Nothing measured yet: a route whose server says it runs 4 at once, with 4 in flight,
    # is believed to queue the next request (its draws mostly say so); one that says nothing
    # may have any knee.
    policy, rng = ThompsonPolicy(), random.Random(7)

    def mean_score(slots: int | None) -> float:
        node = NodeRecord("a", "m", 0, 31, 32, "http://a.test", 90.0, slots=slots)
        a = Arm(make_route("m", [Hop(node, 0, 31)]), None, 4)
        return sum(policy.score(a, None, 0.0, rng) for _ in range(2000)) / 2000

    assert mean_score(4) < 0.8 * mean_score(None)
    assert mean_score(64) == pytest.approx(mean_score(None), rel=0.1)  # past the grid: silent


def test_announced_slots_keep_the_first_conversations_off_a_small_batch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Scenario 17's 16 conversations arrive before any answer; the fast node runs 4 at
    # once. Its announced slots (as `meshroute node` sends them) spare the first turns the
    # queue they paid while the policy had to learn the batch from its answers.
    def mean_ttft() -> float:
        total = 0.0
        for seed in (1, 2, 3, 4):
            sim = run("17-conv-saturates", "thompson", 400, seed)
            total += sum(r.ttfb_s for r in sim.requests) / len(sim.requests)
        return total

    told = mean_ttft()
    announce = NodeSpec.record
    monkeypatch.setattr(NodeSpec, "record",
                        lambda self, tps: replace(announce(self, tps), slots=None))
    silent = mean_ttft()
    assert told < 0.9 * silent  # 1.01 s against 1.19 s summed over the four seeds


def test_neighbours_loss_counts_only_while_the_request_decodes() -> None:
    # A 32-token answer behind a 1,000-token cold prompt on a route with 8 in flight that
    # slows 10 % per neighbour: it decodes for 1 s of its 3.1 s. Its neighbours' loss
    # counted in full (8 x 60 x (g(8) - g(9)) x 0.5 = 7.7 tok/s against its own 10.3) put
    # the busy route (2.6) below an idle one five times slower (6.6), and new conversations
    # fled there (bench_realtime.py slow-a); counted while it decodes, 7.9.
    first = FirstTokens()
    j = CURVES.index((16.0, 0.1))
    prompt = chain([b"system", b"user"], [1000, 60])
    busy, idle = arm("b", 8, 60.0), arm("a", 0, 12.0)
    for a in (busy, idle):
        a.prefix = prompt
        for _ in range(10):  # both prefill 1,000 tokens a second
            for uncached in (0, 1000, 2000):
                first.prefill.add("m", a.route.signature, uncached, 0.02 + uncached / 1000)
    busy_score = first.score(busy, (1.0, 60.0, j), 32.0)
    idle_score = first.score(idle, (1.0, 12.0, j), 32.0)
    assert busy_score == pytest.approx(7.9, abs=0.2)
    assert idle_score == pytest.approx(6.6, abs=0.2)
