"""Each engine's pages read into one reading: llama.cpp's captured from a real server
(fixtures/llamacpp_real), vLLM's and SGLang's written from their documented metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from node_agent.engines import (
    EngineReading,
    LoadFormatError,
    detect,
    llamacpp_reading,
    parse_prometheus,
    read_metrics,
    sglang_reading,
    tgi_reading,
    vllm_reading,
)
from node_agent.windows import Counters

FIXTURES = Path(__file__).parent / "fixtures"
REAL = FIXTURES / "llamacpp_real"


def page(name: str) -> Any:
    path = FIXTURES / name
    return json.loads(path.read_text()) if name.endswith(".json") else read_metrics(
        path.read_text())


def test_prometheus_text_is_parsed_summed_averaged_and_labelled() -> None:
    got = read_metrics('# HELP x y\nx{a="1"} 2\nx{a="2",b="}"} 3.5\ny 7 1700000000\n'
                       'i{k="v\\"w",n="3"} 1\n')
    assert got.sums["x"] == 5.5 and got.means["x"] == 2.75 and got.sums["y"] == 7.0
    assert got.labels["x"] == {"a": "1"} and got.labels["i"] == {"k": 'v\\"w', "n": "3"}
    assert parse_prometheus("z 1\n") == {"z": 1.0}
    for bad in ("x{a=1 2", "x", "x abc"):
        with pytest.raises(LoadFormatError):
            read_metrics(bad)


@pytest.mark.parametrize(("name", "source"), [
    ("vllm_v1_metrics.txt", "vllm"), ("vllm_newer_metrics.txt", "vllm"),
    ("sglang_metrics.txt", "sglang"), ("llamacpp_real/metrics_fresh.txt", "llamacpp"),
    ("tgi_metrics.txt", "tgi")])
def test_the_engine_is_recognised_from_its_metrics(name: str, source: str) -> None:
    assert detect(page(name).sums) == source


def test_vllm_v1_with_its_deprecated_names_beside_the_new() -> None:
    got = vllm_reading(page("vllm_v1_metrics.txt"))
    # the new and the deprecated counters both carry the totals: one of them is read
    assert got == EngineReading("vllm", 3, 2, decode=Counters(20000.0, 400.0),
                                cache=Counters(30000.0, 50000.0), kv_cache_usage=0.31)


def test_vllm_after_the_deprecated_names_were_dropped() -> None:
    got = vllm_reading(page("vllm_newer_metrics.txt"))
    assert got == EngineReading("vllm", 2, 1, decode=Counters(30000.0, 500.0),
                                cache=Counters(6000.0, 8000.0), kv_cache_usage=0.4)


def test_vllm_says_when_its_prefix_caching_is_off() -> None:
    got = vllm_reading(page("vllm_v1_metrics_caching_off.txt"))
    assert got.caching_off and got.cache == Counters(0.0, 0.0)
    assert not vllm_reading(page("vllm_v1_metrics.txt")).caching_off


def test_vllm_v0s_hit_rate_gauge_and_its_older_cache_usage_name() -> None:
    got = vllm_reading(page("vllm_metrics_v0_hit_rate.txt"))
    assert got.cache is None and got.cache_hit_gauge == 0.4375
    assert got.kv_cache_usage == 0.0421  # vllm:gpu_cache_usage_perc
    bad = vllm_reading(read_metrics("vllm:gpu_prefix_cache_hit_rate 3\n"))
    assert bad.cache_hit_gauge is None and "not a share" in bad.refused[0]


def test_sglang_from_its_documented_example() -> None:
    got = sglang_reading(page("sglang_metrics.txt"))
    assert got == EngineReading("sglang", 162, 2826,
                                decode=Counters(7.400757e6, 866964.5791549598),
                                cache_hit_gauge=0.007507552643049313, kv_cache_usage=0.28)
    idle = sglang_reading(page("sglang_metrics_idle.txt"))
    assert idle.cache_hit_gauge is None  # a rate of 0 with nothing prefilled says nothing


def test_sglang_gauges_of_several_ranks_are_averaged_and_its_batch_is_its_slots() -> None:
    got = sglang_reading(read_metrics(
        'sglang:token_usage{tp_rank="0"} 0.2\nsglang:token_usage{tp_rank="1"} 0.4\n'
        'sglang:cache_hit_rate{tp_rank="0"} 0.5\nsglang:cache_hit_rate{tp_rank="1"} 0.7\n'
        'sglang:num_running_reqs{tp_rank="0"} 3\nsglang:max_running_requests 48\n'))
    assert got.kv_cache_usage == pytest.approx(0.3)
    assert got.cache_hit_gauge == pytest.approx(0.6)
    assert got.running == 3 and got.slots == 48


def test_tgi_counts_requests_in_its_speed_window() -> None:
    got = tgi_reading(page("tgi_metrics.txt"))
    assert (got.running, got.waiting, got.decode) == (8, 5, Counters(400.0, 10.0))
    assert got.decode_min_tokens == 1.0


def test_a_real_llamacpp_server_fresh() -> None:
    got = llamacpp_reading(page("llamacpp_real/metrics_fresh.txt"),
                           page("llamacpp_real/slots_fresh.json"), page("llamacpp_real/props.json"))
    # --parallel 2 --ctx-size 8192: two slots of 4,096 tokens (/props total_slots, n_ctx)
    assert got == EngineReading("llamacpp", 0, 0, 2, decode=Counters(0.0, 0.0),
                                cache=Counters(0.0, 0.0), context_tokens=4096)


def test_a_real_llamacpp_server_after_one_max_tokens_1_answer() -> None:
    got = llamacpp_reading(page("llamacpp_real/metrics_after_max1.txt"),
                           page("llamacpp_real/slots_after_max1.json"),
                           page("llamacpp_real/props.json"))
    assert got.decode == Counters(1.0, 1e-6)  # the 1,000,000 tok/s the issue saw
    # /slots says slot 1's last prompt was 33 tokens, none cached: neither is read
    assert got.cache == Counters(0.0, 33.0) and got.context_tokens == 4096


def test_a_real_llamacpp_server_mid_decode() -> None:
    got = llamacpp_reading(page("llamacpp_real/metrics_busy.txt"),
                           page("llamacpp_real/slots_busy.json"), page("llamacpp_real/props.json"))
    assert (got.running, got.waiting, got.slots) == (2, 0, 2)
    # the counters move when an answer ends: mid-decode they hold the last finished ones
    assert got.decode == Counters(65.0, 2.27932)
    # the returning turn's 635 reused tokens were counted when its prompt was done
    assert got.cache == Counters(659.0, 659.0 + 636.0)


def test_llamacpp_without_metrics_or_props() -> None:
    got = llamacpp_reading(None, page("llamacpp_real/slots_busy.json"))
    assert got == EngineReading("llamacpp", 2, 0, 2, context_tokens=4096)
    older = llamacpp_reading(None, page("llamacpp_slots_old.json"))
    assert (older.running, older.slots, older.context_tokens) == (1, 2, 2048)


@pytest.mark.parametrize("props", [{"default_generation_settings": {"n_ctx": "4096"}},
                                   {"default_generation_settings": {"n_ctx": 0}},
                                   {"default_generation_settings": {"n_ctx": 10**12}}])
def test_a_malformed_context_is_dropped_and_the_load_kept(props: Any) -> None:
    got = llamacpp_reading(page("llamacpp_real/metrics_busy.txt"), None, props)
    assert got.context_tokens is None and got.running == 2 and len(got.refused) == 1


def test_pages_that_are_not_what_they_claim() -> None:
    with pytest.raises(LoadFormatError):
        llamacpp_reading(None, {"slots": 4})
    with pytest.raises(LoadFormatError):
        llamacpp_reading(None, None, [1, 2])
