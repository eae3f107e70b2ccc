"""Issue 31: a returning turn goes to the server that holds its conversation (two real
llama-servers moved turn 2 to the cold one, paying a whole cold prefill).

Two equal servers of two slots each (llama-server `--parallel 2`). Four conversations with
1,200-token system prompts start at once: their first turns are cold, two on each server,
their prefills sharing the server. Their next turns are warm; one of them waited behind its
neighbour's prefill although a slot was free. Then a returning turn is decided while its
warm server runs one request (a slot free) and the other server runs none or one. A fake
clock; each case is decided with 200 rngs.
"""

from __future__ import annotations

import random

import pytest

from meshroute_middleware.core import Arm, NodeRecord, Outcome, Router, RouterConfig
from meshroute_middleware.core.cache_prior import CachePrior, prior_warm_tokens
from meshroute_middleware.core.policies.thompson import ThompsonPolicy
from meshroute_middleware.core.prefix import Prefix, chain
from meshroute_middleware.core.routes import Hop, make_route

SYSTEM, USER, ANSWER = 1200, 20, 60
SLOTS = 2
DRAWS = 200


def _turn(conversation: int, turn: int) -> Prefix:
    """The prompt of a conversation's `turn` (1-based): its whole history."""
    prompt = chain([b"system %d" % conversation, b"user 1"], [SYSTEM, USER])
    for k in range(2, turn + 1):
        prompt = prompt.extended(b"answer %d" % (k - 1), ANSWER).extended(b"user %d" % k, USER)
    return prompt


def _mesh(cache: CachePrior | None) -> tuple[Router, list[float]]:
    now = [0.0]
    router = Router(RouterConfig(), clock=lambda: now[0], rng=random.Random(1))
    for name in ("a", "b"):
        router.upsert_node(NodeRecord(name, "m", 0, 29, 30, f"http://{name}.test", 20.0,
                                      cache=cache, slots=SLOTS))
    return router, now


def _share_home(router: Router, prompt: Prefix, home: str) -> float:
    """The share of DRAWS decisions (each with its own rng, then cancelled) sending
    `prompt` to `home`."""
    wins = 0
    for seed in range(DRAWS):
        router.rng = random.Random(seed)
        decision = router.choose("m", max_tokens=ANSWER, prefix=prompt)
        wins += decision.route.head.node_id == home
        router.cancel(decision)
    return wins / DRAWS


def _second_turns(router: Router, now: list[float], returning: set[int]) -> list[float]:
    """Four conversations' cold first turns (a server's two first tokens at 10 s and 20 s,
    each answer decoding in 3 s), then the `returning` ones' turn 2 as their first ends;
    a warm turn's first
    token comes in 0.6 s, or once its neighbour's cold prefill is done (one thread per
    server: a slot was free, the thread was not). Returns, per turn 2, the share of
    decisions sending it home."""
    firsts = [router.choose("m", max_tokens=ANSWER, prefix=_turn(c, 1)) for c in range(4)]
    home = {c: d.route.head.node_id for c, d in enumerate(firsts)}
    assert sorted(home.values()) == ["a", "a", "b", "b"]  # spread by what is in flight
    shares, seconds = [], {}
    first_tokens = {c: 10.0 if c < 2 else 20.0 for c in range(4)}
    events = sorted((first_tokens[c] + 3.0, c, 1) for c in range(4))
    while events:
        t, c, turn = events.pop(0)
        now[0] = t
        if turn == 1:
            router.record(firsts[c], Outcome(ANSWER, t, t - 3.0))
            if c not in returning:
                continue
            shares.append(_share_home(router, _turn(c, 2), home[c]))
            seconds[c] = router.choose("m", pin=[home[c]], max_tokens=ANSWER,
                                       prefix=_turn(c, 2))
            neighbour = max(first_tokens[n] for n in range(4) if home[n] == home[c])
            ttfb = max(neighbour - t, 0.0) + 0.6
            events = sorted([*events, (t + ttfb + 3.0, c, 2)])
        else:
            begun = first_tokens[c] + 3.0
            router.record(seconds[c], Outcome(ANSWER, t - begun, t - begun - 3.0))
    return shares


@pytest.mark.parametrize("cache", [
    None,                       # the agents say nothing of their caches
    CachePrior(0.0, 8192),      # a hit rate of 0: every prompt so far was new
    CachePrior(0.05, 8192),     # nearly every prompt so far was new
    CachePrior(0.5, 8192),
    CachePrior(None, 8192),     # only the context a slot holds
], ids=["no-report", "hit-0", "hit-0.05", "hit-0.5", "context-only"])
@pytest.mark.parametrize("returning", [
    {0, 1, 2, 3},   # all return: each server runs one request as each turn 2 comes
    {0, 2},         # b's do not: b is idle when a's second conversation returns
], ids=["all-return", "other-idle"])
def test_turn_two_goes_to_its_warm_server(cache: CachePrior | None,
                                          returning: set[int]) -> None:
    router, now = _mesh(cache)
    shares = _second_turns(router, now, returning)
    assert min(shares) >= 0.95, shares


@pytest.mark.parametrize(("hit_rate", "context", "known", "samples", "credited"), [
    (None, None, 1400, 0, 1400),
    (0.05, None, 1400, 0, 1400),    # a rate over past prompts says nothing of this prefix
    (0.5, 8192, 1400, 3, 1400),
    (1.0, None, 1400, 0, 1400),
    (0.5, 1000, 1400, 0, 1000),     # a slot holds 1,000 tokens: no more is kept
    (0.0, None, 1400, 0, 1400),     # none of its recent prompts was found: no news of this
    (0.0, 1000, 1400, 4, 1200),     # the slot's bound fades as the route's samples arrive
    (0.3, None, 0, 0, 0),           # nothing known warm: nothing credited
])
def test_a_hit_rate_never_shrinks_a_prefix_the_router_saw_served(
        hit_rate: float | None, context: int | None, known: int, samples: float,
        credited: int) -> None:
    assert prior_warm_tokens(CachePrior(hit_rate, context), known, samples) == credited


@pytest.mark.parametrize(("slots", "stays"), [(2, True), (4, True), (1, False),
                                              (None, False)])
def test_the_learned_wait_is_charged_only_when_every_announced_slot_is_taken(
        slots: int | None, stays: bool) -> None:
    # Two routes alike: a cold prompt's first token in 4 s, a warm one's in 0.5 s, and a
    # warm turn that began with one ahead waited 12 s behind a neighbour's long prefill. A
    # warm turn arriving with one in flight on a stays where a slot is free (announced);
    # on a full route, or one silent on its slots, it would wait more than moving costs.
    policy = ThompsonPolicy()
    t = 0.0
    for k in range(21):
        for sig in ("m|a[0-29]", "m|b[0-29]"):
            history = [(1300, 4.0, 0), (50, 0.5, 0)] if k < 20 else [(50, 12.5, 1)]
            for uncached, ttfb, ahead in history:
                t += 1.0
                policy.observe(sig, Outcome(ANSWER, ttfb + 3.0, ttfb, uncached_tokens=uncached,
                                            concurrency=1.0, ahead=ahead,
                                            slot_free=slots is not None and ahead < slots), t)
    prompt = _turn(0, 2)
    wins = 0
    for seed in range(DRAWS):
        arms = [_arm("a", 1, slots), _arm("b", 0, slots)]
        for each in arms:
            each.prefix = prompt
        arms[0].warm_tokens = prompt.prompt_tokens - USER
        wins += policy.choose(arms, t, random.Random(seed))[0] == 0
    assert (wins / DRAWS >= 0.95) if stays else (wins / DRAWS <= 0.05)


def _arm(name: str, in_flight: int, slots: int | None) -> Arm:
    node = NodeRecord(name, "m", 0, 29, 30, f"http://{name}.test", 20.0, slots=slots)
    return Arm(make_route("m", [Hop(node, 0, 29)]), None, in_flight)
