"""The benchmark scenarios: issue 6's seven, a recovery, and issue 14's batching servers
(names are the JSON keys)."""

from __future__ import annotations

from dataclasses import replace

from .model import Conversations, Event, NodeSpec, Scenario, batching, caching, serial, whole

# ADR-0020's mesh: a 40-layer model (Qwen3.6-35B-A3B), a fast GPU node on layers 0-21 and slow
# CPU nodes on 0-39. Speeds are illustrative; the per-token hop latency is what makes the
# hybrid route slower than the bottleneck prior (and Petals-style advertised costs) suggest.
GPU = NodeSpec("gpu", 0, 21, 40, 1.0 / (100.0 * 22))  # 100 tok/s over its 22 layers
CPU_A = whole("cpu-a", 10.0, layers=40)
CPU_B = whole("cpu-b", 8.0, layers=40)
MIXED_HOP_TOKEN_S = 0.06  # LAN round trip per generated token between pipeline stages

# Churn: two half-model nodes form a 50 tok/s pipeline beside whole-model heads.
HALF_HEAD = NodeSpec("h2", 0, 15, 32, 1.0 / (100.0 * 16))
HALF_TAIL = NodeSpec("t1", 16, 31, 32, 1.0 / (100.0 * 16))
H1, H5 = whole("h1", 55.0), whole("h5", 65.0)
CHURN_EVERY = 250  # requests between topology changes

LOAD_NODES = (whole("a", 60.0, slots=2), whole("b", 45.0, slots=2),
              whole("c", 30.0, slots=2), whole("d", 20.0, slots=2))
TOKENS = (64, 512)
MEAN_TOKENS = (TOKENS[0] + TOKENS[1]) / 2
ANNOUNCE_S = 2.0  # node agents refresh their queue depth about this often
LOAD_FACTOR = 0.8  # issue 6: Poisson arrivals at 80 % of the mesh's total capacity


def load_rate(nodes: tuple[NodeSpec, ...], factor: float) -> float:
    """Requests/s that load every slot of every node to `factor` of its capacity."""
    return factor * sum(n.throughput(n.slots) for n in nodes) / MEAN_TOKENS


# Issue 14: servers that batch. Per-request speeds alone 90 / 60 / 30 tok/s, the ratios of the
# independent check (900 / 600 / 300); vLLM-like decode slows a few percent per neighbour.
ROOMY = (batching("fast", 90.0, 16, 0.05), batching("mid", 60.0, 16, 0.05),
         batching("slow", 30.0, 16, 0.05))
# The fast server's batch saturates: 4 slots and a steep slowdown (a small GPU, long prompts).
TIGHT = (batching("fast", 90.0, 4, 0.25), batching("mid", 60.0, 8, 0.1),
         batching("slow", 30.0, 8, 0.05))
SERIAL = (serial("fast", 90.0), serial("mid", 60.0), serial("slow", 30.0))
BURST = 8


def _churn_events() -> tuple[Event, ...]:
    plan: list[NodeSpec | str] = [H5, "h1", "h5", H1, "t1", H5, HALF_TAIL, "h5", "h3"]
    out = []
    for k, what in enumerate(plan, start=1):
        at = k * CHURN_EVERY
        if isinstance(what, NodeSpec):
            out.append(Event(at, "join", what.node_id, node=what))
        else:
            out.append(Event(at, "leave", what))
    return tuple(out)


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("1-two-routes", "two routes at 60 and 40 tok/s",
             (whole("fast", 60.0), whole("slow", 40.0)), 2000),
    Scenario("2-mixed-adr0020", "GPU 0-21 + CPU hop vs CPU 0-39 (ADR-0020)",
             (GPU, CPU_A, CPU_B), 1500, hop_token_s=MIXED_HOP_TOKEN_S),
    Scenario("3-drift", "best route halves its speed mid-run",
             (whole("a", 60.0), whole("b", 50.0), whole("c", 40.0)), 2000,
             events=(Event(1000, "slow", "a", factor=2.0),)),
    Scenario("4-churn", "nodes join and leave every 250 requests",
             (H1, HALF_HEAD, HALF_TAIL, whole("h3", 45.0), whole("h4", 35.0)), 2500,
             events=_churn_events(), hop_token_s=0.002),
    Scenario("5-load", "Poisson arrivals at 80 % of total capacity",
             LOAD_NODES, 3000, poisson_rate=load_rate(LOAD_NODES, LOAD_FACTOR),
             noise_sigma=0.2, announce_s=ANNOUNCE_S),
    Scenario("6-noisy-8", "eight heads, log-normal noise sigma 0.5",
             tuple(whole(f"n{i}", tps) for i, tps in
                   enumerate((60.0, 52.0, 45.0, 40.0, 34.0, 28.0, 22.0, 16.0))),
             3000, noise_sigma=0.5),
    Scenario("7-flaky", "fastest route fails 20 % of requests",
             (whole("flaky", 60.0, fail_rate=0.2), whole("steady", 56.0),
              whole("slow", 40.0)), 2000),
    # Beyond issue 6's list: the opposite drift, which only exploration can notice.
    Scenario("8-recovery", "the slowest route becomes 1.5x the fastest mid-run",
             (whole("a", 60.0), whole("b", 50.0), whole("c", 30.0)), 3000,
             events=(Event(1000, "slow", "c", factor=1 / 3),)),
    Scenario("9-batch-roomy", "batching servers 90/60/30, 4 clients: the fast one has room",
             ROOMY, 3000, clients=4),
    Scenario("10-batch-saturates", "16 clients, the fast server saturates: the best is a split",
             TIGHT, 4000, clients=16),
    Scenario("11-serial", "serial servers 90/60/30 with 4 clients: spreading is right",
             SERIAL, 3000, clients=4),
    Scenario("12-bursty", "bursts of 8 requests at 60 % of capacity, batching servers",
             TIGHT, 3000, poisson_rate=load_rate(TIGHT, 0.6), burst=BURST, held_out=True),
    Scenario("13-batch-slowdown", "4 clients; the fast server slows 3x, then recovers",
             ROOMY, 3000, clients=4,
             events=(Event(1000, "slow", "fast", factor=3.0),
                     Event(2000, "slow", "fast", factor=1 / 3))),
    Scenario("14-batch-outage", "4 clients; the fast server fails every request, then recovers",
             ROOMY, 3000, clients=4, held_out=True,
             events=(Event(1000, "fail", "fast", factor=1.0),
                     Event(2000, "fail", "fast", factor=0.0))),
)


# Issue 26: conversations on servers with prefix caches (prefill 1,000 tok/s, as the
# independent check). Turns of 3-30 grow to several thousand tokens; answers 32-256 tokens.
# Not in the default set: `meshroute bench learning --conversations` runs them.
CONVERSE = Conversations()
MIXED = Conversations(one_shot=0.5)
ANSWERS = (32, 256)
EQUAL = (caching("a", 60.0), caching("b", 60.0), caching("c", 60.0))
# Small batches that slow steeply: eight conversations on one node would saturate it.
CRAMPED = (caching("fast", 90.0, slots=4, slot_slowdown=0.25),
           caching("mid", 60.0, slots=8, slot_slowdown=0.1),
           caching("slow", 30.0, slots=8, slot_slowdown=0.05))
HETERO = (caching("fast", 90.0), caching("mid", 60.0), caching("slow", 30.0))

CONVERSATION_SCENARIOS: tuple[Scenario, ...] = (
    Scenario("15-conv-roomy", "8 conversations on three equal caching nodes: affinity pays",
             EQUAL, 2000, clients=8, tokens=ANSWERS, conversations=CONVERSE),
    Scenario("16-conv-slowdown", "8 conversations; node a slows 5x, then recovers",
             EQUAL, 2400, clients=8, tokens=ANSWERS, conversations=CONVERSE,
             events=(Event(800, "slow", "a", factor=5.0),
                     Event(1600, "slow", "a", factor=1 / 5))),
    Scenario("17-conv-saturates", "16 conversations; the fast node's small batch saturates",
             CRAMPED, 2400, clients=16, tokens=ANSWERS, conversations=CONVERSE),
    Scenario("18-conv-leave", "8 conversations; node a leaves mid-conversation, rejoins cold",
             EQUAL, 2400, clients=8, tokens=ANSWERS, conversations=CONVERSE,
             events=(Event(800, "leave", "a"), Event(1600, "join", "a", node=EQUAL[0]))),
    Scenario("19-conv-mixed", "8 clients, half one-shot prompts, nodes 90/60/30",
             HETERO, 2000, clients=8, tokens=ANSWERS, conversations=MIXED),
)


# Issue 31: a mesh whose fast node has few slots (llama.cpp --parallel 2 on a GPU: 2 at once
# at 2,000 tok/s each, more wait in FIFO order) beside a node serving 8 at once at 500 tok/s;
# 6 closed-loop clients. The best fixed split keeps 2 on the fast node (6,000 tok/s; a third
# there: 5,500). Then the same mesh in front of three trackers, each seeing only its own
# clients' requests; each node's load reaches a tracker on every answer and with the
# agent's refresh every 2 s (Scenario.load_view). Not in the default set: `meshroute bench
# learning --mesh` runs them.
SLOTTED = (whole("gpu", 2000.0, slots=2), whole("cpu", 500.0, slots=8))
MESH_CLIENTS = 6

# And conversations on engines whose cache is per slot (llama.cpp --parallel 2: each slot
# keeps its last prompt): 4 conversations on two such servers; pinned two a server, every
# returning turn finds its slot warm.
PER_SLOT = tuple(replace(caching(name, 60.0, slots=2, slot_slowdown=0.05),
                         cache_per_slot=True) for name in ("a", "b"))
# ... and 6 conversations from three trackers on a 2-slot GPU server beside an 8-slot CPU
# one, both caching per slot.
GPU_CPU_PER_SLOT = (replace(caching("gpu", 120.0, slots=2, slot_slowdown=0.05),
                            cache_per_slot=True),
                    replace(caching("cpu", 40.0, slots=8, slot_slowdown=0.05),
                            cache_per_slot=True))

MESH_SCENARIOS: tuple[Scenario, ...] = (
    Scenario("20-slots-one", "fast node with 2 slots beside an 8-slot one, 6 clients",
             SLOTTED, 3000, clients=MESH_CLIENTS),
    Scenario("21-slots-three", "20's mesh, three trackers with 2 clients each",
             SLOTTED, 3000, clients=MESH_CLIENTS, trackers=(2, 2, 2), announce_s=ANNOUNCE_S),
    Scenario("22-slots-skewed", "20's mesh, three trackers with 4 / 1 / 1 clients",
             SLOTTED, 3000, clients=MESH_CLIENTS, trackers=(4, 1, 1), announce_s=ANNOUNCE_S),
    Scenario("23-conv-per-slot", "4 conversations on two 2-slot servers caching per slot",
             PER_SLOT, 1200, clients=4, tokens=ANSWERS, conversations=CONVERSE),
    Scenario("24-conv-slots-three", "6 conversations from three trackers, a 2-slot GPU "
             "server beside an 8-slot CPU one, caches per slot",
             GPU_CPU_PER_SLOT, 1800, clients=MESH_CLIENTS, tokens=ANSWERS,
             conversations=CONVERSE, trackers=(2, 2, 2), announce_s=ANNOUNCE_S),
)


def by_name(name: str) -> Scenario:
    """The scenario called `name` (or whose name starts with `name`, e.g. "3")."""
    every = (*SCENARIOS, *CONVERSATION_SCENARIOS, *MESH_SCENARIOS)
    for s in every:
        if s.name == name or s.name.split("-")[0] == name:
            return s
    known = ", ".join(s.name for s in every)
    raise KeyError(f"unknown scenario {name!r}; known: {known}")
