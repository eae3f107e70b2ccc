"""Speed and hit-rate windows over an engine's counters: a minimum of work, restarts, idle."""

from __future__ import annotations

import pytest

from node_agent.windows import MIN_WINDOW_S, MIN_WINDOW_TOKENS, Counters, HitWindow, SpeedWindow


def test_one_tiny_answer_is_no_speed() -> None:
    window = SpeedWindow()
    # llama.cpp after one `max_tokens: 1` answer: 1 token in 1 µs (naively 1,000,000 tok/s)
    assert window.add(Counters(1.0, 1e-6)) is None
    # a thousand more between two reads (a prober's): left out of the window
    assert window.add(Counters(1001.0, 1.001e-3)) is None
    # then real decoding fills it: 40 tokens in 2 s
    assert window.add(Counters(1041.0, 2.001001)) == pytest.approx(20.0)
    # one-token answers within a read of real decoding still count: 40 tokens + 10
    assert window.add(Counters(1091.0, 4.001011)) == pytest.approx(25.0, rel=1e-4)


def test_a_window_needs_both_tokens_and_seconds() -> None:
    window = SpeedWindow()
    assert window.add(Counters(MIN_WINDOW_TOKENS - 1, 10.0)) is None  # slow, too few tokens
    assert window.add(Counters(MIN_WINDOW_TOKENS, 10.1)) == pytest.approx(32 / 10.1)
    fast = SpeedWindow()
    assert fast.add(Counters(500.0, MIN_WINDOW_S / 2)) is None  # many tokens, half a second
    assert fast.add(Counters(1000.0, MIN_WINDOW_S)) == pytest.approx(1000.0)


def test_idle_keeps_the_last_figure() -> None:
    window = SpeedWindow()
    assert window.add(Counters(100.0, 4.0)) == 25.0
    for _ in range(100):
        assert window.add(Counters(100.0, 4.0)) == 25.0


def test_counters_going_backwards_are_a_restart_not_a_negative_rate() -> None:
    window = SpeedWindow()
    assert window.add(Counters(1000.0, 40.0)) == 25.0
    assert window.add(Counters(1010.0, 40.4)) == 25.0  # a partial window, then the restart
    assert window.add(Counters(16.0, 0.73)) == 25.0  # the new process: too little yet
    assert window.restarts == 1
    # the new process's counters count from 0: 64 tokens in 2 s is its first window
    assert window.add(Counters(64.0, 2.0)) == pytest.approx(32.0)


@pytest.mark.parametrize("bad", [Counters(-1.0, 1.0), Counters(1.0, float("nan")),
                                 Counters(float("inf"), 1.0)])
def test_counts_no_engine_writes_are_refused(bad: Counters) -> None:
    with pytest.raises(ValueError):
        SpeedWindow().add(bad)


def test_a_hit_rate_needs_a_window_of_prompts_and_hits() -> None:
    window = HitWindow()
    assert window.add(Counters(0.0, 33.0)) is None  # one short prompt: no figure
    assert window.add(Counters(0.0, 605.0)) is None  # cold prompts: says nothing of caching
    assert window.add(Counters(659.0, 1295.0)) == pytest.approx(659 / 690)
    assert window.add(Counters(659.0, 2500.0)) == pytest.approx(659 / 690)  # cold again
    assert window.add(Counters(659.0, 2500.0)) == pytest.approx(659 / 690)  # idle


def test_a_hit_window_restarts_and_refuses_hits_above_queries() -> None:
    window = HitWindow()
    assert window.add(Counters(900.0, 1000.0)) == pytest.approx(0.9)
    assert window.add(Counters(10.0, 100.0)) is None  # a new process: its cache is empty
    assert window.add(Counters(110.0, 700.0)) == pytest.approx(110 / 700)
    assert window.restarts == 1
    with pytest.raises(ValueError, match="above"):
        window.add(Counters(700.0, 650.0))
