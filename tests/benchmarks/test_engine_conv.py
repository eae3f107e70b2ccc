"""bench_realtime --engine's pure parts: the variants' order rotates run by run, and a
variant's figures come from its turns (the servers' timings where they gave them)."""

from __future__ import annotations

import pytest

from benchmarks._engine_conv import VARIANTS, Turn, rotated, turn_figures


def test_each_variant_starts_a_run_in_turn() -> None:
    orders = [rotated(run) for run in range(1, 6)]
    assert [o[0] for o in orders] == ["meshroute", "pinned", "round-robin", "meshroute",
                                      "pinned"]
    assert all(sorted(o) == sorted(VARIANTS) for o in orders)


def test_a_variants_figures_from_its_turns() -> None:
    stays = [Turn(0, 40.0, "a", 1600, 0, 20000.0), Turn(1, 1.0, "a", 19, 1700, 800.0),
             Turn(2, 2.0, "a", 19, 1710, 900.0)]
    moves = [Turn(0, 60.0, "b"), Turn(1, 3.0, "a"), Turn(2, 2.0, "b")]  # no timings said
    got = turn_figures([stays, moves])
    assert got["first_ttft_s"] == pytest.approx(50.0)
    assert got["later_ttft_s"] == pytest.approx(2.0)
    assert got["later_prompt_ms"] == pytest.approx(850.0)  # only the turns that said it
    assert got["later_cache_n"] == pytest.approx(1705.0)
    assert got["conversations_moved"] == 1
    assert got["places"] == [["a", "a", "a"], ["b", "a", "b"]]
