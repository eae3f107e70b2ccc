"""Each engine's pages read into one reading: llama.cpp's captured from a real server
(fixtures/llamacpp_real); vLLM's and SGLang's exposed by the engines' own metrics code fed a
simulated scheduler (fixtures/*_capture_*.txt), and older ones written from their docs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from meshroute_middleware.core.cache_prior import CachePrior
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
from node_agent.load import LoadReader
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


# Pages the engines' own metrics code exposed (vLLM 0.33.0, SGLang 0.5.23), fed by a
# simulated scheduler: fixtures/capture_engines.py, docs/benchmarks/captures.md.

def through_reader(*names: str) -> LoadReader:
    reader = LoadReader("http://127.0.0.1:1/v1", "auto", 10.0)
    for name in names:
        reader.take(page(name))
    return reader


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_captured_busy_page_running_waiting_usage_and_counters(engine: str) -> None:
    got = {"vllm": vllm_reading, "sglang": sglang_reading}[engine](
        page(f"{engine}_capture_busy.txt"))
    # 3 running (the batch), 3 waiting; 180 tokens decoded at 0.025 s each; the prefix
    # cache found 1,104 of 6,112 queried prompt tokens; no slot count on either page
    assert (got.running, got.waiting, got.slots) == (3, 3, None)
    assert got.decode == Counters(180.0, pytest.approx(4.5))
    assert got.cache == Counters(1104.0, 6112.0) and got.cache_hit_gauge is None
    assert got.kv_cache_usage == pytest.approx(0.11575, abs=1e-5) and not got.caching_off
    assert got.context_tokens is None and got.refused == ()


def test_sglang_with_priority_scheduling_counts_its_requests_once() -> None:
    text = (FIXTURES / "sglang_capture_busy.txt").read_text()
    assert 'sglang:num_running_reqs{engine_type="unified",model_name="Qwen/Qwen2.5-0.5B-' \
           'Instruct",moe_ep_rank="0",pp_rank="0",priority="0",tp_rank="0"} 3.0' in text
    got = read_metrics(text)
    assert got.sums["sglang:num_running_reqs"] == 6.0  # the total and priority 0's share
    assert got.parts[("sglang:num_running_reqs", "priority", "")] == 3.0
    assert sglang_reading(got).running == 3


def test_sglangs_last_batch_gauge_is_read_only_without_its_counters() -> None:
    text = (FIXTURES / "sglang_capture_idle.txt").read_text()
    assert sglang_reading(read_metrics(text)).cache_hit_gauge is None  # the gauge says 0.9
    older = "\n".join(line for line in text.splitlines()
                      if "prefill_effective_tokens" not in line)
    assert sglang_reading(read_metrics(older)).cache_hit_gauge == pytest.approx(0.9)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_captured_pages_through_the_reader(engine: str) -> None:
    reader = through_reader(f"{engine}_capture_busy.txt")
    assert reader.source == engine and reader.held() == 6
    assert reader.announcement() == (3, pytest.approx(40.0))
    assert reader.cache_prior() == CachePrior(pytest.approx(1104 / 6112))
    reader.take(page(f"{engine}_capture_later.txt"))
    # the hit rate of the window between the pages: 3,408 of 3,744 queried tokens
    assert reader.cache_prior() == CachePrior(pytest.approx(3408 / 3744))
    assert reader.announcement() == (0, pytest.approx(40.0)) and reader.held() == 1
    reader.take(page(f"{engine}_capture_idle.txt"))  # 9 tokens more, nothing queried
    assert reader.announcement() == (0, pytest.approx(40.0)) and reader.held() == 0
    assert reader.cache_prior() == CachePrior(pytest.approx(3408 / 3744))
    assert reader.slot_count() is None and reader.rejected == 0
    assert reader.latest is not None and reader.latest.kv_cache_usage == 0.0


def test_an_idle_first_page_claims_only_what_its_counters_say() -> None:
    reader = through_reader("vllm_capture_idle.txt")
    assert reader.held() == 0 and reader.slot_count() is None
    assert reader.cache_prior() == CachePrior(pytest.approx(4512 / 9856))  # its history
    assert reader.announcement() == (0, pytest.approx(40.0))


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_captured_restart_drops_the_hit_rate_and_keeps_the_speed(engine: str) -> None:
    reader = through_reader(f"{engine}_capture_later.txt", f"{engine}_capture_restarted.txt")
    assert reader.speed.restarts == 1 and reader.hits.restarts == 1
    # the new process: 19 tokens (below a window), 1,184 cold prompt tokens (no hit): no
    # negative rate, the old process's hit rate gone, its speed kept (the same machine)
    assert reader.announcement() == (0, pytest.approx(40.0)) and reader.held() == 1
    assert reader.cache_prior() is None


def test_captured_vllm_with_prefix_caching_off() -> None:
    got = vllm_reading(page("vllm_capture_caching_off.txt"))
    assert got.caching_off and got.cache == Counters(0.0, 0.0)
    assert through_reader("vllm_capture_caching_off.txt").cache_prior() == CachePrior(0.0)


def test_captured_vllm_with_two_engines_sums_counts_and_averages_usage() -> None:
    got = vllm_reading(page("vllm_capture_two_engines.txt"))  # --data-parallel-size 2
    assert (got.running, got.waiting) == (3 + 2, 2 + 0)
    assert got.kv_cache_usage == pytest.approx((0.1131591796875 + 0.074462890625) / 2)
    assert got.cache == Counters(0.0 + 2224.0, 3648.0 + 2400.0)
    assert got.decode == Counters(57.0 + 38.0, pytest.approx(1.425 + 0.95))
    assert not got.caching_off  # cache_config_info: one series per engine, both "True"
