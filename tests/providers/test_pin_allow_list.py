"""A pin obeys the client's allow-list on every API path (issue 32, row 3): a client allowed
only `auto` that pins `"route": ["fastco/big-model"]` gets 403 `model_not_allowed` on chat
completions, Messages (in Anthropic's error shape) and Responses, and no provider sees it."""

from __future__ import annotations

import hashlib
from typing import Any

import httpx
import pytest

from meshroute_middleware.core.clients import parse_clients

from .fake_provider import FakeProvider
from .gateway import HI, gateway, providers_doc

AUTO_ONLY_KEY = "mr-auto-only-0123456789abcdef"
ANY_KEY = "mr-anything-0123456789abcdef"
CLIENTS = parse_clients([
    {"name": "auto-only", "key": "sha256:" + hashlib.sha256(AUTO_ONLY_KEY.encode()).hexdigest(),
     "models": ["auto"]},
    {"name": "anything", "key": "sha256:" + hashlib.sha256(ANY_KEY.encode()).hexdigest()},
])
PIN = ["fastco/big-model"]
# (path, body) of each API: the same pin in each one's own request shape
BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"model": "auto", "messages": HI, "route": PIN},
    "/v1/messages": {"model": "auto", "max_tokens": 16, "messages": HI, "route": PIN},
    "/v1/responses": {"model": "auto", "input": "hi", "route": PIN},
}


def post(url: str, path: str, key: str, **changes: Any) -> httpx.Response:
    return httpx.post(f"{url}{path}", headers={"authorization": f"Bearer {key}"},
                      json={**BODIES[path], **changes}, timeout=30)


@pytest.mark.parametrize("path", list(BODIES))
def test_a_pin_outside_the_allow_list_is_403_on_every_api(
        providers: tuple[FakeProvider, FakeProvider], path: str) -> None:
    fast, slow = providers
    with gateway(providers_doc(fast, slow), clients=CLIENTS) as gw:
        pinned = post(gw.url, path, AUTO_ONLY_KEY)
        by_name = post(gw.url, path, AUTO_ONLY_KEY, model="fastco/big-model", route=None)
        unpinned = post(gw.url, path, AUTO_ONLY_KEY, route=None)
        other = post(gw.url, path, ANY_KEY)  # no allow-list: the pin is served
    assert pinned.status_code == 403, pinned.text
    error = pinned.json()["error"]
    if path == "/v1/messages":  # Anthropic's shape
        assert pinned.json()["type"] == "error"
        assert error["type"] == "permission_error"
    else:
        assert error["code"] == "model_not_allowed"
    assert "fastco/big-model" in error["message"]
    assert by_name.status_code == 403  # what it may not ask for by name, as before
    assert unpinned.status_code == 200, unpinned.text  # `auto` itself stays allowed
    assert other.status_code == 200, other.text
    assert [s.model for s in fast.seen] == ["big-model", "big-model"]  # never the pinned 403s


def test_a_pin_the_allow_list_names_is_served(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    clients = parse_clients([{"name": "both", "models": ["auto", "slowco/*"],
                              "key": "sha256:" + hashlib.sha256(ANY_KEY.encode()).hexdigest()}])
    with gateway(providers_doc(fast, slow), clients=clients) as gw:
        allowed = post(gw.url, "/v1/chat/completions", ANY_KEY, route=["slowco/small-model"])
        refused = post(gw.url, "/v1/chat/completions", ANY_KEY)
    assert allowed.status_code == 200, allowed.text
    assert allowed.headers["x-meshroute-route"].startswith("slowco/small-model")
    assert refused.status_code == 403
    assert [s.model for s in slow.seen] == ["small-model"] and fast.seen == []
