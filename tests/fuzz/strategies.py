"""Hostile-input strategies shared by the fuzz tests, and their bounded settings.

Every test runs `FUZZ` (100 examples); `MESHROUTE_FUZZ_EXAMPLES=3000` runs more
(docs/reliability.md)."""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as hs

FUZZ = settings(max_examples=int(os.environ.get("MESHROUTE_FUZZ_EXAMPLES", "100")),
                deadline=None, suppress_health_check=[HealthCheck.too_slow],
                database=None)

TRICKY = ["", "m", "http://127.0.0.1:1", "https://127.0.0.1:1/x/", "nan", "inf", "-1", "1e309",
          "0", "\x00", "\ud800", "𝓂", "a" * 5000, "javascript:alert(1)", "n1", "ftp://x"]
SCALARS = (hs.none() | hs.booleans() | hs.integers() | hs.integers(min_value=-2**70,
                                                                  max_value=2**70)
           | hs.floats(allow_nan=True, allow_infinity=True) | hs.text(max_size=40)
           | hs.sampled_from(TRICKY))
JSON = hs.recursive(SCALARS, lambda inner: hs.lists(inner, max_size=5)
                    | hs.dictionaries(hs.text(max_size=12), inner, max_size=5), max_leaves=20)

NODE_FIELDS = ("node_id", "model", "start", "end", "layers", "url", "tps", "queue", "rep")
VALID_NODE: dict[str, Any] = {"node_id": "n1", "model": "m", "start": 0, "end": 9,
                              "layers": 10, "url": "http://127.0.0.1:9000", "tps": 20.0,
                              "queue": 0, "rep": 1.0}


@hs.composite
def near_valid(draw: hs.DrawFn, valid: dict[str, Any], names: tuple[str, ...]) -> Any:
    """A valid dict with some fields replaced by hostile values, some dropped, some added."""
    record: dict[str, Any] = dict(valid)
    for name in draw(hs.lists(hs.sampled_from(names), max_size=4, unique=True)):
        if draw(hs.booleans()):
            record[name] = draw(JSON)
        else:
            record.pop(name)
    record.update(draw(hs.dictionaries(hs.text(max_size=8), JSON, max_size=2)))
    return record


NODE_DICTS = near_valid(VALID_NODE, NODE_FIELDS) | JSON
