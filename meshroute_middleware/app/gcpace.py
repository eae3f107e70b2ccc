"""Pacing the garbage collector of a serving process: every pause short, full ones when cheap.

CPython 3.11 stops the world for a whole generation at a time, and no threshold bounds how
long (docs/benchmarks.md, "Load and soak"):
- its young generation is counted in *net* allocations, so while old streams end as fast as
  new ones start, the young list grows far past its 700 objects before a collection comes:
  young and middle collections of 50 ms with 1,000 streams open;
- a full collection walks every live tracked object, ~115 per open stream: 114 ms of one
  core with 1,000 streams open.

So `meshroute serve` paces the collector itself, from its event loop (`GcPacer.run`), between
two callbacks:
- the young generation is collected on a timer (`young_every_s`), so it only ever holds what
  was allocated, and is still alive, since the last tick;
- the middle one instead of every `middle_every`-th young one;
- a full collection is due `full_every_s` after the last one, and runs at the first middle
  tick where its predicted pause fits `pause_budget_s`. Its cost is proportional to the heap,
  read as pymalloc's allocated blocks above the frozen start-up heap
  (`sys.getallocatedblocks`, ~0.2 ms), at a rate learned from the full collections already
  run (the highest of the last four, and never under `min_s_per_block`: a cautious
  estimate). Under steady heavy load it waits; it runs when the load falls.
- A safety net: `force_after_s` after the last full collection, the next runs anyway if the
  heap grew by `force_growth` since that one (cyclic garbage that reached the old generation is
  freed by full collections only). Its pause is logged as a warning and counted. Under a
  steady load the heap does not grow, and none is forced.
CPython's own trigger stays as a backstop for the young generation alone (`backstop`
net allocations between two ticks: a loop stuck in one long callback).
"""

from __future__ import annotations

import gc
import logging
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import anyio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

log = logging.getLogger("meshroute.gc")

YOUNG, MIDDLE, FULL = 0, 1, 2
_NEVER = 1 << 30  # a threshold CPython's own trigger never reaches
# `--gc python` (serve.settle_heap) considers a full collection after this many middle ones
# (CPython's default: 10); a failed pacer falls back to the same thresholds.
GC_FULL_AFTER = 100
_CPYTHON_THRESHOLDS = (700, 10, GC_FULL_AFTER)
_MIN_SAMPLE_HEAP = 10_000  # blocks: a full collection on a smaller heap teaches no rate


@dataclass(frozen=True, slots=True)
class GcPacing:
    """When `GcPacer` collects what."""

    young_every_s: float = 0.025
    middle_every: int = 8  # young ticks per middle collection (CPython's default: 10)
    full_every_s: float = 60.0
    pause_budget_s: float = 0.020
    force_after_s: float = 1800.0
    force_growth: float = 1.25
    backstop: int = 10_000
    # The least a full collection is assumed to cost per allocated block. The gateway's was
    # 0.35 us with 300 streams open but 0.13 us on an idle heap, where untracked blocks
    # (strings, bytes) weigh more: what small heaps teach would be too low.
    min_s_per_block: float = 0.5e-6

    def __post_init__(self) -> None:
        for name in ("young_every_s", "full_every_s", "pause_budget_s", "force_after_s",
                     "min_s_per_block"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.middle_every < 1 or self.backstop < 1 or not self.force_growth >= 1:
            raise ValueError("middle_every and backstop must be >= 1, force_growth >= 1")


class GcPacer:
    """Runs the collections `GcPacing` plans; `settle` takes the collector over (process-wide).

    `clock` schedules full collections, `timer` measures pauses (the collecting thread's CPU
    time: the collector's own work, not time spent waiting for a core); tests pass fakes, and
    a `collect` and `heap_blocks` of their own."""

    def __init__(self, pacing: GcPacing | None = None, *,
                 clock: Callable[[], float] = time.monotonic,
                 timer: Callable[[], float] = time.thread_time,
                 collect: Callable[[int], int] = gc.collect,
                 heap_blocks: Callable[[], int] = sys.getallocatedblocks) -> None:
        self.pacing = pacing or GcPacing()
        self._clock, self._timer = clock, timer
        self._collect, self._heap_blocks = collect, heap_blocks
        self.collections = [0, 0, 0]  # per generation, by this pacer
        self.longest_s = [0.0, 0.0, 0.0]  # the longest pause per generation
        self.forced = 0  # full collections the safety net ran over budget
        self.deferred = 0  # middle ticks at which a due full collection waited
        self._ticks = 0
        self._rates: deque[float] = deque(maxlen=4)  # measured seconds per heap block
        self._base = 0  # allocated blocks of the frozen start-up heap
        self._full_at = 0.0  # when the last full collection ran (clock)
        self._heap_after_full = 0  # blocks above the base right after it

    def settle(self) -> None:
        """Collect and freeze the start-up heap (imports and the app as built leave every
        later collection), then leave CPython's trigger only its young-generation backstop."""
        gc.collect()
        gc.freeze()
        self._base = self._heap_blocks()
        self._full_at = self._clock()
        self._heap_after_full = 0
        gc.set_threshold(self.pacing.backstop, _NEVER, _NEVER)

    def predicted_full_s(self, heap: int) -> float:
        """A full collection's pause with `heap` blocks above the start-up heap."""
        return max((self.pacing.min_s_per_block, *self._rates)) * heap

    def tick(self) -> int:
        """Run the collection due now; returns its generation."""
        self._ticks += 1
        if self._ticks % self.pacing.middle_every:
            self._run(YOUNG)
            return YOUNG
        p = self.pacing
        waited = self._clock() - self._full_at
        if waited >= p.full_every_s:
            heap = max(self._heap_blocks() - self._base, 0)
            predicted = self.predicted_full_s(heap)
            forced = (predicted > p.pause_budget_s and waited >= p.force_after_s
                      and heap >= p.force_growth * self._heap_after_full)
            if predicted <= p.pause_budget_s or forced:
                pause = self._run(FULL)
                if heap >= _MIN_SAMPLE_HEAP:  # on less, the collector's fixed cost dominates
                    self._rates.append(pause / heap)
                self._full_at = self._clock()
                self._heap_after_full = max(self._heap_blocks() - self._base, 0)
                if forced:
                    self.forced += 1
                    log.warning("gc: a full collection %.0f s after the last one ran over its "
                                "budget (heap %d -> %d blocks): paused %.1f ms, predicted "
                                "%.1f ms", waited, heap, self._heap_after_full, pause * 1e3,
                                predicted * 1e3)
                return FULL
            self.deferred += 1
        self._run(MIDDLE)
        return MIDDLE

    def _run(self, generation: int) -> float:
        began = self._timer()
        self._collect(generation)
        pause = self._timer() - began
        self.collections[generation] += 1
        self.longest_s[generation] = max(self.longest_s[generation], pause)
        return pause

    async def run(self) -> None:
        """Tick forever on the running event loop (cancel to stop). Should a tick ever fail,
        the collector goes back to CPython's own triggers and the gateway serves on."""
        try:
            while True:
                await anyio.sleep(self.pacing.young_every_s)
                self.tick()
        except Exception:
            log.exception("gc: the pacer failed; CPython's own collector takes over")
            gc.set_threshold(*_CPYTHON_THRESHOLDS)

    def metric_families(self) -> Iterator[Metric]:
        """The pacer's counters, for /metrics."""
        runs = CounterMetricFamily("meshroute_gc_collections",
                                   "Garbage collections run by the gateway's pacer",
                                   labels=["generation"])
        longest = GaugeMetricFamily("meshroute_gc_pause_max_seconds",
                                    "Longest collection of each generation so far (CPU)",
                                    labels=["generation"])
        for generation, name in enumerate(("young", "middle", "full")):
            runs.add_metric([name], self.collections[generation])
            longest.add_metric([name], self.longest_s[generation])
        deferred = CounterMetricFamily("meshroute_gc_full_deferred",
                                       "Middle ticks at which a due full collection waited "
                                       "for a cheaper heap")
        deferred.add_metric([], self.deferred)
        forced = CounterMetricFamily("meshroute_gc_full_forced",
                                     "Full collections run over the pause budget after "
                                     "waiting too long while the heap grew")
        forced.add_metric([], self.forced)
        yield from (runs, longest, deferred, forced)
