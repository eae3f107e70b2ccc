"""The limits every parser of another process's data shares."""

from __future__ import annotations

import pytest

from gossip import stats_wire as wire
from meshroute_middleware.core import InvalidNodeError, Outcome, StatEntry, parse_node
from meshroute_middleware.core.contracts import limits


def test_gossip_uses_the_cores_limits_not_copies() -> None:
    for name in ("MAX_ID_CHARS", "MAX_SIGNATURE_CHARS", "MAX_ERROR_CHARS", "MAX_TPS"):
        assert getattr(wire, name) is getattr(limits, name), name


def test_what_the_core_accepts_fits_the_limits() -> None:
    ok = {"node_id": "n" * limits.MAX_ID_CHARS, "model": "m", "start": 0, "end": 0,
          "layers": 1, "url": "http://h:1", "tps": limits.MAX_TPS}
    parse_node(ok)
    for bad in ({"node_id": "n" * (limits.MAX_ID_CHARS + 1)}, {"tps": limits.MAX_TPS * 2}):
        with pytest.raises(InvalidNodeError):
            parse_node({**ok, **bad})
    failed = StatEntry().with_failure("x" * 1000, 1.0, 600.0)
    assert len(failed.last_error) == limits.MAX_ERROR_CHARS
    assert Outcome(10**9, 1e-6).tps == limits.MAX_TPS  # a recorded sample gossip accepts
