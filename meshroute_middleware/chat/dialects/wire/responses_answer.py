"""A chat-completions answer as an OpenAI Responses answer: the `response` object of a JSON
answer, and the Responses SSE events of a stream, translated chunk by chunk.

The stream keeps, per output item, the text or arguments it has passed on: the Responses
protocol repeats them whole in its `.done` events and in `response.completed`. What one stream
keeps is bounded (MAX_KEPT_CHARS over all its items, issue 32): every delta is passed on, but
past the bound the `.done` events and `response.completed` repeat only the first MAX_KEPT_CHARS
characters (docs/apis.md). Pure: parsed chat chunks in, JSON-ready events out; the adapter
(chat/dialects/responses.py) does the bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from meshroute_middleware.chat.dialects.wire.responses_request import Echo
from meshroute_middleware.core.errors import MeshRouteError

# Text and arguments one stream keeps for its closing events, in characters: 8x the longest
# answer a model writes today (128k output tokens at ~4 characters each, 0.5 Mi characters),
# and a few copies of it while the closing events are encoded stay far under 150 MB.
MAX_KEPT_CHARS = 4 * 1024 * 1024
JOIN_EVERY = 1024  # deltas kept apart before they are joined into one block
# chat finish_reason -> Responses incomplete_details.reason (any other: completed)
INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


class ResponsesAnswerError(MeshRouteError, ValueError):
    """A route's 200 answer is not a chat completion that can be translated."""


def response_object(echo: Echo, response_id: str, created_at: int, *, status: str,
                    output: list[dict[str, Any]], usage: dict[str, Any] | None = None,
                    finish: str | None = None,
                    error: dict[str, Any] | None = None) -> dict[str, Any]:
    """The `response` object: what it produced, and what it was asked (echoed)."""
    reason = INCOMPLETE.get(finish or "") if status == "incomplete" else None
    return {
        "id": response_id, "object": "response", "created_at": created_at, "status": status,
        "background": False, "error": error,
        "incomplete_details": None if reason is None else {"reason": reason},
        "instructions": echo.instructions, "max_output_tokens": echo.max_output_tokens,
        "model": echo.model, "output": output, "parallel_tool_calls": echo.parallel_tool_calls,
        "previous_response_id": None, "reasoning": {"effort": None, "summary": None},
        "store": False,  # nothing is kept: the id cannot be retrieved or continued from
        "temperature": echo.temperature, "text": echo.text, "tool_choice": echo.tool_choice,
        "tools": echo.tools, "top_p": echo.top_p, "truncation": "disabled", "usage": usage,
        "metadata": {},
    }


def status_of(finish: str | None) -> str:
    """`completed`, or `incomplete` when the route stopped at the token limit or a filter."""
    return "incomplete" if finish in INCOMPLETE else "completed"


def usage_of(usage: Any) -> dict[str, Any] | None:
    """Chat `usage` as Responses `usage` (None when the route reported none)."""
    if not isinstance(usage, dict):
        return None
    prompt, completion = _count(usage.get("prompt_tokens")), _count(
        usage.get("completion_tokens"))
    cached = _count((usage.get("prompt_tokens_details") or {}).get("cached_tokens"))
    reasoning = _count((usage.get("completion_tokens_details") or {}).get("reasoning_tokens"))
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": prompt + completion}


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def message_item(item_id: str, text: str, status: str,
                 refusal: str | None = None) -> dict[str, Any]:
    """An assistant `message` output item."""
    content: list[dict[str, Any]] = [_text_part(text)] if text or refusal is None else []
    if refusal:
        content.append({"type": "refusal", "refusal": refusal})
    return {"id": item_id, "type": "message", "status": status, "role": "assistant",
            "content": content}


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str,
              custom: bool = False) -> dict[str, Any]:
    """A `function_call` output item, or a `custom_tool_call` (its `input` unwrapped from the
    function's one argument) for a custom tool."""
    if custom:
        return {"id": item_id, "type": "custom_tool_call", "status": status,
                "call_id": call_id, "name": name, "input": custom_input(arguments)}
    return {"id": item_id, "type": "function_call", "status": status, "call_id": call_id,
            "name": name, "arguments": arguments}


def custom_input(arguments: str) -> str:
    """A custom tool's input from its function's arguments `{"input": ...}` (the arguments as
    they are when the route wrote something else)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(value, dict) and isinstance(value.get("input"), str):
        return str(value["input"])
    return arguments


def from_completion(completion: Any, echo: Echo, response_id: str,
                    created_at: int) -> dict[str, Any]:
    """The `response` object of a chat completion."""
    try:
        choice = completion["choices"][0]
        message = choice.get("message") or {}
        finish = choice.get("finish_reason")
        content, calls = message.get("content"), message.get("tool_calls") or []
        text = content if isinstance(content, str) else "".join(
            p.get("text", "") for p in content or () if isinstance(p, dict))
        status = status_of(finish)
        output = []
        refusal = message.get("refusal")
        if text or refusal:
            output.append(message_item(f"msg_{response_id[5:]}_0", text, status,
                                       refusal if isinstance(refusal, str) else None))
        for i, call in enumerate(calls):
            function = call.get("function") or {}
            name = str(function.get("name", ""))
            output.append(call_item(f"fc_{response_id[5:]}_{i + 1}", str(call.get("id", "")),
                                    name, str(function.get("arguments") or ""), status,
                                    name in echo.custom_tools))
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        raise ResponsesAnswerError(f"the route's answer is not a chat completion: "
                                   f"{type(exc).__name__}") from None
    return response_object(echo, response_id, created_at, status=status, output=output,
                           usage=usage_of(completion.get("usage")), finish=finish)


def completion_events(completion: Any, echo: Echo, response_id: str,
                      created_at: int) -> list[dict[str, Any]]:
    """The stream events of a whole chat completion: for a streamed request a route answered
    in one JSON body (a server that does not stream)."""
    from_completion(completion, echo, response_id, created_at)  # refuses what is no answer
    choice = completion["choices"][0]
    message = choice.get("message") or {}
    content = message.get("content")
    text = content if isinstance(content, str) else "".join(
        p.get("text", "") for p in content or () if isinstance(p, dict))
    calls = [{**call, "index": i} for i, call in enumerate(message.get("tool_calls") or [])]
    stream = ResponsesStream(echo, response_id, created_at)
    return stream.start() + stream.chunk({
        "choices": [{"delta": {"content": text, "tool_calls": calls},
                     "finish_reason": choice.get("finish_reason")}],
        "usage": completion.get("usage")}) + stream.end()


@dataclass(slots=True)
class _Item:
    """One output item of a stream, while and after it streams."""

    kind: str  # "message" | "function_call"
    item_id: str
    index: int  # output_index
    pieces: list[str] = field(default_factory=list)  # the latest deltas kept
    blocks: list[str] = field(default_factory=list)  # the earlier ones, joined JOIN_EVERY at a time
    call_id: str = ""
    name: str = ""

    def add(self, delta: str) -> None:
        """Keep a delta (a str object per delta costs ~50 bytes more than its text: joined)."""
        self.pieces.append(delta)
        if len(self.pieces) >= JOIN_EVERY:
            self.blocks.append("".join(self.pieces))
            self.pieces.clear()

    def whole(self, status: str, custom: frozenset[str] = frozenset()) -> dict[str, Any]:
        joined = "".join(self.blocks + self.pieces)
        self.blocks, self.pieces = [], [joined]
        if self.kind == "message":
            return message_item(self.item_id, joined, status)
        return call_item(self.item_id, self.call_id, self.name, joined, status,
                         self.name in custom)


class ResponsesStream:
    """Chat SSE chunks in, Responses SSE events out, one chunk at a time."""

    __slots__ = ("_calls", "_finish", "_items", "_message", "_room", "_seq", "_usage",
                 "created_at", "cut", "echo", "ended", "response_id")

    def __init__(self, echo: Echo, response_id: str, created_at: int,
                 max_kept_chars: int = MAX_KEPT_CHARS) -> None:
        self.echo, self.response_id, self.created_at = echo, response_id, created_at
        self.ended = False
        self._room = max_kept_chars  # characters the closing events may still repeat
        self.cut = False  # whether a delta went past them (the closing events are cut short)
        self._seq = 0
        self._items: list[_Item] = []
        self._message: _Item | None = None
        self._calls: dict[int, _Item] = {}  # the chat tool call's index -> its item
        self._finish: str | None = None
        self._usage: dict[str, Any] | None = None

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return event

    def _response(self, status: str, **extra: Any) -> dict[str, Any]:
        output = [item.whole(status if status != "failed" else "incomplete",
                             self.echo.custom_tools)
                  for item in self._items] if status != "in_progress" else []
        return response_object(self.echo, self.response_id, self.created_at, status=status,
                               output=output, finish=self._finish, **extra)

    def start(self) -> list[dict[str, Any]]:
        """The events that open the stream."""
        response = self._response("in_progress")
        return [self._event("response.created", response=response),
                self._event("response.in_progress", response=response)]

    def chunk(self, data: Any) -> list[dict[str, Any]]:
        """The events for one chat chunk (a `data:` event's JSON); a chunk that is no chat
        chunk is skipped."""
        if self.ended or not isinstance(data, dict):
            return []
        if isinstance(data.get("usage"), dict):
            self._usage = usage_of(data["usage"])
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return []
        choice = choices[0]
        events: list[dict[str, Any]] = []
        delta = choice.get("delta")
        if isinstance(delta, dict):
            content = delta.get("content")
            if isinstance(content, str) and content:
                events += self._text(content)
            calls = delta.get("tool_calls")
            if isinstance(calls, list):
                for call in calls:
                    if isinstance(call, dict):
                        events += self._call(call)
        if isinstance(choice.get("finish_reason"), str):
            self._finish = choice["finish_reason"]
        return events

    def _text(self, delta: str) -> list[dict[str, Any]]:
        events = []
        item = self._message
        if item is None:
            item = self._message = self._open("message", "msg")
            opened = {**message_item(item.item_id, "", "in_progress"), "content": []}
            events.append(self._event("response.output_item.added", output_index=item.index,
                                      item=opened))  # its part is added next, as OpenAI does
            events.append(self._event("response.content_part.added", item_id=item.item_id,
                                      output_index=item.index, content_index=0,
                                      part=_text_part("")))
        self._keep(item, delta)
        events.append(self._event("response.output_text.delta", item_id=item.item_id,
                                  output_index=item.index, content_index=0, delta=delta,
                                  logprobs=[]))
        return events

    def _call(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        events = []
        index = call.get("index", 0)
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        assert isinstance(function, dict)
        item = self._calls.get(index) if isinstance(index, int) else None
        if item is None:
            item = self._open("function_call", "fc")
            self._calls[index if isinstance(index, int) else len(self._calls)] = item
            item.call_id = str(call.get("id") or "")
            item.name = str(function.get("name") or "")
            events.append(self._event("response.output_item.added", output_index=item.index,
                                      item=call_item(item.item_id, item.call_id, item.name,
                                                     "", "in_progress", self._custom(item))))
        else:  # a later chunk may carry what the first did not
            item.call_id = item.call_id or str(call.get("id") or "")
            item.name += str(function.get("name") or "")
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            self._keep(item, arguments)
            if not self._custom(item):  # a custom call's input is JSON-wrapped: told at end
                events.append(self._event("response.function_call_arguments.delta",
                                          item_id=item.item_id, output_index=item.index,
                                          delta=arguments))
        return events

    def _keep(self, item: _Item, delta: str) -> None:
        """Keep a delta for the closing events, as far as the stream's room goes."""
        if len(delta) > self._room:
            delta, self.cut = delta[:self._room], True
        if delta:
            item.add(delta)
            self._room -= len(delta)

    def _custom(self, item: _Item) -> bool:
        return item.kind == "function_call" and item.name in self.echo.custom_tools

    def _open(self, kind: str, prefix: str) -> _Item:
        item = _Item(kind, f"{prefix}_{self.response_id[5:]}_{len(self._items)}",
                     len(self._items))
        self._items.append(item)
        return item

    def end(self) -> list[dict[str, Any]]:
        """The events that close every item and the response (the chat stream ended)."""
        if self.ended:
            return []
        self.ended = True
        status = status_of(self._finish)
        events = []
        for item in self._items:
            whole = item.whole(status, self.echo.custom_tools)
            if whole["type"] == "custom_tool_call":
                for kind in ("response.custom_tool_call_input.delta",
                             "response.custom_tool_call_input.done"):
                    events.append(self._event(kind, item_id=item.item_id,
                                              output_index=item.index,
                                              **{"delta" if kind.endswith("delta") else
                                                 "input": whole["input"]}))
            elif item.kind == "message":
                text = whole["content"][0]["text"]
                events.append(self._event("response.output_text.done", item_id=item.item_id,
                                          output_index=item.index, content_index=0, text=text,
                                          logprobs=[]))
                events.append(self._event("response.content_part.done", item_id=item.item_id,
                                          output_index=item.index, content_index=0,
                                          part=_text_part(text)))
            else:
                events.append(self._event("response.function_call_arguments.done",
                                          item_id=item.item_id, output_index=item.index,
                                          name=item.name, arguments=whole["arguments"]))
            events.append(self._event("response.output_item.done", output_index=item.index,
                                      item=whole))
        kind = "response.completed" if status == "completed" else "response.incomplete"
        events.append(self._event(kind, response=self._response(status, usage=self._usage)))
        return events

    def fail(self, message: str, code: str | None) -> list[dict[str, Any]]:
        """The events that end a stream whose route failed mid-way: `error`, then
        `response.failed` with what had streamed (its items incomplete)."""
        if self.ended:
            return []
        self.ended = True
        failed = self._response("failed", usage=self._usage,
                                error={"code": "server_error", "message": message})
        return [self._event("error", code=code, message=message, param=None),
                self._event("response.failed", response=failed)]


def encode_events(events: list[dict[str, Any]]) -> bytes:
    """Responses SSE events as bytes: `event: TYPE` and one `data:` line each."""
    return b"".join(b"event: " + e["type"].encode() + b"\ndata: "
                    + json.dumps(e, separators=(",", ":")).encode() + b"\n\n" for e in events)
