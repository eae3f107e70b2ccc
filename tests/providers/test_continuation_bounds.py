"""Issue 34's provider continuation, its pieces alone: the `continue` key of a provider model,
and the bounds of what a continued (or gathered) answer holds: an SSE event held back until
its blank line, a gathered answer's text."""

from __future__ import annotations

import json
from collections.abc import MutableMapping
from typing import Any

import pytest

from meshroute_middleware.chat.continuation import MAX_EVENT_BYTES, Transcript
from meshroute_middleware.chat.gather import MAX_GATHERED_TEXT, Gathering
from meshroute_middleware.core.providers.config import (
    ProviderConfigError,
    parse_providers_config,
)


def provider_doc(**model: Any) -> dict[str, Any]:
    return {"providers": [{"name": "fastco", "base_url": "http://127.0.0.1:1/v1",
                           "keys": ["env:A"], "models": [{"id": "m", "tier": "large",
                                                          **model}]}]}


@pytest.mark.parametrize(("given", "continues"), [({}, False), ({"continue": True}, True),
                                                  ({"continue": False}, False)])
def test_a_provider_model_continues_only_when_it_says(given: dict[str, Any],
                                                      continues: bool) -> None:
    cfg = parse_providers_config(provider_doc(**given))
    assert cfg.providers[0].models[0].continues is continues


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_continue_must_be_a_boolean(value: object) -> None:
    with pytest.raises(ProviderConfigError, match="model 'm': continue must be true or false"):
        parse_providers_config(provider_doc(**{"continue": value}))


def test_an_event_that_never_ends_is_passed_on_not_held() -> None:
    """A route that never ends its event (no blank line) used to have all of it held back,
    unbounded and unseen; past MAX_EVENT_BYTES it passes as it comes, and the stream is no
    more continued."""
    transcript = Transcript("chat")
    assert transcript(b'data: {"choices": [{"delta": {"content": "a"}}]}\n\n') != b""
    piece = b"x" * (MAX_EVENT_BYTES // 4)
    out = [transcript(b"data: " + piece)] + [transcript(piece) for _ in range(4)]
    assert sum(len(o) for o in out) > MAX_EVENT_BYTES  # passed on, not held
    assert len(transcript._held) <= MAX_EVENT_BYTES
    assert transcript.partial().refusal  # no more continued


def _chunk(text: str) -> bytes:
    data = {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": {"content": text},
                                                   "finish_reason": None}]}
    return b"data: " + json.dumps(data).encode() + b"\n\n"


@pytest.mark.anyio
async def test_a_gathered_answer_past_its_bound_is_a_502() -> None:
    sent: list[MutableMapping[str, Any]] = []

    async def client(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    gathering = Gathering(client, "chat")
    await gathering({"type": "http.response.start", "status": 200,
                     "headers": [(b"content-type", b"text/event-stream")]})
    piece = "y" * (1024 * 1024)
    for _ in range(MAX_GATHERED_TEXT // len(piece) + 1):
        await gathering({"type": "http.response.body", "body": _chunk(piece),
                         "more_body": True})
    await gathering({"type": "http.response.body", "body": b"data: [DONE]\n\n",
                     "more_body": False})
    assert sent[0]["status"] == 502
    error = json.loads(sent[-1]["body"])["error"]
    assert error["code"] == "invalid_upstream_answer"
    assert "larger than meshroute gathers" in error["message"]
    assert gathering._answer is not None and not gathering._answer.choices  # nothing kept
