"""Anthropic's cache breakpoints (`cache_control` on system blocks, turns and tools) reach a
Messages upstream exactly as the client sent them, on every turn of a conversation and on
the conversation's one key (issue 35); the OpenAI-upstream side, where they are dropped, is
tests/providers/test_cached_tokens.py."""

from __future__ import annotations

import json
from typing import Any

from .fake_anthropic import FakeAnthropic
from .fake_provider import FakeProvider
from .test_affinity import clock as clock  # the fixture
from .test_cached_tokens import (
    CACHED_SYSTEM,
    CACHED_TOOL,
    CACHED_TURN,
    claude_doc,
    messages_client,
)
from .test_client_spend import make_client, served


def test_cache_breakpoints_reach_a_messages_upstream_unchanged_on_one_key(
        providers: tuple[FakeProvider, FakeProvider], clock: Any) -> None:
    fast, slow = providers
    claude = FakeAnthropic(input_tokens=12, output_tokens=4, cache_read=300, cache_write=50)
    with claude.serve():
        doc = claude_doc(claude, fast, slow)
        doc["providers"][-1]["keys"] = ["env:SLOW_A", "env:FAST_A"]  # two keys: affinity
        with served(doc, [make_client("alice")], clock) as gw:
            api = messages_client(gw.url).messages
            messages: list[Any] = list(CACHED_TURN)
            for turn in range(3):
                msg = api.create(model="claudeco/claude-real", max_tokens=64,
                                 system=CACHED_SYSTEM, messages=messages, tools=[CACHED_TOOL])
                assert msg.usage.cache_read_input_tokens == 300
                said = [block.model_dump(exclude_none=True) for block in msg.content]
                results: list[Any] = [{"type": "tool_result", "tool_use_id": b["id"],
                                       "content": "sunny"}
                                      for b in said if b["type"] == "tool_use"]
                messages += [{"role": "assistant", "content": said},
                             {"role": "user", "content": [
                                 *results, {"type": "text", "text": f"and {turn}?"}]}]
    assert len(claude.seen) == 3
    for seen in claude.seen:
        body = seen["body"]
        assert body["system"] == CACHED_SYSTEM and body["tools"] == [CACHED_TOOL]
        assert body["messages"][0] == CACHED_TURN[0]
        assert json.dumps(body).count("cache_control") == 3
    assert len({seen["headers"]["x-api-key"] for seen in claude.seen}) == 1
