"""`meshroute serve --workers 2` with `[[clients]]`: one rpm and one ledger per client across
the workers (issue 24), with real processes and the official openai client.

The library-level proof of the same rule: tests/state/test_client_limits_shared.py (two
processes on one state file).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import openai

from ..upstream import serve_process
from .fake_provider import FakeProvider
from .gateway import ENV, HI
from .test_serve_process import config_text

KEY = "alice-secret-key-0123456789"


def wait_for(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Poll `condition` until it holds (a bound for a stuck gateway, not a timing check)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.05)
ADMIN = "admin-token-for-usage"
RPM = 3



def test_two_workers_hold_one_rpm_and_one_ledger_per_client(
        providers: tuple[FakeProvider, FakeProvider], tmp_path: Path) -> None:
    fast, slow = providers
    config = tmp_path / "meshroute.toml"
    config.write_text(config_text(fast, slow) + f"""

[[clients]]
name = "alice"
key = "sha256:{hashlib.sha256(KEY.encode()).hexdigest()}"
rpm = {RPM}
""")
    log = tmp_path / "log"
    flags = ["--config", str(config), "--state-file", str(tmp_path / "state.db"),
             "--workers", "2", "--admin-token", ADMIN, "--log-level", "warning"]
    with serve_process(flags, log, ENV) as (url, _):
        codes = []
        for _ in range(2 * RPM):  # a fresh connection each: the workers share the requests
            client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
            try:
                client.chat.completions.create(model="auto", messages=HI)  # type: ignore[arg-type]
                codes.append(200)
            except openai.RateLimitError as exc:
                codes.append(429)
                assert exc.code == "client_rate_limited"
            finally:
                client.close()
        usage = httpx.get(f"{url}/v1/usage", headers={"authorization": f"Bearer {ADMIN}"},
                          timeout=10).json()["data"]
    assert codes == [200] * RPM + [429] * RPM, codes
    assert len(fast.seen) + len(slow.seen) == RPM
    assert [(r["client"], r["requests"]) for r in usage] == [("alice", RPM)]
    assert KEY not in log.read_text() and all(
        KEY not in str(s.headers) for s in fast.seen + slow.seen)


def test_a_clients_daily_budget_and_usage_survive_a_restart(
        providers: tuple[FakeProvider, FakeProvider], tmp_path: Path) -> None:
    fast, slow = providers
    config = tmp_path / "meshroute.toml"
    # the fake answers 5 + 8 tokens; max_tokens 1 reserves 5 + 1: two answers fit, not three
    config.write_text(config_text(fast, slow) + f"""

[[clients]]
name = "alice"
key = "sha256:{hashlib.sha256(KEY.encode()).hexdigest()}"
daily_tokens = 30
""")
    flags = ["--config", str(config), "--state-file", str(tmp_path / "state.db"),
             "--admin-token", ADMIN, "--log-level", "warning"]
    headers = {"authorization": f"Bearer {KEY}"}
    body = {"model": "fastco/big-model", "messages": HI, "max_tokens": 1}
    with serve_process(flags, tmp_path / "log", ENV) as (url, _):
        for _ in range(2):
            assert httpx.post(f"{url}/v1/chat/completions", headers=headers, json=body,
                              timeout=30).status_code == 200
        # a request is recorded once its answer has ended (chat/spend.py): the kill below
        # must not race the second one's write
        wait_for(lambda: [r["requests"] for r in httpx.get(
            f"{url}/v1/usage", headers={"authorization": f"Bearer {ADMIN}"},
            timeout=10).json()["data"]] == [2])
    with serve_process(flags, tmp_path / "log", ENV) as (url, _):  # killed, started again
        refused = httpx.post(f"{url}/v1/chat/completions", headers=headers, json=body,
                             timeout=30)
        usage = httpx.get(f"{url}/v1/usage", headers={"authorization": f"Bearer {ADMIN}"},
                          timeout=10).json()["data"]
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "budget_exceeded"
    assert [(r["client"], r["requests"], r["prompt_tokens"] + r["completion_tokens"])
            for r in usage] == [("alice", 2, 26)]
    assert len(fast.seen) == 2
