"""Per-turn cost of a warm conversation's provider ranking and record (issue 35).

The ProviderRouter alone, no HTTP: 50 conversations over two routes (one with two keys), each
turn ranked with its `Turn`, its key taken in the conversation's order and its success
recorded. Prints function calls per turn (cProfile: load-independent) and CPU microseconds per
turn (time.process_time, one run: compare two trees in the same minute). Run it against
another tree (a baseline) with PYTHONPATH:

    PYTHONPATH=/path/to/old/tree python benchmarks/bench_affinity_turn.py 2000
"""

from __future__ import annotations

import cProfile
import pstats
import random
import sys
import time
from typing import Any

from meshroute_middleware.core.providers.affinity import Turn, key_order, preferred
from meshroute_middleware.core.providers.config import parse_providers_config
from meshroute_middleware.core.providers.router import ProviderRouter
from meshroute_middleware.core.providers.scoring import OutcomeKind

DOC = {"routing": {"chain": ["fastco/big-model", "slowco/small-model"]}, "providers": [
    {"name": "fastco", "base_url": "http://127.0.0.1:1/v1", "cache_ttl": "5m",
     "keys": ["env:A", "env:B"], "models": [{"id": "big-model", "tier": "large",
                                              "price_in": 3.0, "price_cached_in": 0.3}]},
    {"name": "slowco", "base_url": "http://127.0.0.1:2/v1", "keys": ["env:C"],
     "models": [{"id": "small-model", "tier": "large", "price_in": 3.0}]}]}


def run(turns: int) -> None:
    router = ProviderRouter(parse_providers_config(DOC))
    rng = random.Random(1)
    res = router.resolve("auto", ())
    now = 1_700_000_000.0
    learns = hasattr(router, "first_bytes")  # a tree from before the learned trade-off
    for i in range(turns):
        turn = Turn(i % 50, 1000 + 10 * (i // 50))
        now += 0.01
        c = router.rank(res, now, rng, turn=turn)[0].candidate
        assert c.provider is not None
        order = key_order(turn.conversation, c.route, len(c.provider.keys))
        got = router.acquire(c, 100, now, prefer=preferred(
            order, router.affinity.warm(turn, now), c.route))
        assert not isinstance(got, list)
        kw: dict[str, Any] = ({"prompt_tokens": turn.prompt_tokens, "cached_tokens": 900}
                              if learns else {})
        router.record(got, OutcomeKind.SUCCESS, now, ttfb_ms=300.0, tokens_per_s=50.0,
                      turn=turn, **kw)


def main() -> None:
    turns = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    run(200)  # warm-up
    profile = cProfile.Profile()
    profile.enable()
    run(turns)
    profile.disable()
    calls = pstats.Stats(profile).total_calls  # type: ignore[attr-defined]
    start = time.process_time()
    run(turns)
    cpu = time.process_time() - start
    print(f"calls/turn {calls / turns:.1f}  cpu us/turn {cpu / turns * 1e6:.1f}")


if __name__ == "__main__":
    main()
