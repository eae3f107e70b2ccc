"""Per-request objectives on the mesh (issue 26): `ttft` moves traffic to the route whose first
token comes soonest; no objective, `throughput` and `cost` decide exactly as before."""

from __future__ import annotations

import random
from typing import Any

import pytest

from meshroute_middleware.core import NodeRecord, Outcome, Router, RouterConfig
from meshroute_middleware.core.objectives import (
    COST,
    OBJECTIVES,
    THROUGHPUT,
    TTFT,
    InvalidObjectiveError,
    parse_objective,
)
from meshroute_middleware.core.policies import Arm
from meshroute_middleware.core.policies.thompson import ThompsonPolicy
from meshroute_middleware.core.prefix import Prefix, message_chain
from meshroute_middleware.core.sim.engine import run
from meshroute_middleware.core.sim.scenarios import CONVERSATION_SCENARIOS, SCENARIOS

from ..conftest import FakeClock

# Two whole-model nodes: "burst" decodes at 100 tok/s but takes 2 s to its first token;
# "quick" decodes at 40 tok/s with its first token after 0.2 s.
TRUTH = {"m|burst[0-39]": (2.0, 100.0), "m|quick[0-39]": (0.2, 40.0)}
ANSWER_TOKENS = 400  # 2 + 4 = 6 s on burst, 0.2 + 10 = 10.2 s on quick: burst wins throughput


def two_nodes(clock: FakeClock, policy: str = "thompson") -> Router:
    router = Router(RouterConfig(policy=policy), clock=clock, rng=random.Random(5))
    for name in ("burst", "quick"):
        router.upsert_node(NodeRecord(name, "m", 0, 39, 40, f"http://{name}.test", tps=50.0))
    clock.advance(1.0)
    return router


def served(router: Router, clock: FakeClock, n: int, **choose: object) -> list[str]:
    """The signatures of `n` sequential requests, each fed its true outcome."""
    seen = []
    for _ in range(n):
        d = router.choose("m", **choose)  # type: ignore[arg-type]
        first, tps = TRUTH[d.signature]
        seconds = first + ANSWER_TOKENS / tps
        clock.advance(seconds)
        router.record(d, Outcome(ANSWER_TOKENS, seconds, first))
        seen.append(d.signature)
    return seen


@pytest.mark.parametrize("policy", ["thompson", "adr0021"])
def test_a_fast_decoder_with_a_slow_first_token_loses_ttft_traffic(policy: str) -> None:
    """The same two routes, the same outcomes: by throughput the fast decoder takes most of
    the traffic, under `ttft` the quick first token does (any policy: the rule reads the
    measured first-token times)."""
    clock = FakeClock()
    router = two_nodes(clock, policy)
    by_throughput = served(router, clock, 60)
    clock = FakeClock()
    router = two_nodes(clock, policy)
    by_ttft = served(router, clock, 60, objective=TTFT)
    late = slice(20, None)
    assert by_throughput[late].count("m|burst[0-39]") > 20  # of 40: the fast decoder leads
    assert by_ttft[late].count("m|quick[0-39]") >= 36  # of 40
    assert set(by_ttft[:4]) == set(TRUTH)  # both tried before either is preferred


def test_a_ttft_decision_carries_its_objective_into_its_fallbacks() -> None:
    clock = FakeClock()
    router = two_nodes(clock)
    served(router, clock, 20, objective=TTFT)
    d = router.choose("m", objective=TTFT)
    assert d.objective == TTFT
    assert d.ranked  # the other route, ranked by first-token time
    following = router.fallback(d)
    assert following is not None and following.objective == TTFT
    assert router.choose("m").objective == THROUGHPUT


def test_ttft_counts_the_warm_prefix_thompson_learned() -> None:
    """With a prompt, `ttft` reads thompson's prefill fit (base + 1 s per 1,000 uncached
    tokens on both routes, bases 1.5 s and 0.1 s): a long prompt goes to the route of the
    quicker base when it is cold everywhere, and to the one holding it warm otherwise."""
    clock = FakeClock()
    router = two_nodes(clock)
    base = {"m|burst[0-39]": 1.5, "m|quick[0-39]": 0.1}
    for i in range(60):  # distinct cold prompts of 10 to ~1,500 tokens
        prompt = message_chain([{"role": "user", "content": f"{i} " + "x" * (600 * (i % 10))}])
        d = router.choose("m", prefix=prompt, objective=TTFT)
        first = base[d.signature] + d.uncached_tokens / 1000.0
        clock.advance(first + 1.0)
        router.record(d, Outcome(100, first + 1.0, first))
    long = message_chain([{"role": "user", "content": "y" * 16_000}])
    assert long is not None and long.prompt_tokens > 2000
    policy = router.policy
    assert isinstance(policy, ThompsonPolicy)
    estimate = policy.expected_ttft
    cold = {a.signature: estimate(_with(a, long, 0)) for a in router.arms("m")}
    assert cold["m|quick[0-39]"] == pytest.approx(0.1 + long.prompt_tokens / 1000, rel=0.2)
    assert cold["m|burst[0-39]"] == pytest.approx(1.5 + long.prompt_tokens / 1000, rel=0.2)
    picks = _picks(router, long)
    assert picks.count("m|quick[0-39]") >= 16
    router.prefixes.served(long, "m|burst[0-39]")
    picks = _picks(router, long)
    assert picks.count("m|burst[0-39]") >= 16


def _picks(router: Router, prefix: Prefix, n: int = 20) -> list[str]:
    """Where `n` requests would go, each alone in flight."""
    out = []
    for _ in range(n):
        d = router.choose("m", prefix=prefix, objective=TTFT)
        router.cancel(d)
        out.append(d.signature)
    return out


def _with(arm: Arm, prefix: Prefix, warm: int) -> Arm:
    arm.prefix, arm.warm_tokens = prefix, warm
    return arm


def test_without_an_objective_decisions_are_bit_identical() -> None:
    """Default, `throughput` and `cost` (every mesh route is free) take the policy's own
    choice: the same rng draws, the same decisions, outcome for outcome."""
    runs = []
    for choose in ({}, {"objective": THROUGHPUT}, {"objective": COST}):
        clock = FakeClock()
        runs.append(served(two_nodes(clock), clock, 80, **choose))
    assert runs[0] == runs[1] == runs[2]


@pytest.mark.parametrize("value", OBJECTIVES)
def test_the_objectives_parse_as_themselves(value: str) -> None:
    assert parse_objective(value, "x") == value


@pytest.mark.parametrize(("value", "shown"), [
    ("fast", "'fast'"), ("TTFT", "'TTFT'"), (3, "a JSON number"), (None, "a JSON null"),
    (["ttft"], "a JSON array"), ({"a": 1}, "a JSON object"), (True, "a JSON boolean"),
    ("y" * 200, "'" + "y" * 39)])
def test_a_bad_objective_names_the_allowed_values(value: object, shown: str) -> None:
    with pytest.raises(InvalidObjectiveError) as err:
        parse_objective(value, "'meshroute.objective'")
    message = str(err.value)
    assert message.startswith("'meshroute.objective' must be one of 'throughput', 'ttft', "
                              "'cost', got ")
    assert shown in message and len(message) < 140


@pytest.mark.parametrize("scenario", ["1-two-routes", "10-batch-saturates", "15-"])
def test_the_simulator_runs_the_same_with_throughput_or_cost(
        monkeypatch: pytest.MonkeyPatch, scenario: str) -> None:
    """`meshroute bench learning`'s runs do not move when every request names `throughput`
    or `cost` (the mesh is free): the objective's default path is the policy's, draw for draw
    (scenario 15: conversations, with prompts). The run without an objective, once for both."""
    every = (*SCENARIOS, *CONVERSATION_SCENARIOS)
    chosen = next(s for s in every if s.name.startswith(scenario))
    before = run(chosen, "thompson", 1)
    choose = Router.choose

    def naming(objective: str) -> Any:
        def named(self: Router, *args: Any, **kw: Any) -> Any:
            return choose(self, *args, **kw, objective=objective)
        return named

    for objective in (THROUGHPUT, COST):
        monkeypatch.setattr(Router, "choose", naming(objective))
        assert run(chosen, "thompson", 1) == before, objective
