"""bench_core's `--baseline REV`: the revision's core is imported beside the current one, so
its decisions are timed in the same rounds (no timing bounds here: only that the two cores
are distinct and both rows are timed)."""

from __future__ import annotations

import sys
from pathlib import Path

import meshroute_middleware.core as current
from benchmarks import bench_core as B


def test_the_baseline_core_is_imported_beside_the_current_one(tmp_path: Path) -> None:
    base = B.import_baseline("HEAD", str(tmp_path))
    assert base is not None
    assert base.__name__ == f"{B.BASELINE_PACKAGE}.core"
    assert str(tmp_path) in str(base.__file__)
    assert base.Router is not current.Router
    assert str(tmp_path) not in sys.path  # only the package import needed it
    theirs = B.build(8, 1, seed=9, policy="thompson", core=base)
    mine = B.build(8, 1, seed=9, policy="thompson")
    assert type(theirs[0]).__module__.startswith(B.BASELINE_PACKAGE)
    router = theirs[0]

    def samples() -> int:
        table = router.routing_table("model-0")["models"]["model-0"]
        return sum(int(row["samples"]) for row in table["candidates"])

    before = samples()
    rows = B.interleaved({"mine": mine, B.BASELINE_PREFIX + "8x1": theirs}, 60, rounds=2)
    assert set(rows) == {"mine", B.BASELINE_PREFIX + "8x1"}
    assert all(len(r["choose_round_medians_us"]) == 2 for r in rows.values())
    assert samples() > before  # the "+record" decisions were recorded on the baseline's router
