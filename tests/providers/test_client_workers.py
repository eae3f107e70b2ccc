"""`meshroute serve --workers 2` with `[[clients]]`: one rpm and one ledger per client across
the workers (issue 24), with real processes and the official openai client.

The library-level proof of the same rule: tests/state/test_client_limits_shared.py (two
processes on one state file).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai

from ..upstream import serve_process
from .fake_provider import FakeProvider, Reply
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


def test_two_workers_hold_each_requests_worst_case_in_flight(
        providers: tuple[FakeProvider, FakeProvider], tmp_path: Path) -> None:
    """Issue 32: 20 requests at once over two workers, against a `monthly_usd` worth 1.5 of
    them: the reservations are rows of the state file both workers read, so at most 2 are
    served (the example's big-model: 0.50 / 1.50 USD per million tokens)."""
    fast, slow = providers
    prompt, completion = 8000 // 4 + 4, 1000  # the estimate of 8,000 characters; max_tokens
    fast.default = Reply.ok(tokens=completion, prompt_tokens=prompt, ttfb_s=0.5)
    one = (prompt * 0.50 + completion * 1.50) / 1e6
    config = tmp_path / "meshroute.toml"
    config.write_text(config_text(fast, slow) + f"""

[[clients]]
name = "alice"
key = "sha256:{hashlib.sha256(KEY.encode()).hexdigest()}"
monthly_usd = {1.5 * one!r}
""")
    flags = ["--config", str(config), "--state-file", str(tmp_path / "state.db"),
             "--workers", "2", "--admin-token", ADMIN, "--log-level", "warning"]
    body = {"model": "fastco/big-model", "max_tokens": completion,
            "messages": [{"role": "user", "content": "x" * 8000}]}

    def post(_: int) -> int:  # a fresh connection each: both workers take some
        return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60,
                          headers={"authorization": f"Bearer {KEY}"}).status_code

    with serve_process(flags, tmp_path / "log", ENV) as (url, _):
        with ThreadPoolExecutor(20) as pool:
            codes = list(pool.map(post, range(20)))
        wait_for(lambda: sum(r["requests"] for r in httpx.get(
            f"{url}/v1/usage", headers={"authorization": f"Bearer {ADMIN}"},
            timeout=10).json()["data"]) == codes.count(200))
    assert 1 <= codes.count(200) <= 2 and codes.count(429) == 20 - codes.count(200), codes
    assert len(fast.seen) + len(slow.seen) == codes.count(200)
