"""Provider-key affinity under `meshroute serve --workers 2` (issue 35): the workers share no
memory of conversations, yet every turn of a conversation lands on its one key, because each
worker computes the same key order (core/providers/affinity.py). Real processes; a fresh
connection per turn, so any worker may take any turn (which one did is not asserted)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from ..upstream import serve_process
from .fake_provider import FakeProvider
from .gateway import ENV
from .test_affinity import CachingProvider
from .test_serve_process import config_text


def test_every_turn_of_a_conversation_lands_on_one_key_across_two_workers(
        tmp_path: Path) -> None:
    fast, slow = CachingProvider("fast"), FakeProvider("slow", models=("small-model",))
    with fast.serve(), slow.serve():
        config = tmp_path / "meshroute.toml"
        config.write_text(config_text(fast, slow).replace("cache_ttl = 0", 'cache_ttl = "5m"'))
        flags = ["--config", str(config), "--state-file", str(tmp_path / "state.db"),
                 "--workers", "2", "--log-level", "warning"]
        keys: dict[str, list[str | None]] = {}
        cached: dict[str, list[int]] = {}
        with serve_process(flags, tmp_path / "log", ENV) as (url, _):
            for name in ("alpha", "beta", "gamma"):
                messages: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
                for turn in range(4):
                    messages.append({"role": "user", "content": f"{name} {turn}"})
                    seen = len(fast.seen)
                    with httpx.Client(timeout=30) as client:  # a new connection: any worker
                        answer = client.post(f"{url}/v1/chat/completions", json={
                            "model": "fastco/big-model", "messages": messages})
                    assert answer.status_code == 200, answer.text
                    body = answer.json()
                    messages.append(body["choices"][0]["message"])
                    keys.setdefault(name, []).extend(s.key for s in fast.seen[seen:])
                    cached.setdefault(name, []).append(
                        body["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0))
    for name in keys:
        assert len(keys[name]) == 4 and len(set(keys[name])) == 1, (name, keys[name])
        assert cached[name][0] == 0 and all(c > 0 for c in cached[name][1:]), cached
