"""A document the workers of `--workers N` share (telemetry/workers.py `shared`): computed by
one worker at a time; while one computes it, the others answer the last body of the same tag
instead of blocking their event loop on the lock."""

from __future__ import annotations

import fcntl
from pathlib import Path

from meshroute_middleware.telemetry.worker_files import WorkerFiles
from meshroute_middleware.telemetry.workers import WorkerMetrics


def test_the_last_body_is_answered_while_another_worker_computes(tmp_path: Path) -> None:
    shared = WorkerMetrics(WorkerFiles(tmp_path, 1)).shared
    computed: list[bytes] = []

    def compute(body: bytes) -> bytes:
        computed.append(body)
        return body

    assert shared("doc", 10.0, 1.0, "t", lambda: compute(b"one")) == b"one"
    assert shared("doc", 10.5, 1.0, "t", lambda: compute(b"two")) == b"one"  # fresh: kept
    assert shared("doc", 11.5, 1.0, "u", lambda: compute(b"three")) == b"three"  # other tag
    with open(tmp_path / ".doc.lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker is computing it
        assert shared("doc", 20.0, 1.0, "u", lambda: compute(b"four")) == b"three"
        fcntl.flock(lock, fcntl.LOCK_UN)
    assert shared("doc", 20.0, 1.0, "u", lambda: compute(b"five")) == b"five"
    assert computed == [b"one", b"three", b"five"]
