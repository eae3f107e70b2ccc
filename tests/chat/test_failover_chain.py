"""Mid-stream failover inside a chain (issue 34): a chain's mesh entry is continued on its
model's next route like any mesh route; over real sockets (uvicorn heads, the aiohttp
forwarder)."""

from __future__ import annotations

import json

import httpx
import pytest

from ..providers.fake_provider import FakeProvider
from ..providers.gateway import gateway, providers_doc
from ..upstream import ServerThread
from .test_failover import TEXT, WORDS, Continuer


@pytest.mark.parametrize("going_on", [True, False])
def test_a_chains_mesh_entry_is_continued_on_its_next_route(going_on: bool) -> None:
    fast, slow = FakeProvider("fast"), FakeProvider("slow", models=("small-model",))
    a, b = Continuer("a", die_after=5), Continuer("b", echo=True)
    with fast.serve(), slow.serve(), ServerThread(a.app()) as head_a, \
            ServerThread(b.app()) as head_b, gateway(providers_doc(
                fast, slow, chain=("qwen", "slowco/small-model"),
                mesh={"qwen": {"tier": "large"}})) as gw:
        for node_id, url, tps in (("a", head_a.url, 30), ("b", head_b.url, 10)):
            joined = httpx.post(f"{gw.url}/v1/nodes", json={
                "node_id": node_id, "model": "qwen", "start": 0, "end": 39, "layers": 40,
                "url": url, "tps": tps})
            assert joined.status_code in (200, 201)
        options = {} if going_on else {"meshroute": {"continue": False}}
        resp = gw.chat("auto", route=["qwen"], stream=True, **options)
        assert resp.status_code == 200
        chunks = [json.loads(line[6:]) for line in resp.text.splitlines()
                  if line.startswith("data: {")]
        if not going_on:  # the request's word holds in a chain too
            assert chunks[-1]["error"]["code"] == "upstream_failed"
            assert b.seen == []
            return
        assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks
                       if c.get("choices")) == TEXT
        assert not any("error" in c for c in chunks)
        assert resp.headers["x-meshroute-route"] == "qwen|a[0-39]"
    assert b.seen[0]["messages"][-1] == {"role": "assistant", "content": "".join(WORDS[:5])}
    assert slow.seen == []  # the chain did not fall over to the provider
