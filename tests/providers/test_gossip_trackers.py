"""Two `meshroute serve` processes gossiping over loopback with no limits store (issue 23,
part 3): a route that fails on A ranks below its healthy peer on B before B called it, and a
429 cooldown learned by A holds on B."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from ..upstream import free_port, serve_process
from .fake_provider import FakeProvider, Reply
from .gateway import ENV, HI

PATIENCE_S = 20.0  # gossip every 0.3 s; what must happen, on a loaded machine


def config_text(bad: FakeProvider, good: FakeProvider) -> str:
    lines = ['[routing]', 'chain = ["badco/m", "goodco/m"]']
    for name, fake, env in (("badco", bad, "FAST_A"), ("goodco", good, "SLOW_A")):
        lines += ["[[providers]]", f'name = "{name}"', f'base_url = "{fake.base_url}"',
                  f'keys = ["env:{env}"]', "[[providers.models]]", 'id = "m"',
                  'tier = "large"']
    return "\n".join(lines) + "\n"


def chain(url: str, model: str = "auto") -> list[dict[str, object]]:
    rows: list[dict[str, object]] = httpx.get(f"{url}/v1/routing/chain", timeout=10,
                                              params={"model": model}).json()["chain"]
    return rows


def test_b_learns_what_a_saw_of_a_provider(tmp_path: Path) -> None:
    bad = FakeProvider("bad", models=("m",), default=Reply.error(500))
    good = FakeProvider("good", models=("m",))
    with bad.serve(), good.serve():
        config = tmp_path / "meshroute.toml"
        config.write_text(config_text(bad, good))
        pa, pb = free_port(), free_port()
        common = ["--config", str(config), "--state-file", ":memory:", "--log-level",
                  "warning", "--gossip-interval", "0.3"]
        with serve_process([*common, "--gossip-listen", f"127.0.0.1:{pa}", "--gossip-peer",
                            f"127.0.0.1:{pb}"], tmp_path / "a.log", ENV) as (a, _), \
                serve_process([*common, "--gossip-listen", f"127.0.0.1:{pb}",
                               "--gossip-peer", f"127.0.0.1:{pa}"], tmp_path / "b.log",
                              ENV) as (b, _):
            for _ in range(6):  # badco fails on A (5xx), goodco serves
                assert httpx.post(f"{a}/v1/chat/completions", timeout=30, json={
                    "model": "badco/m", "messages": HI}).status_code in (429, 502, 503)
            bad.default = Reply.rate_limited("60")
            httpx.post(f"{a}/v1/chat/completions", timeout=30,
                       json={"model": "badco/m", "messages": HI})
            deadline = time.monotonic() + PATIENCE_S
            while True:
                rows = chain(b)
                key = chain(b, "badco/m")[0]["keys"][0]  # type: ignore[index]
                if rows[0]["route"] == "goodco/m" and key["state"] == "cooldown":
                    break
                assert time.monotonic() < deadline, (rows, key)
                time.sleep(0.2)
            assert key["limits"] == "gossip"
            assert len(bad.seen) == 7 and len(good.seen) == 0  # B called neither
            # a clear sent to B lifts A's own cooldown too (a newer clear supersedes it)
            assert httpx.post(f"{b}/v1/cooldowns/clear",
                              json={"route": "badco/m"}).status_code == 200
            deadline = time.monotonic() + PATIENCE_S
            while chain(a, "badco/m")[0]["keys"][0]["state"] != "ready":  # type: ignore[index]
                assert time.monotonic() < deadline, "the clear never reached A"
                time.sleep(0.2)
