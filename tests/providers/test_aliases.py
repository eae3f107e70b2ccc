"""`[aliases]` over a real gateway with the official openai client: Claude Code's and Codex's
model names resolve onto chains and mesh models, answers name the model asked for."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from ..upstream import FakeChat, ServerThread
from .fake_provider import FakeProvider
from .gateway import HI, Running, gateway, providers_doc

ALIASES = {"claude-haiku-*": "qwen", "claude-*": "auto:smart", "gpt-5-codex": "auto",
           "house-model": "fastco/big-model"}


@pytest.fixture
def gw(providers: tuple[FakeProvider, FakeProvider]) -> Iterator[tuple[Running, FakeChat]]:
    fast, slow = providers
    doc = providers_doc(fast, slow)
    doc["aliases"] = ALIASES
    node = FakeChat("n1", tokens=6)
    with ServerThread(node.app()) as head, gateway(doc) as running:
        resp = httpx.post(f"{running.url}/v1/nodes", json={
            "node_id": "n1", "model": "qwen", "start": 0, "end": 39, "layers": 40,
            "url": head.url})
        assert resp.status_code == 201
        yield running, node


def client(gw: Running) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)


@pytest.mark.parametrize("asked", ["claude-sonnet-4-5", "claude-opus-4-1-20250805"])
def test_claude_codes_model_names_resolve_onto_the_smart_chain(
        gw: tuple[Running, FakeChat], providers: tuple[FakeProvider, FakeProvider],
        asked: str) -> None:
    running, _ = gw
    fast, slow = providers
    raw = client(running).chat.completions.with_raw_response.create(model=asked, messages=HI)
    completion = raw.parse()
    assert completion.model == asked  # the model the client asked for
    assert json.loads(raw.content)["model"] == asked
    assert raw.headers["x-meshroute-tried"].split("#")[0] in {"fastco/big-model",
                                                               "slowco/small-model", "qwen"}
    assert asked not in [s.model for s in fast.seen + slow.seen]  # upstreams get their own id
    stream = client(running).chat.completions.create(model=asked, messages=HI, stream=True)
    chunks = list(stream)
    assert chunks and {c.model for c in chunks} == {asked}


def test_an_alias_onto_a_mesh_model_streams_with_the_asked_name(
        gw: tuple[Running, FakeChat]) -> None:
    running, node = gw
    raw = client(running).chat.completions.with_raw_response.create(
        model="claude-haiku-4-5", messages=HI)
    assert raw.headers["x-meshroute-route"] == "qwen|n1[0-39]"
    assert node.seen[-1]["body"]["model"] == "qwen"  # the node gets its own model's name
    assert raw.parse().model == "claude-haiku-4-5"
    text = ""
    with httpx.stream("POST", f"{running.url}/v1/chat/completions", json={
            "model": "claude-haiku-4-5", "messages": HI, "stream": True}) as resp:
        for part in resp.iter_raw(7):  # small reads: events cross chunk boundaries
            text += part.decode()
    events = [json.loads(line[6:]) for line in text.splitlines()
              if line.startswith("data: {")]
    assert len(events) == 7 and all(e["model"] == "claude-haiku-4-5" for e in events)
    assert "t0 t1" in "".join(e["choices"][0]["delta"].get("content", "") for e in events)


def test_codex_and_a_provider_model_alias(gw: tuple[Running, FakeChat],
                                          providers: tuple[FakeProvider, FakeProvider]) -> None:
    running, _ = gw
    fast, _slow = providers
    raw = client(running).chat.completions.with_raw_response.create(
        model="gpt-5-codex", messages=HI)
    assert raw.headers["x-meshroute-tried"].split("#")[0] in {"fastco/big-model",
                                                               "slowco/small-model"}
    assert raw.parse().model == "gpt-5-codex"
    house = client(running).chat.completions.with_raw_response.create(
        model="house-model", messages=HI)
    assert house.headers["x-meshroute-route"].startswith("fastco/big-model#")
    assert house.parse().model == "house-model"
    assert fast.seen[-1].model == "big-model"


def test_no_alias_leaves_the_answer_alone(gw: tuple[Running, FakeChat]) -> None:
    running, _ = gw
    assert client(running).chat.completions.create(model="qwen", messages=HI).model == "qwen"
    with pytest.raises(openai.NotFoundError):
        client(running).chat.completions.create(model="gpt-4o", messages=HI)


def test_v1_models_lists_the_aliases(gw: tuple[Running, FakeChat]) -> None:
    running, _ = gw
    data = httpx.get(running.url + "/v1/models").json()["data"]
    aliases = [(m["id"], m["target"], m["pattern"]) for m in data if m["kind"] == "alias"]
    assert aliases == [("claude-haiku-*", "qwen", True), ("claude-*", "auto:smart", True),
                       ("gpt-5-codex", "auto", False),
                       ("house-model", "fastco/big-model", False)]
    listed: Any = client(running).models.list()
    assert "gpt-5-codex" in {m.id for m in listed}


def test_models_retrieve(gw: tuple[Running, FakeChat]) -> None:
    running, _ = gw
    c = client(running)
    for name, kind in [("qwen", "mesh"), ("auto", "chain"), ("auto:fast", "chain"),
                       ("fastco/big-model", "provider"), ("gpt-5-codex", "alias"),
                       ("claude-sonnet-4-5", "alias"), ("claude-*", "alias")]:
        model = c.models.retrieve(name)
        assert model.id == name and model.object == "model"
        assert model.model_extra is not None and model.model_extra["kind"] == kind
    assert c.models.retrieve("claude-sonnet-4-5").model_extra == {"kind": "alias",
                                                                  "target": "auto:smart"}
    with pytest.raises(openai.NotFoundError) as info:
        c.models.retrieve("gpt-4o")
    assert info.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        c.models.retrieve("auto:nonsense")


class _Toy:
    """A dialect of two fields, `m` and `q`, whose answers pass on as they are."""

    path = "/v1/toy"

    def open(self, send: Any) -> Any:
        class Translation:
            def __init__(self) -> None:
                self.send = send

            def request(self, body: bytes) -> bytes:
                doc = json.loads(body)
                return json.dumps({"model": doc["m"], "messages": [
                    {"role": "user", "content": doc["q"]}]}).encode()
        return Translation()


def test_a_dialects_model_is_aliased_too(gw: tuple[Running, FakeChat],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from meshroute_middleware.chat.dialects import DIALECTS
    monkeypatch.setitem(DIALECTS, _Toy.path, _Toy())  # type: ignore[arg-type]
    running, node = gw
    answer = httpx.post(running.url + _Toy.path, json={"m": "claude-haiku-4-5", "q": "hi"})
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-meshroute-route"] == "qwen|n1[0-39]"
    assert node.seen[-1]["body"]["model"] == "qwen"
    assert answer.json()["model"] == "claude-haiku-4-5"  # what the translation is handed
