"""`meshroute node --emulate --caps embeddings,completions` as a real process, found by a real
`meshroute serve` over mDNS on loopback (scripts/isolated): the official openai client's
embeddings and completions reach it, and never the emulated node that declares neither."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai

from node_agent.embeddings import vector

from .conftest import LOOPBACK
from .test_plain_backends import _free_port, processes, until

__all__ = ["processes"]  # the fixture, used by name below


def test_an_emulated_node_process_serves_embeddings_and_completions(
        tmp_path: Path, processes: Callable[..., subprocess.Popen[Any]]) -> None:
    port = _free_port()
    url = f"http://{LOOPBACK}:{port}"
    log = tmp_path / "procs.log"
    env = {"XDG_STATE_HOME": str(tmp_path)}
    processes(["serve", "--host", LOOPBACK, "--port", str(port), "--mdns-interfaces",
               LOOPBACK, "--seed", "1"], log, env)
    common = ["node", "--emulate", "--host", LOOPBACK, "--port", "0", "--mdns-interfaces",
              LOOPBACK, "--model", "emu", "--seconds-per-layer", "0"]
    processes([*common, "--node-id", "emb", "--caps", "embeddings,completions",
               "--embedding-dim", "8", "--tps", "5"], log, env)
    processes([*common, "--node-id", "plain", "--tps", "500"], log, env)

    def nodes() -> dict[str, Any]:
        try:
            got = httpx.get(url + "/v1/nodes", timeout=2).json()["nodes"]
        except (httpx.TransportError, ValueError):
            return {}
        return {n["node_id"]: n for n in got}
    until(lambda: set(nodes()) == {"emb", "plain"}, "both emulated nodes are discovered")
    assert "embeddings" in nodes()["emb"]["caps"]
    assert "embeddings" not in nodes()["plain"]["caps"]

    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    for _ in range(3):
        raw = client.embeddings.with_raw_response.create(model="emu", input="hello",
                                                         encoding_format="float")
        assert raw.headers["x-meshroute-route"].startswith("emu|emb[")
        assert raw.parse().data[0].embedding == vector("hello", 8)
    stream = client.completions.create(model="emu", prompt="hi", max_tokens=4, stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices).strip()
    # the chat-only node, whatever its speed, is no candidate for either
    table = httpx.get(url + "/v1/routing", timeout=5).json()
    heads = {r["head"] for r in table["embeddings"]["models"]["emu"]["candidates"]}
    assert heads == {"emb"}
    chat = {r["head"]: r for r in table["models"]["emu"]["candidates"]}
    assert chat["plain"]["successes"] == 0 and chat["plain"]["failures"] == 0
