"""The simulator's workload, drawn from the seed before any policy sees it (every policy faces
the very same requests): one-shot requests or multi-turn conversations, their token counts,
noise, failure draws, arrival gaps and the bound a client puts on each answer; and the trace
a run leaves, per request."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from ..decision import Decision
from ..prefix import Prefix, chain
from .model import Conversations, Scenario


@dataclass(slots=True, eq=False)
class Request:
    """One simulated request; the random draws are fixed before any policy sees it."""

    index: int
    tokens: int
    noise: float  # multiplicative service-time noise
    fail_u: float
    cut_u: float
    gap_s: float  # to the next arrival (open loop)
    max_tokens: int | None = None  # the client's bound on the answer, as its body states it
    arrival_s: float = 0.0
    decision: Decision | None = None
    nodes: tuple[str, ...] = ()
    compute_s: tuple[float, ...] = ()  # solo compute seconds per token on each node
    hop_s: float = 0.0  # per-token link latency of the route
    latency_s: float = 0.0  # fixed latency, paid once before the first token
    service_s: float = 0.0  # expected solo service seconds, at dispatch
    fail_p: float = 0.0
    good: bool = False  # within GOOD_WITHIN of the oracle's choice when decided
    tokens_left: float = 0.0  # of the token phase (a failing request stops early)
    rate: float = 0.0  # tokens/s now; 0 before the token phase
    updated_s: float = 0.0
    version: int = 0  # bumps on every re-rate; stale FINISH events are skipped
    ttfb_s: float = 0.0
    # Conversations (issue 26): the prompt's message chain (None: a prompt of no cost, as
    # before), the answer's key and the conversation's next turn.
    prompt: Prefix | None = None
    answer_key: bytes = b""
    next_turn: Request | None = None
    prefill_s: tuple[float, ...] = ()  # seconds per uncached prompt token on each hop
    cached_tokens: int = -1  # the prompt's tokens found cached at its head when it started
    turn_of: int = 0  # its turn in its conversation (0: the first)
    client: int = 0  # the closed-loop client that sent it (open loop: 0)

    def __hash__(self) -> int:
        return self.index


@dataclass(slots=True)
class Trace:
    """What one run produced, per request in arrival order."""

    arrival_s: list[float] = field(default_factory=list)
    finish_s: list[float] = field(default_factory=list)
    tokens_ok: list[int] = field(default_factory=list)
    failed: list[bool] = field(default_factory=list)
    good: list[bool] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)  # arrival to first token (0: failed)
    warm: list[bool] = field(default_factory=list)  # half its prompt or more was cached


def draw_requests(scenario: Scenario, rng: random.Random) -> list[Request]:
    """The workload: token counts, mean-one log-normal noise, failure draws, arrival gaps
    (bursts of `burst` requests at once, the mean rate unchanged)."""
    sigma = scenario.noise_sigma
    lo, hi = scenario.tokens
    rate, burst = scenario.poisson_rate, max(scenario.burst, 1)
    out = []
    for i in range(scenario.requests):
        noise = math.exp(rng.gauss(0.0, sigma) - sigma * sigma / 2)
        gap_s = rng.expovariate(rate) if rate > 0 else 0.0
        if burst > 1:
            gap_s = gap_s * burst if i % burst == burst - 1 else 0.0
        out.append(Request(i, rng.randint(lo, hi), noise, rng.random(), rng.random(), gap_s))
    # The body's max_tokens, drawn apart (the draws above stay what they were): see
    # `client_max_tokens`. A gateway sees only this bound, never the answer's true length.
    bounds = random.Random(rng.random())
    for req in out:
        req.max_tokens = client_max_tokens(req.tokens, bounds)
    return out


# How clients bound their answers (the body's `max_tokens`), a third each: none at all
# (LangChain's and most chat UIs' default), a generous fixed cap (many apps send 1024-4096
# whatever they ask; here above every answer, so it says nothing), or a cap that fits the
# task, the answer's length rounded up to a power of two (an app asking for a short label or
# a summary sets a short cap; the answer never exceeds it, as a server stops there).
FIXED_CAP = 1024


def client_max_tokens(tokens: int, rng: random.Random) -> int | None:
    """The max_tokens a client sends with a request whose answer will be `tokens` long."""
    u = rng.random()
    if u < 1 / 3:
        return None
    if u < 2 / 3:
        return FIXED_CAP
    return 1 << max(tokens - 1, 1).bit_length()


def draw_conversations(scenario: Scenario, conv: Conversations,
                        rng: random.Random) -> list[Request]:
    """The multi-turn workload: conversations (their turns linked in order) until
    `scenario.requests` turns; the same random draws per turn as `draw_requests`."""
    sigma = scenario.noise_sigma
    lo, hi = scenario.tokens
    out: list[Request] = []
    bounds = random.Random(rng.random())
    c = 0
    while len(out) < scenario.requests:
        one_shot = rng.random() < conv.one_shot
        turns = 1 if one_shot else rng.randint(*conv.turns)
        first = rng.randint(*(conv.one_shot_tokens if one_shot else conv.system_tokens))
        prompt = chain([f"{c}:0".encode()], [first])
        previous: Request | None = None
        for k in range(min(turns, scenario.requests - len(out))):
            if k:
                prompt = prompt.extended(f"{c}:{k}:user".encode(), rng.randint(*conv.user_tokens))
            noise = math.exp(rng.gauss(0.0, sigma) - sigma * sigma / 2)
            tokens = rng.randint(lo, hi)
            req = Request(len(out), tokens, noise, rng.random(), rng.random(), 0.0,
                          client_max_tokens(tokens, bounds), prompt=prompt,
                          answer_key=f"{c}:{k}:answer".encode(), turn_of=k)
            out.append(req)
            if previous is not None:
                previous.next_turn = req
            previous = req
            prompt = prompt.extended(req.answer_key, tokens)
        c += 1
    return out


def trace_of(requests: list[Request], done: dict[int, tuple[float, int, bool]]) -> Trace:
    """The trace of a finished run: per request in arrival order, from `done`'s (finish
    time, tokens delivered, failed) by request index."""
    trace = Trace()
    for req in sorted(requests, key=lambda r: r.index):
        finish, tokens, failed = done[req.index]
        trace.ttft_s.append(0.0 if failed else req.ttfb_s)
        trace.warm.append(req.prompt is not None
                          and 2 * req.cached_tokens >= req.prompt.prompt_tokens)
        trace.arrival_s.append(req.arrival_s)
        trace.finish_s.append(finish)
        trace.tokens_ok.append(tokens)
        trace.failed.append(failed)
        trace.good.append(req.good)
    return trace
