"""`meshroute serve`'s garbage-collector set-up (app/run.py `settle_heap`), in a process of
its own: the start-up heap frozen, full collections made rarer, young ones left alone."""

from __future__ import annotations

import json
import subprocess
import sys

CODE = """
import gc, json
from meshroute_middleware.app.gcpace import GC_FULL_AFTER
from meshroute_middleware.app.run import settle_heap
before = gc.get_threshold()
garbage = [[]]
garbage[0].append(garbage)  # a reference cycle nobody holds: settle_heap collects it
del garbage
settle_heap()
print(json.dumps({"before": before, "after": gc.get_threshold(), "full_after": GC_FULL_AFTER,
                  "frozen": gc.get_freeze_count(), "left": len(gc.get_objects())}))
"""


def test_settle_heap_freezes_the_start_up_heap_and_makes_full_collections_rarer() -> None:
    out = subprocess.run([sys.executable, "-c", CODE], check=True, capture_output=True,
                         text=True, timeout=120)
    got = json.loads(out.stdout)
    assert got["after"] == [got["before"][0], got["before"][1], got["full_after"]]
    assert got["full_after"] > got["before"][2]  # rarer than CPython's default
    assert got["frozen"] > 10_000  # the imports, frozen
    assert got["left"] < 100  # and nothing of them left for the collections to walk
