"""The demo's conversations: the warm/cold marker per request, the answer's text carried
into the next turn, and the summary counting returning turns."""

from __future__ import annotations

import json
import random

from meshroute_middleware.app.demo.driver import answer_text, conversation_start
from meshroute_middleware.app.demo.tally import Tally
from meshroute_middleware.app.demo.view import _coloured
from meshroute_middleware.core.contracts.cache import CacheNote, parse_cache
from meshroute_middleware.core.prefix import message_chain


def test_each_request_gets_its_cache_marker_and_returning_turns_are_counted() -> None:
    tally = Tally()
    tally.best_tps = {"m": 50.0}
    assert tally.noted(parse_cache("cold; cached=0; prompt=420"), returning=False) == "○ cold"
    tally.served("m", 24, 0.5, 50.0)
    assert tally.noted(CacheNote("warm", 430, 440), returning=True) == "● warm"
    tally.served("m", 24, 0.5, 50.0)
    assert tally.noted(CacheNote("partial", 30, 440), returning=True) == "◐ partial"
    tally.served("m", 24, 0.5, 50.0)
    assert tally.noted(None, returning=True) == ""  # a node without a cache: no marker
    assert tally.cache == {"cold": 1, "warm": 1, "partial": 1}
    assert (tally.turns, tally.warm_turns) == (2, 1)
    summary = tally.summary()
    assert "delivered 48.0 tok/s per request" in summary  # every served turn counts
    assert "2 returning conversation turns, 50% warm" in summary


def test_no_conversation_no_turns_in_the_summary() -> None:
    assert "conversation" not in Tally().summary()


def test_the_answer_text_is_read_from_json_and_from_a_stream() -> None:
    body = json.dumps({"choices": [{"message": {"role": "assistant", "content": "a b"}}]})
    assert answer_text(body.encode(), stream=False) == "a b"
    chunks = [{"choices": [{"delta": {"role": "assistant", "content": "a"}}]},
              {"choices": [{"delta": {"content": " b"}}]}, {"choices": [{"delta": {}}]}]
    sse = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    assert answer_text(sse.encode(), stream=True) == "a b"
    assert answer_text(b"not json", stream=False) == ""


def test_a_conversation_prompt_is_long_enough_to_be_worth_caching() -> None:
    prompt = message_chain(conversation_start(random.Random(1)))
    assert prompt is not None and prompt.prompt_tokens > 300


def test_the_live_view_colours_the_marker_and_keeps_the_line() -> None:
    line = "exploit         ● warm     box[0-31]"
    shown = _coloured(line)
    assert "\x1b[32m● warm\x1b[0m" in shown
    assert shown.replace("\x1b[32m", "").replace("\x1b[0m", "") == line
    assert _coloured("chain   qwen-demo a->b") == "chain   qwen-demo a->b"
