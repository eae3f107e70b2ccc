"""Issue 11, item 6 — deep JSON: nested 20,000 deep raised RecursionError (500 and a
traceback); nested 1,010 deep passed our parser and broke the node's. Both are refused with
400 invalid_json before anything is forwarded, counted; 128 levels still pass."""

from __future__ import annotations

import pytest

from meshroute_middleware.http.request import RequestError, parse_chat

from ..chat.test_forward import Mesh, assert_openai_error, node
from ..upstream import FakeChat

pytestmark = pytest.mark.anyio
MAX_JSON_DEPTH = 128  # request.MAX_JSON_DEPTH


def nested(depth: int, kind: str = "list") -> bytes:
    """A chat request whose `messages[0].content` nests `depth` containers in all."""
    opening, closing = ("[", "]") if kind == "list" else ('{"a":', "}")
    inner = depth - 3  # the request object, messages and the message are three levels
    value = opening * inner + "1" + closing * inner
    return ('{"model":"m","messages":[{"role":"user","content":' + value + "}]}").encode()


@pytest.mark.parametrize(("depth", "kind"), [(20_000, "list"), (20_000, "dict"),
                                             (1_010, "list"), (1_010, "dict"),
                                             (MAX_JSON_DEPTH + 1, "list")])
async def test_deep_json_is_refused_before_anything_is_forwarded(depth: int, kind: str) -> None:
    head = FakeChat("a")
    mesh = Mesh({1: head})
    mesh.add(node("a", 0, 39, 1))
    async with mesh.client() as client:
        resp = await client.post("/v1/chat/completions", content=nested(depth, kind),
                                 headers={"content-type": "application/json"})
    assert_openai_error(resp, 400, "invalid_json")
    assert head.seen == []
    assert mesh.gateway.telemetry.rejected.get("http") == 1
    assert mesh.gateway.router.routing_table()["models"]["m"]["candidates"][0]["samples"] == 0


async def test_json_at_the_depth_limit_is_forwarded() -> None:
    head = FakeChat("a")
    mesh = Mesh({1: head})
    mesh.add(node("a", 0, 39, 1))
    async with mesh.client() as client:
        resp = await client.post("/v1/chat/completions", content=nested(MAX_JSON_DEPTH))
    assert resp.status_code == 200, resp.text
    assert len(head.seen) == 1


def test_parse_chat_depth_limit_is_exact_and_brackets_in_strings_do_not_count() -> None:
    from meshroute_middleware.http import request
    assert request.MAX_JSON_DEPTH == MAX_JSON_DEPTH
    parse_chat(nested(MAX_JSON_DEPTH))
    with pytest.raises(RequestError) as err:
        parse_chat(nested(MAX_JSON_DEPTH + 1))
    assert err.value.code == "invalid_json"
    many = b'{"model":"m","messages":[{"role":"user","content":"' + b"[{" * 5000 + b'"}]}'
    assert parse_chat(many).model == "m"
