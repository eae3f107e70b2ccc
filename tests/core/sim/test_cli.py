"""`meshroute bench learning --quick`: the JSON shape and ours against ADR-0021's policy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshroute_middleware.app.bench.harness import POLICIES
from meshroute_middleware.app.cli import main
from meshroute_middleware.core.config import RouterConfig
from meshroute_middleware.core.sim.scenarios import SCENARIOS

FIELDS = {"fraction_of_oracle", "p95_latency_s", "failed_rate", "reconverge_requests"}
# Margins for one seeded quick run (800 requests). The full run's gaps are far larger
# (docs/benchmarks.md); these only guard against a regression that erases the advantage.
MIN_GAIN = 0.05  # fraction of oracle, ours over adr0021, in scenarios 1, 3 and 6
MAX_P95_RATIO = 0.75  # scenario 5: ours' p95 latency over adr0021's


# A whole quick bench (800 requests x 14 scenarios x 7 policies): ~40 s idle, over the
# suite's 120 s guard with stress-ng on both cores.
@pytest.mark.timeout(900)
def test_quick_run_writes_the_report(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "learning.json"
    assert main(["bench", "learning", "--quick", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report) == {"scenarios"}
    assert set(report["scenarios"]) == {s.name for s in SCENARIOS}
    for cells in report["scenarios"].values():
        assert set(cells) == {*POLICIES, "default"}
        for cell in cells.values():
            assert set(cell) == FIELDS
            assert 0.0 <= cell["failed_rate"] <= 1.0 and cell["p95_latency_s"] > 0
        assert cells["default"] == cells[RouterConfig().policy]
        assert cells["oracle"]["fraction_of_oracle"] == 1.0
    s = report["scenarios"]
    for name in ("1-two-routes", "3-drift", "6-noisy-8"):
        ours, theirs = s[name]["thompson"], s[name]["adr0021"]
        assert ours["fraction_of_oracle"] >= theirs["fraction_of_oracle"] + MIN_GAIN
    load = s["5-load"]
    assert (load["thompson"]["p95_latency_s"]
            <= MAX_P95_RATIO * load["adr0021"]["p95_latency_s"])
    # Issue 14: batching servers. With 16 clients and a saturating fast server the peers
    # that ignore load pile onto it (~0.5 of the oracle); with serial servers the same.
    for name in ("10-batch-saturates", "11-serial"):
        cells = s[name]
        peers = max(cells[p]["fraction_of_oracle"] for p in POLICIES
                    if p not in ("oracle", "thompson"))
        assert cells["thompson"]["fraction_of_oracle"] >= peers + MIN_GAIN
    table = capsys.readouterr().out
    assert "| 1-two-routes | thompson |" in table
    assert "held-out scenarios: 12-bursty, 14-batch-outage" in table


def test_unknown_scenario_is_an_error(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["bench", "learning", "--quick", "--scenario", "nope"]) == 2
    assert "unknown scenario" in capsys.readouterr().err


def test_policy_flag_runs_only_those_beside_the_oracle(tmp_path: Path) -> None:
    out = tmp_path / "some.json"
    assert main(["bench", "learning", "--quick", "--scenario", "1", "--policy", "petals",
                 "--policy", "thompson", "--json", str(out)]) == 0
    cells = json.loads(out.read_text())["scenarios"]["1-two-routes"]
    assert set(cells) == {"oracle", "petals", "thompson", "default"}


def test_conversations_flag_runs_the_conversation_scenarios_with_ttft(
        tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """Issue 26: `--conversations` runs scenarios 15-19 (not in the default set) against
    the cache-aware baselines and reports time to first token."""
    from meshroute_middleware.app.bench.harness import CONVERSATION_POLICIES
    from meshroute_middleware.core.sim.scenarios import CONVERSATION_SCENARIOS

    out = tmp_path / "conv.json"
    assert main(["bench", "learning", "--quick", "--conversations", "--scenario", "15",
                 "--json", str(out)]) == 0
    cells = json.loads(out.read_text())["scenarios"]["15-conv-roomy"]
    assert set(cells) == {*CONVERSATION_POLICIES, "default"}
    for cell in cells.values():
        assert {"mean_ttft_s", "p95_ttft_s", "ttft_of_oracle", "tokens_per_s",
                "warm_share"} <= set(cell)
    assert cells["oracle"]["ttft_of_oracle"] == 1.0
    # affinity pays: the default policy's first tokens come far sooner than blind thompson's
    assert cells["thompson"]["mean_ttft_s"] < 0.6 * cells["thompson-blind"]["mean_ttft_s"]
    table = capsys.readouterr().out
    assert "| 15-conv-roomy | sglang-cache |" in table and "mean TTFT s" in table
    assert {s.name for s in CONVERSATION_SCENARIOS}.isdisjoint(s.name for s in SCENARIOS)


def test_mesh_flag_runs_the_slot_limited_meshes_beside_the_best_fixed_split(
        tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """Issue 31: `--mesh` runs scenarios 20-24 (not in the default set) with the best fixed
    split beside the oracle, and prints each policy over it; a named policy keeps it."""
    from meshroute_middleware.app.bench.harness import MESH_POLICIES
    from meshroute_middleware.core.sim.scenarios import MESH_SCENARIOS

    out = tmp_path / "mesh.json"
    assert main(["bench", "learning", "--quick", "--mesh", "--scenario", "21",
                 "--json", str(out)]) == 0
    cells = json.loads(out.read_text())["scenarios"]["21-slots-three"]
    assert set(cells) == {*MESH_POLICIES, "default"}
    table = capsys.readouterr().out
    assert "fraction of the best fixed split" in table
    assert "| 21-slots-three | thompson |" in table
    assert main(["bench", "learning", "--quick", "--scenario", "20", "--policy", "thompson",
                 "--json", str(out)]) == 0
    assert set(json.loads(out.read_text())["scenarios"]["20-slots-one"]) == {
        "oracle", "thompson", "fixed-split", "default"}
    assert {s.name for s in MESH_SCENARIOS}.isdisjoint(s.name for s in SCENARIOS)
