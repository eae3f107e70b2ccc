"""What a node agent announces in front of a real llama.cpp server, read from pages captured
from one (fixtures/llamacpp_real, README there): after a `max_tokens: 1` answer, while idle,
after a restart, against the decode speed the server measured for each answer; and no cache
figure the server did not give. vLLM and SGLang through the same reader, from their
documented pages."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from meshroute_middleware.core.cache_prior import CachePrior
from node_agent.engines import read_metrics
from node_agent.load import LoadReader

FIXTURES = Path(__file__).parent / "fixtures"
REAL = FIXTURES / "llamacpp_real"
CONFIGURED_TPS = 10.0  # `meshroute node --tps`, the figure before any window closed
TIMINGS = json.loads((REAL / "timings.json").read_text())
PROPS = json.loads((REAL / "props.json").read_text())


def measured(after: str) -> float:
    """The decode speed of one request the server measured for the answers (timings)."""
    answers = TIMINGS[after]
    return sum(a["predicted_per_second"] for a in answers) / len(answers)


def read(reader: LoadReader, name: str, slots: str | None = None) -> Any:
    metrics = read_metrics((REAL / f"metrics_{name}.txt").read_text())
    slots_page = json.loads((REAL / f"slots_{slots}.json").read_text()) if slots else None
    return reader.take(metrics, slots_page, PROPS)


def within_2x(announced: float, truth: float) -> bool:
    return truth / 2 <= announced <= truth * 2


def test_after_one_max_tokens_1_answer_the_configured_figure_stays() -> None:
    reader = LoadReader("http://127.0.0.1:1/v1", "auto", CONFIGURED_TPS)
    read(reader, "fresh", "fresh")
    read(reader, "after_max1", "after_max1")
    # its /metrics reads 1 token in 1 µs: 1,000,000 tok/s before issue 31
    assert reader.announcement() == (0, CONFIGURED_TPS)
    read(reader, "after_long", "after_long")
    _, tps = reader.announcement()
    assert within_2x(tps, measured("after_long"))  # 28.1 announced, 27.6 measured
    # the one-token answer's read was left out: the window is the 64-token answer's
    assert tps == pytest.approx(64 / (2.27932 - 1e-6))


def test_idle_mid_decode_and_after_more_answers() -> None:
    reader = LoadReader("http://127.0.0.1:1/v1", "llamacpp", CONFIGURED_TPS)
    read(reader, "after_long", "after_long")
    first = reader.announcement()[1]
    for _ in range(5):  # idle, then two answers decoding (counters move when they end)
        read(reader, "after_long", "after_long")
        assert reader.announcement()[1] == first
    read(reader, "busy", "busy")
    assert reader.announcement()[1] == first and reader.latest is not None
    assert reader.latest.running == 2
    read(reader, "after_turn2", "after_turn2")
    _, tps = reader.announcement()
    # two concurrent answers: 192 tokens over 10.99 s summed -> 17.5; measured 17.3 each
    assert tps == pytest.approx(192 / (13.2675 - 2.27932))
    assert within_2x(tps, measured("after_turn2"))


def test_after_a_restart_the_last_figure_stays_and_nothing_goes_negative() -> None:
    reader = LoadReader("http://127.0.0.1:1/v1", "llamacpp", CONFIGURED_TPS)
    read(reader, "after_turn2", "after_turn2")
    before = reader.announcement()[1]
    read(reader, "after_restart")  # counters 257 -> 16 tokens: a new process
    _, tps = reader.announcement()
    assert reader.speed.restarts == 1 and tps == before > 0
    assert within_2x(tps, measured("after_restart"))  # 17.5 announced, 20.5 measured
    assert reader.cache_prior() == CachePrior(None, 4096)  # the hit rate was the old cache's
    # the restart's 16 tokens open the next window: with its next answers it closes
    metrics = (REAL / "metrics_after_restart.txt").read_text().replace(
        "tokens_predicted_total 16", "tokens_predicted_total 80").replace(
        "tokens_predicted_seconds_total 0.730434", "tokens_predicted_seconds_total 3.730434")
    reader.take(read_metrics(metrics), None, PROPS)
    assert reader.announcement()[1] == pytest.approx(80 / 3.730434)


def test_no_cache_figure_the_server_did_not_give() -> None:
    reader = LoadReader("http://127.0.0.1:1/v1", "llamacpp", CONFIGURED_TPS)
    read(reader, "after_max1", "after_max1")
    # /slots: slot 1's last prompt, 33 tokens, 0 cached. Not a capacity of 33 nor a hit
    # rate of 0; the server's context per slot (/props n_ctx) is what a slot can hold
    assert reader.cache_prior() == CachePrior(None, 4096)
    read(reader, "after_long", "after_long")  # cold prompts: 605 queried, none cached
    assert reader.cache_prior() == CachePrior(None, 4096)
    read(reader, "busy", "busy")  # a returning turn: 659 of 690 tokens reused
    assert reader.cache_prior() == CachePrior(pytest.approx(659 / 690), 4096)
    # its idle /slots say 0 cached of 747: the figure stays the counters' window
    read(reader, "after_turn2", "after_turn2")
    assert reader.cache_prior() == CachePrior(pytest.approx(659 / 690), 4096)


def test_a_server_without_props_or_metrics_gives_no_hit_rate() -> None:
    reader = LoadReader("http://127.0.0.1:1/v1", "llamacpp", CONFIGURED_TPS)
    reader.take(None, json.loads((REAL / "slots_after_turn2.json").read_text()))
    assert reader.cache_prior() == CachePrior(None, 4096)  # each slot's n_ctx
    assert reader.announcement() == (0, CONFIGURED_TPS) and reader.slot_count() == 2


def metrics(name: str) -> Any:
    return read_metrics((FIXTURES / name).read_text())


def test_vllm_speed_restart_and_cache_through_the_reader() -> None:
    reader = LoadReader("http://127.0.0.1:1/v1", "auto", CONFIGURED_TPS)
    reader.take(metrics("vllm_v1_metrics.txt"))
    assert reader.source == "vllm"
    assert reader.announcement() == (2, pytest.approx(50.0))  # 20,000 tokens in 400 s
    assert reader.cache_prior() == CachePrior(pytest.approx(0.6))  # 30,000 of 50,000
    assert reader.slot_count() is None  # its --max-num-seqs is not on the page
    reader.take(metrics("vllm_v1_metrics_later.txt"))
    assert reader.announcement() == (0, pytest.approx(40.0))  # 2,000 in 50 s
    assert reader.cache_prior() == CachePrior(pytest.approx(0.9))  # 9,000 of 10,000
    reader.take(metrics("vllm_v1_metrics_restarted.txt"))  # counters back to 1,000 / 600
    assert reader.speed.restarts == 1 and reader.hits.restarts == 1
    # the new process decoded 1,000 tokens in 20 s (a window); its cache started empty:
    # the old process's 0.9 is gone, and 600 cold prompt tokens make no new figure
    assert reader.announcement() == (0, pytest.approx(50.0))
    assert reader.cache_prior() is None


def test_vllm_with_prefix_caching_off_says_so() -> None:
    reader = LoadReader("http://127.0.0.1:1/v1", "vllm", CONFIGURED_TPS)
    reader.take(metrics("vllm_v1_metrics_caching_off.txt"))
    assert reader.cache_prior() == CachePrior(0.0)


def test_sglang_through_the_reader() -> None:
    reader = LoadReader("http://127.0.0.1:1/v1", "auto", CONFIGURED_TPS)
    reader.take(metrics("sglang_metrics.txt"))
    assert reader.source == "sglang"
    assert reader.announcement() == (2826, pytest.approx(7.400757e6 / 866964.5791549598))
    assert reader.cache_prior() == CachePrior(pytest.approx(0.0075075, rel=1e-3))
    assert reader.latest is not None and reader.latest.kv_cache_usage == 0.28
    reader.take(metrics("sglang_metrics_later.txt"))
    assert reader.announcement() == (0, pytest.approx(8.0))  # 10,000 tokens in 1,250 s
    assert reader.cache_prior() == CachePrior(0.25)
    reader.take(metrics("sglang_metrics_idle.txt"))  # idle: no tokens, hit gauge at 0
    assert reader.announcement() == (0, pytest.approx(8.0))
    assert reader.cache_prior() == CachePrior(0.25)
    # a restart: its decode histogram starts again, and the old process's rate is gone
    reader.take(read_metrics("sglang:num_queue_reqs 0\nsglang:cache_hit_rate 0\n"
                             "sglang:time_per_output_token_seconds_count 10\n"
                             "sglang:time_per_output_token_seconds_sum 1\n"))
    assert reader.speed.restarts == 1 and reader.cache_prior() is None
    assert reader.announcement() == (0, pytest.approx(8.0))
