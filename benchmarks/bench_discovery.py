"""Discovery latency: `meshroute node` start -> routable, goodbye -> removal, kill -9 -> removal.

Real processes, real multicast on loopback (zeroconf bound to 127.0.0.1). Run it isolated:

    scripts/isolated python benchmarks/bench_discovery.py [--reps 5] [--health-interval 0.5]

Goals (issue 4): routable <= 2 s, goodbye removal <= 1 s, kill -9 removal <= 3 probe intervals.
"""

from __future__ import annotations

import argparse
import json
import platform
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio

from node_agent.discovery import tracker_discovery

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.node_agent.conftest import LOOPBACK, RecordingSink, start_node

RESULTS = Path(__file__).parent / "results" / "discovery.json"
TIMEOUT_S = 15.0


async def _until(condition: Any, timeout_s: float = TIMEOUT_S) -> float:
    began = time.monotonic()
    with anyio.fail_after(timeout_s):
        while not condition():
            await anyio.sleep(0.005)
    return time.monotonic() - began


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait(5)
    if process.stdout is not None:
        process.stdout.close()


async def one_round(rep: int, interval_s: float) -> dict[str, float]:
    """One repetition: two node processes, one says goodbye, one is killed."""
    sink = RecordingSink()
    polite_id, killed_id = f"polite-{rep}", f"killed-{rep}"
    async with tracker_discovery(sink, interfaces=LOOPBACK, health_interval_s=interval_s):
        began = time.monotonic()
        polite = start_node(polite_id)
        killed: subprocess.Popen[str] | None = None
        try:
            await _until(lambda: polite_id in sink.records)
            start_s = time.monotonic() - began
            killed = start_node(killed_id)  # one at a time: two cold starts share 2 cores
            await _until(lambda: killed_id in sink.records)
            late = RecordingSink()
            async with tracker_discovery(late, interfaces=LOOPBACK, health_interval_s=60):
                late_s = await _until(lambda: polite_id in late.records)
            polite.send_signal(signal.SIGTERM)
            goodbye_s = await _until(lambda: polite_id not in sink.records)
            killed.kill()
            kill_s = await _until(lambda: killed_id not in sink.records)
        finally:
            for process in (polite, killed):
                if process is not None:
                    _stop(process)
    return {"start_to_routable_s": start_s, "late_tracker_finds_node_s": late_s,
            "goodbye_to_removal_s": goodbye_s, "kill9_to_removal_s": kill_s,
            "kill9_to_removal_intervals": kill_s / interval_s}


GOALS = {"start_to_routable_s": 2.0, "goodbye_to_removal_s": 1.0,
         "kill9_to_removal_intervals": 3.0}


def summarise(rounds: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Median, min and max of each metric over the rounds."""
    return {key: {"median": statistics.median(r[key] for r in rounds),
                  "min": min(r[key] for r in rounds), "max": max(r[key] for r in rounds)}
            for key in rounds[0]}


def table(summary: dict[str, dict[str, float]]) -> str:
    """The printed table: each metric beside its goal, as a ratio (<= 1 meets the goal)."""
    lines = [f"{'metric':30} {'median':>8} {'min':>8} {'max':>8} {'goal':>6} {'med/goal':>9}"]
    for key, row in summary.items():
        goal = GOALS.get(key)
        ratio = f"{row['median'] / goal:9.2f}" if goal else f"{'-':>9}"
        lines.append(f"{key:30} {row['median']:8.3f} {row['min']:8.3f} {row['max']:8.3f} "
                     f"{goal if goal else '-':>6} {ratio}")
    return "\n".join(lines)


async def main(reps: int, interval_s: float) -> None:
    """Run the rounds, print the table, write the JSON."""
    rounds = [await one_round(rep, interval_s) for rep in range(reps)]
    summary = summarise(rounds)
    print(f"discovery latency, {reps} repetitions, health interval {interval_s} s")
    print(table(summary))
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({
        "benchmark": "discovery", "reps": reps, "health_interval_s": interval_s,
        "python": platform.python_version(), "goals": GOALS, "summary": summary,
        "rounds": rounds, "command": " ".join(sys.argv),
    }, indent=2) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--health-interval", type=float, default=0.5)
    args = parser.parse_args()
    anyio.run(main, args.reps, args.health_interval)
