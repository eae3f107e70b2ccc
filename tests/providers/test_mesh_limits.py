"""A mesh model's size in a chain (issue 33): `[mesh.MODEL] context / max_tokens / clamp`, and
a node's 400 refusing `max_tokens` falling over to a route that fits, Claude Code's default
request (`max_tokens: 32000`, the anthropic SDK on /v1/messages) included."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from meshroute_middleware.core.providers.chain import (
    FITS,
    TOO_BIG,
    Candidate,
    Fit,
    mesh_candidate,
    mesh_fit,
)
from meshroute_middleware.core.providers.config import (
    MeshLimits,
    ProviderConfigError,
    parse_providers_config,
)

from ..upstream import FakeChat, ServerThread, serve_process
from .fake_provider import FakeProvider
from .gateway import ENV, Running, gateway, providers_doc

CLAUDE_CODE_MAX_TOKENS = 32000  # what Claude Code asks for unless told otherwise


def mesh(context: int | None = None, max_tokens: int | None = None,
         clamp: bool = False) -> Candidate:
    return Candidate("qwen", "medium", size=MeshLimits(context, max_tokens, clamp))


@pytest.mark.parametrize(("candidate", "prompt", "asked", "fit"), [
    (mesh(), 100, 32000, FITS),  # nothing declared: never refused for size
    (mesh(max_tokens=4096), 100, 4096, FITS),
    (mesh(max_tokens=4096), 100, 4097, TOO_BIG),
    (mesh(max_tokens=4096), 100, None, FITS),  # no bound asked: the node's own default
    (mesh(context=4096), 100, 3996, FITS),
    (mesh(context=4096), 100, 3997, TOO_BIG),  # prompt + answer past the context
    (mesh(context=4096), 4096, None, TOO_BIG),  # the prompt alone fills it
    (mesh(max_tokens=4096, clamp=True), 100, 32000, Fit(True, 4096)),
    (mesh(context=4096, clamp=True), 100, 32000, Fit(True, 3996)),
    (mesh(context=4096, max_tokens=1024, clamp=True), 100, 32000, Fit(True, 1024)),
    (mesh(context=4096, clamp=True), 4096, 32000, TOO_BIG),  # no room left to clamp to
    (mesh(max_tokens=4096, clamp=True), 100, 10, FITS),  # fits: left as asked
])
def test_mesh_fit(candidate: Candidate, prompt: int, asked: int | None, fit: Fit) -> None:
    assert mesh_fit(candidate, prompt, asked) == fit


def test_mesh_tables_take_context_max_tokens_and_clamp() -> None:
    cfg = parse_providers_config({"mesh": {
        "qwen": {"tier": "large", "context": 8192, "max_tokens": 4096, "clamp": True},
        "tiny": {}}})
    assert mesh_candidate(cfg, "qwen").size == MeshLimits(8192, 4096, True)
    assert mesh_candidate(cfg, "tiny").size == MeshLimits()
    assert mesh_candidate(cfg, "undeclared").size == MeshLimits()


@pytest.mark.parametrize(("table", "says"), [
    ({"context": 0}, "context must be >= 1"),
    ({"max_tokens": "4096"}, "max_tokens must be an integer"),
    ({"clamp": "yes"}, "clamp must be true or false"),
    ({"clamp": True}, "clamp needs context or max_tokens"),
    ({"context": 2048, "max_tokens": 4096}, "max_tokens (4096) cannot exceed context (2048)"),
    ({"ctx": 4096}, "unknown key(s) ctx"),
])
def test_mesh_tables_refuse_what_is_wrong(table: dict[str, Any], says: str) -> None:
    with pytest.raises(ProviderConfigError, match=r"\[mesh.qwen\]") as err:
        parse_providers_config({"mesh": {"qwen": table}})
    assert says in str(err.value)


@contextmanager
def mesh_and_provider(providers: tuple[FakeProvider, FakeProvider], node: FakeChat,
                      qwen: dict[str, Any]) -> Iterator[Running]:
    """`auto = ["qwen", "fastco/big-model"]` in this order (context 32768), `claude-*`
    aliased onto it, and one node of qwen that refuses `max_tokens` over 4096 as vLLM does."""
    fast, slow = providers
    doc = providers_doc(fast, slow, chain=("qwen", "fastco/big-model"), mesh={"qwen": qwen},
                        routing={"strategy": "priority"})  # the chain's order, as written
    doc["providers"][0]["models"][0]["context"] = 32768
    doc["aliases"] = {"claude-*": "auto"}
    with ServerThread(node.app()) as head, gateway(doc) as gw:
        joined = httpx.post(f"{gw.url}/v1/nodes", json={
            "node_id": "n1", "model": "qwen", "start": 0, "end": 0, "layers": 1,
            "url": head.url, "tps": 50})
        assert joined.status_code == 201
        yield gw


@dataclass
class Streamed:
    status_code: int
    headers: httpx.Headers
    text: str


def claude_code(url: str) -> Streamed:
    """Claude Code's default request (streamed, as it does), with the anthropic client."""
    client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
    raw = client.messages.with_raw_response.create(
        model="claude-sonnet-4-5", max_tokens=CLAUDE_CODE_MAX_TOKENS, stream=True,
        messages=[{"role": "user", "content": "hi"}])
    text = "".join(e.delta.text for e in raw.parse() if e.type == "content_block_delta"
                   and e.delta.type == "text_delta")
    return Streamed(raw.status_code, raw.headers, text)


def test_a_request_larger_than_the_mesh_model_goes_to_a_route_that_fits(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    node = FakeChat("n1", tokens=4, max_tokens_limit=4096)
    with mesh_and_provider(providers, node, {"max_tokens": 4096}) as gw:
        big = gw.chat("auto", max_tokens=CLAUDE_CODE_MAX_TOKENS)
        small = gw.chat("auto", max_tokens=100)
        raw = claude_code(gw.url)
    assert big.status_code == 200
    assert big.headers["x-meshroute-route"] == "fastco/big-model#1"
    assert big.headers["x-meshroute-tried"] == "fastco/big-model#1"  # qwen never tried
    assert small.headers["x-meshroute-route"] == "qwen|n1[0-0]"
    assert raw.status_code == 200 and raw.text
    assert raw.headers["x-meshroute-route"].startswith("fastco/big-model#")
    assert [s["body"]["max_tokens"] for s in node.seen] == [100]
    assert providers[0].seen[-1].body["max_tokens"] == CLAUDE_CODE_MAX_TOKENS


def test_a_node_refusing_max_tokens_falls_over_to_the_next_route(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    node = FakeChat("n1", tokens=4, max_tokens_limit=4096)
    with mesh_and_provider(providers, node, {}) as gw:  # declared, size not stated
        over = gw.chat("auto", max_tokens=CLAUDE_CODE_MAX_TOKENS, )
        raw = claude_code(gw.url)
        node.status = 400  # a 400 about something else is still the client's own answer
        relayed = gw.chat("auto", max_tokens=100, )
        routing = httpx.get(f"{gw.url}/v1/routing", params={"model": "qwen"}).json()
    assert over.status_code == 200
    assert over.headers["x-meshroute-tried"] == "qwen,fastco/big-model#1"
    assert over.headers["x-meshroute-route"] == "fastco/big-model#1"
    assert raw.status_code == 200 and raw.text
    assert raw.headers["x-meshroute-tried"] == "qwen,fastco/big-model#2"
    assert relayed.status_code == 400 and relayed.json()["error"]["message"] == "n1 says 400"
    row = routing["models"]["qwen"]["candidates"][0]
    assert row["failures"] == 0  # the request's size is not the node's failure


def test_clamp_serves_on_the_mesh_with_max_tokens_lowered(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    node = FakeChat("n1", tokens=4, max_tokens_limit=4096)
    with mesh_and_provider(providers, node, {"max_tokens": 4096, "clamp": True}) as gw:
        answer = gw.chat("auto", max_tokens=CLAUDE_CODE_MAX_TOKENS)
        asked_less = gw.chat("auto", max_tokens=50)
        raw = claude_code(gw.url)
    assert answer.status_code == 200
    assert answer.headers["x-meshroute-route"] == "qwen|n1[0-0]"
    assert answer.headers["x-meshroute-clamped"] == "max_tokens=4096; asked=32000"
    assert "x-meshroute-clamped" not in asked_less.headers
    assert raw.status_code == 200 and raw.text
    assert raw.headers["x-meshroute-clamped"] == "max_tokens=4096; asked=32000"
    assert [s["body"]["max_tokens"] for s in node.seen] == [4096, 50, 4096]
    assert providers[0].seen == []


def test_a_chain_of_routes_all_too_small_answers_413(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    node = FakeChat("n1", tokens=4)
    with mesh_and_provider(providers, node, {"max_tokens": 4096}) as gw:
        answer = gw.chat("auto", max_tokens=40000)  # past the provider's 32768 too
    assert answer.status_code == 413
    assert {r["reason"] for r in answer.json()["error"]["routes"]} == {"context"}
    assert node.seen == []


def test_claude_codes_default_request_through_a_meshroute_serve_process(
        providers: tuple[FakeProvider, FakeProvider], tmp_path: Path) -> None:
    """`meshroute serve --config` as a process of its own, `auto = [qwen, fastco/big-model]`:
    with `[mesh.qwen] max_tokens = 4096` the request goes straight to the provider; with
    nothing declared, the node's own 400 falls over to it. Both answered 200."""
    fast, slow = providers
    node = FakeChat("n1", tokens=4, max_tokens_limit=4096)
    with ServerThread(node.app()) as head:
        for qwen, tried in (({"max_tokens": 4096}, "fastco/big-model#1"),
                            ({}, "qwen,fastco/big-model#1")):
            doc = providers_doc(fast, slow, chain=("qwen", "fastco/big-model"),
                                mesh={"qwen": qwen}, routing={"strategy": "priority"})
            doc["providers"][0]["models"][0]["context"] = 32768
            doc["aliases"] = {"claude-*": "auto"}
            config = tmp_path / "meshroute.toml"
            config.write_text(toml_text(doc))
            flags = ["--config", str(config), "--state-file", ":memory:"]
            with serve_process(flags, tmp_path / "serve.log", ENV) as (url, _):
                assert httpx.post(f"{url}/v1/nodes", json={
                    "node_id": "n1", "model": "qwen", "start": 0, "end": 0, "layers": 1,
                    "url": head.url, "tps": 50}).status_code == 201
                raw = claude_code(url)
            assert raw.status_code == 200 and raw.text
            assert raw.headers["x-meshroute-tried"] == tried


def toml_text(doc: dict[str, Any]) -> str:
    """The few TOML shapes a providers document uses (tables, arrays of tables, strings,
    numbers, lists of strings)."""
    def value(v: Any) -> str:
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return json.dumps(v)

    out: list[str] = []
    for name, table in doc.items():
        if isinstance(table, list):
            for item in table:
                out.append(f"[[{name}]]")
                out += [f"{k} = {value(v)}" for k, v in item.items() if k != "models"]
                for model in item.get("models", []):
                    out.append(f"[[{name}.models]]")
                    out += [f"{k} = {value(v)}" for k, v in model.items()]
        elif name == "mesh":
            for model, fields in table.items():
                out.append(f"[mesh.{model}]")
                out += [f"{k} = {value(v)}" for k, v in fields.items()]
        else:
            out.append(f"[{name}]")
            out += [f"{json.dumps(k)} = {value(v)}" for k, v in table.items()]
    return "\n".join(out) + "\n"
