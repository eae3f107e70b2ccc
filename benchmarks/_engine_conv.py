"""`bench_realtime --engine llama-server` (issue 31): the conversation workload on two real
llama.cpp servers, through `meshroute serve` against the same workload sent directly.

Per run, three variants on fresh servers (cold caches), interleaved so a noisy neighbour hurts
all alike:
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
returning turns, and its first turns no slower than round-robin's.
"""

from __future__ import annotations

import itertools
import json
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

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


def streamed_turn(url: str, model: str, messages: list[dict[str, str]],
                  headers: dict[str, str]) -> tuple[float, str, str]:
    """(seconds to the first content chunk, the answer, where it went)."""
    body = {"model": model, "messages": messages, "max_tokens": MAX_TOKENS, "stream": True,
            "temperature": 0}
    began = time.monotonic()
    ttft: float | None = None
    parts: list[str] = []
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
            for choice in doc.get("choices") or []:
                text = (choice.get("delta") or {}).get("content")
                if text:
                    if ttft is None:
                        ttft = time.monotonic() - began
                    parts.append(text)
    return (ttft if ttft is not None else time.monotonic() - began), "".join(parts), where


def conversation(pick: Callable[[int], str], model: str, index: int, run: int
                 ) -> list[tuple[int, float, str]]:
    """One conversation: (turn, time to first token, where) per turn."""
    messages = [{"role": "system", "content": system_prompt(index, run)},
                {"role": "user", "content": f"Conversation {index}: what is note 1?"}]
    out: list[tuple[int, float, str]] = []
    for number in range(TURNS):
        ttft, answer, where = streamed_turn(pick(index), model, messages,
                                            {"x-session-id": f"run{run}-conv{index}"})
        out.append((number, ttft, where))
        messages += [{"role": "assistant", "content": answer},
                     {"role": "user", "content": f"And what is note {number + 2}?"}]
    return out


def prime(urls: list[str]) -> None:
    for url in urls:
        httpx.post(url + "/v1/chat/completions", timeout=TIMEOUT_S, json={
            "model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})


def run_variant(variant: str, run: int, workdir: Path) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    closers: list[Callable[[], None]] = []
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
            prime(servers)
            time.sleep(2.0)  # the agents read the servers after the primer (their poll: 1 s)
            gateway = mesh.gateway
            def pick(index: int) -> str:
                return gateway
        else:
            started = [LlamaServer(workdir / f"server-{i}.log").start() for i in range(2)]
            closers += [s.stop for s in started]
            servers = [s.url for s in started]
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
        began = time.monotonic()
        with ThreadPoolExecutor(CLIENTS) as pool:
            runs = list(pool.map(lambda i: conversation(pick, model, i, run), range(CLIENTS)))
        wall = time.monotonic() - began
    finally:
        for close in reversed(closers):
            close()
    first = [t for r in runs for n, t, _ in r if n == 0]
    later = [t for r in runs for n, t, _ in r if n > 0]
    moved = sum(any(w != r[0][2] for _, _, w in r[1:]) for r in runs)
    return {"first_ttft_s": sum(first) / len(first), "later_ttft_s": sum(later) / len(later),
            "conversations_moved": moved, "wall_s": round(wall, 1),
            "places": [[w for _, _, w in r] for r in runs]}


def run_engine(runs: int, out_path: Path, keep: Path | None = None) -> dict[str, Any]:
    """`runs` runs of the three variants; with `keep`, every process's log (the gateway's,
    the agents', the servers') is kept there, not deleted."""
    require_engine()
    report: dict[str, Any] = {"clients": CLIENTS, "turns": TURNS, "max_tokens": MAX_TOKENS,
                              "system_words": SYSTEM_WORDS, "goal": GOAL, "runs": []}
    with tempfile.TemporaryDirectory(prefix="bench-engine-") as scratch:
        tmp = str(keep) if keep is not None else scratch
        for run in range(1, runs + 1):
            row: dict[str, Any] = {}
            for variant in VARIANTS:
                row[variant] = run_variant(variant, run, Path(tmp) / f"run{run}-{variant}")
            pinned = row["pinned"]["later_ttft_s"]
            row["meshroute_over_pinned"] = row["meshroute"]["later_ttft_s"] / pinned
            row["round_robin_over_pinned"] = row["round-robin"]["later_ttft_s"] / pinned
            row["first_meshroute_over_round_robin"] = (
                row["meshroute"]["first_ttft_s"] / row["round-robin"]["first_ttft_s"])
            report["runs"].append(row)
            print(f"run {run}: returning turns meshroute {row['meshroute_over_pinned']:.2f}x "
                  f"pinned, round-robin {row['round_robin_over_pinned']:.2f}x (pinned "
                  f"{pinned:.2f} s); first turns meshroute/round-robin "
                  f"{row['first_meshroute_over_round_robin']:.2f}; conversations moved "
                  f"{row['meshroute']['conversations_moved']}/{CLIENTS}", flush=True)
            out_path.parent.mkdir(parents=True, exist_ok=True)
            out_path.write_text(json.dumps(report, indent=2) + "\n")
    met = sum(r["meshroute_over_pinned"] <= GOAL for r in report["runs"])
    report["goal_met_runs"] = met
    print(f"meshroute within {GOAL}x pinned in {met} of {runs} runs", flush=True)
    out_path.write_text(json.dumps(report, indent=2) + "\n")
    return report
