"""Modules by job (issue 36): no product module over 450 lines, `middleware.py` dispatch only."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("meshroute_middleware", "gossip", "node_agent")
MAX_LINES = 450
MAX_MIDDLEWARE_LINES = 250


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


MODULES = sorted(str(p.relative_to(ROOT)) for package in PACKAGES
                 for p in (ROOT / package).rglob("*.py"))


def test_no_product_module_is_over_450_lines() -> None:
    over = {m: n for m in MODULES if (n := lines(ROOT / m)) > MAX_LINES}
    assert over == {}, "split these by job"


def test_middleware_is_dispatch_only() -> None:
    assert lines(ROOT / "meshroute_middleware/middleware.py") <= MAX_MIDDLEWARE_LINES


def test_the_scan_finds_the_modules() -> None:
    assert "meshroute_middleware/middleware.py" in MODULES and "gossip/wire.py" in MODULES
