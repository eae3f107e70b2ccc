"""Issue 26: an `x-session-id` marks a conversation for the router, through the gateway."""

from __future__ import annotations

import pytest

from meshroute_middleware.core.prefix import message_chain

from ..upstream import FakeChat
from .test_forward import Mesh, node

pytestmark = pytest.mark.anyio


async def test_a_session_id_ties_a_summarised_turn_to_the_route_that_served_it() -> None:
    mesh = Mesh({1: FakeChat("a", tokens=20), 2: FakeChat("b", tokens=20)})
    mesh.add(node("a", 0, 39, 1, tps=30), node("b", 0, 39, 2, tps=10))
    first = [{"role": "system", "content": "s" * 2000}, {"role": "user", "content": "hi"}]
    async with mesh.client() as client:
        resp = await client.post("/v1/chat/completions", headers={"x-session-id": "conv-9"},
                                 json={"model": "m", "messages": first})
        assert resp.status_code == 200
        served = resp.headers["x-meshroute-route"]
        unmarked = await client.post("/v1/chat/completions",
                                     json={"model": "m", "messages": first[1:]})
        assert unmarked.status_code == 200
    summary = [{"role": "user", "content": "what we said, in short"}]
    hinted, plain = message_chain(summary, "conv-9"), message_chain(summary)
    assert hinted is not None and plain is not None
    table = mesh.gateway.router.prefixes
    assert table.warm(hinted) == {served: hinted.prompt_tokens}
    assert table.warm(plain) == {}
