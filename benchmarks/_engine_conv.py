"""`bench_realtime --engine llama-server` (issue 31): the conversation workload on two real
llama.cpp servers, through `meshroute serve` against the same workload sent directly.

Per run, three variants on fresh servers (cold caches), one after the other; run k starts with
the k-th variant (meshroute, pinned, round-robin rotated), so that none always meets the
machine's load first:
- meshroute: a `meshroute node` agent in front of each server, one `meshroute serve` that finds
  them over mDNS on loopback, every turn sent to the gateway (the conversation's
  `x-session-id` as its hint);
- pinned: each conversation sent straight to one server (conversation i to server i mod 2),
  the best a router can do here: every returning turn finds its prefix warm;
- round-robin: turns sent straight to the servers in turn, as a cache-blind balancer does.

Before the workload one `max_tokens: 1` request goes to each server (an answer of one token
made the agent of issue 31 announce 1,000,000 tok/s). Then CLIENTS conversations run at once,
TURNS turns each, each with its own system prompt of ~SYSTEM_TOKENS tokens, the whole history
sent every turn, streamed. Reported per variant: the mean time to first token of the returning
turns (2..TURNS) and of the first turns; the goal is meshroute within GOAL x pinned on the
returning turns, and its first turns no slower than round-robin's. Beside them, what the
servers said of each turn (llama-server's `timings` in the last chunk: prompt tokens
processed and taken from the cache, milliseconds of prompt evaluation) and the CPU seconds
every process of the variant used (servers, agents, gateway).
"""

from __future__ import annotations

import itertools
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import httpx

from tests.engines.conftest import MODEL, start_mesh
from tests.engines.llama_server import LlamaServer, require_engine

CLIENTS = 4
TURNS = 6
SYSTEM_WORDS = 210  # ~1,200 prompt tokens with SmolLM2's tokenizer (measured: prompt_n)
MAX_TOKENS = 24
GOAL = 1.2
VARIANTS = ("meshroute", "pinned", "round-robin")
TIMEOUT_S = 300.0


def system_prompt(conversation: int, run: int) -> str:
    words = " ".join(f"note{run}c{conversation}w{i}" for i in range(SYSTEM_WORDS))
    return f"You are assistant {conversation}. Remember these notes: {words}."


class Turn(NamedTuple):
    """One turn as the client saw it, and as the server's `timings` told it (None: not said)."""

    number: int
    ttft_s: float
    where: str
    prompt_n: int | None = None  # prompt tokens evaluated
    cache_n: int | None = None  # prompt tokens taken from the slot's cache
    prompt_ms: float | None = None  # the server's prompt evaluation


def rotated(run: int) -> tuple[str, ...]:
    """The variants in run `run`'s order (1-based): run k starts with the k-th, cyclically."""
    start = (run - 1) % len(VARIANTS)
    return VARIANTS[start:] + VARIANTS[:start]


def streamed_turn(url: str, model: str, messages: list[dict[str, str]],
                  headers: dict[str, str]) -> tuple[float, str, str, dict[str, Any]]:
    """(seconds to the first content chunk, the answer, where it went, the server's
    `timings`)."""
    # usage asked for: the gateway then relays the last chunk, which carries the `timings`
    body = {"model": model, "messages": messages, "max_tokens": MAX_TOKENS, "stream": True,
            "temperature": 0, "stream_options": {"include_usage": True}}
    began = time.monotonic()
    ttft: float | None = None
    parts: list[str] = []
    timings: dict[str, Any] = {}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, headers=headers,
                      timeout=TIMEOUT_S) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"{url}: {resp.status_code} {resp.read()[:200]!r}")
        where = resp.headers.get("x-meshroute-route", url).split("|")[-1]
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            doc = json.loads(line[6:])
            if "error" in doc:
                raise RuntimeError(f"{url}: {doc['error']}")
            if isinstance(doc.get("timings"), dict):
                timings = doc["timings"]
            for choice in doc.get("choices") or []:
                text = (choice.get("delta") or {}).get("content")
                if text:
                    if ttft is None:
                        ttft = time.monotonic() - began
                    parts.append(text)
    return ((ttft if ttft is not None else time.monotonic() - began), "".join(parts), where,
            timings)


def conversation(pick: Callable[[int], str], model: str, index: int, run: int) -> list[Turn]:
    """One conversation, turn by turn."""
    messages = [{"role": "system", "content": system_prompt(index, run)},
                {"role": "user", "content": f"Conversation {index}: what is note 1?"}]
    out: list[Turn] = []
    for number in range(TURNS):
        ttft, answer, where, timings = streamed_turn(pick(index), model, messages,
                                                     {"x-session-id": f"run{run}-conv{index}"})
        out.append(Turn(number, ttft, where, timings.get("prompt_n"), timings.get("cache_n"),
                        timings.get("prompt_ms")))
        messages += [{"role": "assistant", "content": answer},
                     {"role": "user", "content": f"And what is note {number + 2}?"}]
    return out


def prime(urls: list[str]) -> None:
    for url in urls:
        httpx.post(url + "/v1/chat/completions", timeout=TIMEOUT_S, json={
            "model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a live process has used, from /proc (0 where unreadable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def turn_figures(runs: list[list[Turn]]) -> dict[str, Any]:
    """The variant's figures from its turns: times to first token, and the servers' own."""
    first = [t.ttft_s for r in runs for t in r if t.number == 0]
    later = [t for r in runs for t in r if t.number > 0]
    moved = sum(any(t.where != r[0].where for t in r[1:]) for r in runs)
    return {"first_ttft_s": mean(first), "later_ttft_s": mean([t.ttft_s for t in later]),
            "later_prompt_n": mean([t.prompt_n for t in later if t.prompt_n is not None]),
            "later_cache_n": mean([t.cache_n for t in later if t.cache_n is not None]),
            "later_prompt_ms": mean([t.prompt_ms for t in later if t.prompt_ms is not None]),
            "conversations_moved": moved,
            "places": [[t.where for t in r] for r in runs],
            "turns": [[list(t) for t in r] for r in runs]}


def run_variant(variant: str, run: int, workdir: Path) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    closers: list[Callable[[], None]] = []
    pids: dict[str, int] = {}  # process -> pid, for the CPU each used
    try:
        model = MODEL  # a server answers any name; the gateway routes the mesh's own
        if variant == "meshroute":
            # the gateway waits for a first token as long as the clients of the other
            # variants do: a cold prefill on a loaded machine outlasts its 60 s default
            patience = str(int(TIMEOUT_S))
            mesh = start_mesh(workdir, serve_args=("--first-byte-timeout", patience,
                                                   "--idle-timeout", patience))
            model = mesh.model
            closers.append(mesh.close)
            servers = [s.url for s in mesh.servers.values()]
            pids.update({f"server-{i}": s.proc.pid for i, s in enumerate(mesh.servers.values())
                         if s.proc is not None})
            pids.update({f"agent-{i}": p.pid for i, p in enumerate(mesh.agents.values())})
            pids["gateway"] = mesh.procs[0].pid
            prime(servers)
            time.sleep(2.0)  # the agents read the servers after the primer (their poll: 1 s)
            gateway = mesh.gateway
            def pick(index: int) -> str:
                return gateway
        else:
            started = [LlamaServer(workdir / f"server-{i}.log").start() for i in range(2)]
            closers += [s.stop for s in started]
            servers = [s.url for s in started]
            pids.update({f"server-{i}": s.proc.pid for i, s in enumerate(started)
                         if s.proc is not None})
            prime(servers)
            if variant == "pinned":
                def pick(index: int) -> str:
                    return servers[index % 2]
            else:
                turns = itertools.cycle(servers)
                lock = threading.Lock()
                def pick(index: int) -> str:
                    with lock:
                        return next(turns)
        cpu_before = {name: cpu_s(pid) for name, pid in pids.items()}
        load_before = os.getloadavg()[0]
        began = time.monotonic()
        with ThreadPoolExecutor(CLIENTS) as pool:
            runs = list(pool.map(lambda i: conversation(pick, model, i, run), range(CLIENTS)))
        wall = time.monotonic() - began
        cpu = {name: round(cpu_s(pid) - cpu_before[name], 2) for name, pid in pids.items()}
    finally:
        for close in reversed(closers):
            close()
    return {**turn_figures(runs), "wall_s": round(wall, 1), "cpu_s": cpu,
            "load_before": load_before, "load_after": os.getloadavg()[0]}


def run_engine(runs: int, out_path: Path, keep: Path | None = None) -> dict[str, Any]:
    """`runs` runs of the three variants; with `keep`, every process's log (the gateway's,
    the agents', the servers') is kept there, not deleted."""
    require_engine()
    report: dict[str, Any] = {"clients": CLIENTS, "turns": TURNS, "max_tokens": MAX_TOKENS,
                              "system_words": SYSTEM_WORDS, "goal": GOAL, "runs": []}
    with tempfile.TemporaryDirectory(prefix="bench-engine-") as scratch:
        tmp = str(keep) if keep is not None else scratch
        for run in range(1, runs + 1):
            row: dict[str, Any] = {"order": list(rotated(run))}
            for variant in row["order"]:
                row[variant] = run_variant(variant, run, Path(tmp) / f"run{run}-{variant}")
            pinned = row["pinned"]["later_ttft_s"]
            row["meshroute_over_pinned"] = row["meshroute"]["later_ttft_s"] / pinned
            row["round_robin_over_pinned"] = row["round-robin"]["later_ttft_s"] / pinned
            row["first_meshroute_over_round_robin"] = (
                row["meshroute"]["first_ttft_s"] / row["round-robin"]["first_ttft_s"])
            report["runs"].append(row)
            print(f"run {run} ({', '.join(row['order'])}): returning turns meshroute "
                  f"{row['meshroute_over_pinned']:.2f}x pinned, round-robin "
                  f"{row['round_robin_over_pinned']:.2f}x (pinned {pinned:.2f} s); first turns "
                  f"meshroute/round-robin {row['first_meshroute_over_round_robin']:.2f}; "
                  f"conversations moved {row['meshroute']['conversations_moved']}/{CLIENTS}; "
                  "warm prompt ms " + ", ".join(
                      f"{v} {row[v]['later_prompt_ms'] or 0:.0f}" for v in VARIANTS),
                  flush=True)
            out_path.parent.mkdir(parents=True, exist_ok=True)
            out_path.write_text(json.dumps(report, indent=2) + "\n")
    met = sum(r["meshroute_over_pinned"] <= GOAL for r in report["runs"])
    report["goal_met_runs"] = met
    print(f"meshroute within {GOAL}x pinned in {met} of {runs} runs", flush=True)
    out_path.write_text(json.dumps(report, indent=2) + "\n")
    return report
