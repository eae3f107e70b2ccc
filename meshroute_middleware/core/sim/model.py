"""What a simulated mesh is made of: nodes, scenario events, arrival processes, scenarios."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..topology import NodeRecord

MODEL = "sim-model"
ANSWERS, EXACT, NONE = "answers", "exact", "none"  # Scenario.load_view


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """A simulated inference node serving layers start..end of a `layers`-layer model."""

    node_id: str
    start: int
    end: int
    layers: int
    s_per_layer: float  # seconds per token per layer served
    slots: int = 4  # requests served concurrently (the batch size); more wait in the queue
    latency_s: float = 0.0  # network latency paid once per request to reach this hop
    fail_rate: float = 0.0  # probability that a request through this node fails
    advertised_tps: float | None = None  # announced; default one noisy benchmark
    # Continuous batching: with k requests running, each one's per-token compute on this node
    # takes (1 + slot_slowdown · (k − 1)) times as long. 0: slots are independent; 1: the
    # node's total throughput stays flat however many run (a serial node in disguise).
    slot_slowdown: float = 0.0
    # Prefill (issue 26): prompt tokens/s of the whole model (a hop prefills its share of the
    # layers); 0: prompts cost nothing, as before. Time to first token adds the prompt's
    # uncached tokens / prefill speed.
    prefill_tps: float = 0.0
    cache_tokens: int = 0  # prefix-cache capacity in tokens (LRU); 0: no cache
    # The cache is per slot (issue 31; llama.cpp): it keeps at most `slots` prompts, each
    # slot's last, so a third conversation on a 2-slot server evicts one of the two.
    cache_per_slot: bool = False

    @property
    def span(self) -> int:
        """Layers served."""
        return self.end - self.start + 1

    @property
    def shard_tps(self) -> float:
        """True tokens/s of one request running alone on this node's whole shard."""
        return 1.0 / (self.span * self.s_per_layer)

    def slowdown(self, running: int) -> float:
        """Per-token compute multiplier with `running` requests in the batch."""
        return 1.0 + self.slot_slowdown * max(running - 1, 0)

    def throughput(self, running: int) -> float:
        """Total tokens/s of the node's whole shard with `running` requests (queue beyond
        `slots`): the saturation curve a policy has to learn."""
        batch = min(running, self.slots)
        return batch * self.shard_tps / self.slowdown(batch) if batch > 0 else 0.0

    def record(self, advertised_tps: float) -> NodeRecord:
        """The node record it announces to the router: its slots too, as `meshroute node`
        does (an emulated node's batch, llama.cpp's /slots, --slots)."""
        return NodeRecord(self.node_id, MODEL, self.start, self.end, self.layers,
                          f"http://127.0.0.1/{self.node_id}", advertised_tps,
                          slots=self.slots)


def whole(node_id: str, tps: float, *, layers: int = 32, slots: int = 4,
          fail_rate: float = 0.0, slot_slowdown: float = 0.0) -> NodeSpec:
    """A node serving every layer of the model at `tps` tokens/s (one request alone)."""
    return NodeSpec(node_id, 0, layers - 1, layers, 1.0 / (tps * layers), slots,
                    fail_rate=fail_rate, slot_slowdown=slot_slowdown)


def caching(node_id: str, tps: float, *, slots: int = 16, slot_slowdown: float = 0.05,
            prefill_tps: float = 1000.0, cache_tokens: int = 32_000, layers: int = 32) -> NodeSpec:
    """A batching server with a prefix cache: prompts prefill at `prefill_tps`, the cached
    prefix of a prompt is skipped (vLLM automatic prefix caching, SGLang, llama.cpp)."""
    return replace(whole(node_id, tps, layers=layers, slots=slots, slot_slowdown=slot_slowdown),
                   prefill_tps=prefill_tps, cache_tokens=cache_tokens)


def serial(node_id: str, tps: float) -> NodeSpec:
    """A server that runs one request at a time (llama.cpp without --parallel)."""
    return whole(node_id, tps, slots=1)


def batching(node_id: str, tps: float, slots: int, slot_slowdown: float) -> NodeSpec:
    """A continuous-batching server (vLLM, TGI, llama.cpp --parallel): `slots` requests at
    once, each slowed by `slot_slowdown` per batch neighbour; the rest queue (saturation)."""
    return whole(node_id, tps, slots=slots, slot_slowdown=slot_slowdown)


@dataclass(frozen=True, slots=True)
class Event:
    """A change applied just before the arrival of request `at_request`.

    kind: "slow" (multiply the node's s_per_layer by `factor`), "leave", or "join" (`node`).
    """

    at_request: int
    kind: str
    node_id: str = ""
    factor: float = 1.0
    node: NodeSpec | None = None


@dataclass(frozen=True, slots=True)
class Conversations:
    """A multi-turn workload: each closed-loop client holds one conversation at a time, its
    next turn sent when the last answer came (the prompt grows by the answer and a new
    message); a share of the conversations are one-shot prompts."""

    turns: tuple[int, int] = (3, 30)  # turns per conversation, uniform inclusive
    system_tokens: tuple[int, int] = (200, 1000)  # the first message
    user_tokens: tuple[int, int] = (20, 300)  # each new message
    one_shot: float = 0.0  # share of one-turn prompts
    one_shot_tokens: tuple[int, int] = (200, 2000)


@dataclass(frozen=True, slots=True)
class Scenario:
    """A mesh, its arrival process and its changes; `requests` is the full-run length."""

    name: str
    title: str
    nodes: tuple[NodeSpec, ...]
    requests: int
    events: tuple[Event, ...] = ()
    clients: int = 1  # closed loop: this many clients, each sends when its last finished
    poisson_rate: float = 0.0  # open loop when > 0: Poisson arrivals per second
    # Bursty open loop (with poisson_rate): bursts of `burst` back-to-back arrivals, spaced so
    # that the mean rate stays poisson_rate. 1: plain Poisson.
    burst: int = 1
    held_out: bool = False  # never looked at while tuning the default policy
    noise_sigma: float = 0.1  # log-normal sigma of the multiplicative service-time noise
    hop_token_s: float = 0.0  # per-token network latency at each hop boundary
    tokens: tuple[int, int] = (64, 512)  # completion tokens, uniform inclusive
    announce_s: float = 0.0  # nodes re-announce their queue depth this often (0: never)
    quick_requests: int = 800
    changes: tuple[int, ...] = field(default=())  # requests where the best route may change
    conversations: Conversations | None = None  # multi-turn prompts (issue 26); None: none
    # Several trackers in front of one mesh (issue 31): closed-loop clients per tracker, in
    # client order (e.g. (4, 1, 1)); each tracker sees only its own clients' requests in
    # flight, and their statistics gossip every gossip_s. (): one tracker.
    trackers: tuple[int, ...] = ()
    gossip_s: float = 1.0  # gossip's default round (gossip/service.py)
    # What a tracker learns of the requests others sent (issue 31): ANSWERS, each node's
    # count of the requests it holds on every answer's first byte (the agent's header) and
    # with every announcement; EXACT, the true counts before every decision (what perfect,
    # instant sharing would give); NONE, nothing (each tracker sees its own requests only).
    load_view: str = "answers"

    def change_points(self) -> tuple[int, ...]:
        """Request indices after which convergence is measured: 0 and every event."""
        points = {0, *self.changes, *(e.at_request for e in self.events)}
        return tuple(sorted(points))

    def scaled(self, requests: int) -> Scenario:
        """The same scenario over `requests` requests, events moved proportionally."""
        k = requests / self.requests
        events = tuple(_move(e, round(e.at_request * k)) for e in self.events)
        return replace(self, requests=requests, events=events,
                       changes=tuple(round(c * k) for c in self.changes))


def _move(event: Event, at_request: int) -> Event:
    return Event(at_request, event.kind, event.node_id, event.factor, event.node)
