"""Every HTTP error answer takes its status from http/errors.py's one table (`HttpError`):
no other product module passes an error status (400-599) as a literal to a call, the way
`RequestError(413, ...)` or `JSONResponse(body, 503)` did. Comparisons (`status >= 500`,
an upstream's 429) classify what others answered and are not flagged."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from meshroute_middleware.http.errors import ERROR_TABLE, HttpError

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("meshroute_middleware", "gossip", "node_agent")
HOME = "meshroute_middleware/http/errors.py"
STATUS_KEYWORDS = frozenset({"status", "status_code"})
# (module, call) -> why its literal is not an answer of ours through the table
ALLOWED = {
    # the in-memory transport reports what a crashed in-process node "answered": an
    # upstream's status (as aiohttp's would be), not an answer the gateway sends
    ("meshroute_middleware/forwarding/memory.py", "ForwardError"),
    # the provider chain's exhaustion answer lives in the pure core, below http/; issue 36
    # moves its rows into the table (the `lifecycle` part of that issue)
    ("meshroute_middleware/core/providers/exhaustion.py", "Exhaustion"),
}


def status_literals(source: str) -> list[tuple[int, str, int]]:
    """(line, callee, status) of each error status written as a literal argument of a call."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        values = [*node.args, *(k.value for k in node.keywords if k.arg in STATUS_KEYWORDS)]
        for value in values:
            if (isinstance(value, ast.Constant) and type(value.value) is int
                    and 400 <= value.value <= 599):
                found.append((node.lineno, ast.unparse(node.func), value.value))
    return found


def product_modules() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for package in PACKAGES
                  for p in (ROOT / package).rglob("*.py"))


def test_no_error_status_literal_outside_the_table() -> None:
    found = [f"{module}:{line}: {callee}(... {status} ...)"
             for module in product_modules() if module != HOME
             for line, callee, status in status_literals((ROOT / module).read_text())
             if (module, callee) not in ALLOWED]
    assert not found, "use an HttpError of http/errors.py:\n" + "\n".join(found)


def test_every_allowance_is_still_needed() -> None:
    for module, callee in ALLOWED:
        assert any(c == callee for _, c, _ in status_literals((ROOT / module).read_text())), (
            f"{module} no longer writes a status for {callee}: drop it from ALLOWED")


@pytest.mark.parametrize(("source", "flagged"), [
    ("raise RequestError(413, 'too big', 'request_too_large')", [413]),
    ("return JSONResponse(body, 503)", [503]),
    ("return Response(body, status_code=502)", [502]),
    ("await send_error(send, 404, 'no', 'not_found')", [404]),
    ("raise HttpError.REQUEST_TOO_LARGE.error('too big')", []),
    ("if status >= 500 or status == 429: pass", []),  # classifying an upstream's answer
    ("scan(count=500)", []),  # not a status
    ("Response(body, 200)", []),  # not an error
])
def test_the_scan(source: str, flagged: list[int]) -> None:
    assert [status for _, _, status in status_literals(source)] == flagged


def test_the_table() -> None:
    kinds = list(HttpError)
    assert len(HttpError.__members__) == len(kinds)  # no two kinds alike (an alias hides one)
    assert all(400 <= k.status <= 599 and k.code for k in kinds)
    assert all(isinstance(kind, HttpError) for kind in ERROR_TABLE.values())
    # one code, one status, except where the contract says otherwise: the head or body of a
    # request that does not arrive (408) and a deadline that runs out (504)
    statuses: dict[str, set[int]] = {}
    for kind in kinds:
        statuses.setdefault(kind.code, set()).add(kind.status)
    assert {c: s for c, s in statuses.items() if len(s) > 1} == {
        "request_timeout": {408, 504}}
