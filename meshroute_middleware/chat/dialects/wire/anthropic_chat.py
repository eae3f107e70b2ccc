"""Chat completions -> Anthropic's Messages API and back, for a route that speaks only
Messages (a provider model with `api = "anthropic"`) serving a chat-completions request.

The mirror of `anthropic.py`: `messages_request` (the request), `chat_completion` (a
`message` as a chat completion), `ChatStream` (a Messages SSE stream as chat chunks, chunk by
chunk) and `chat_error` (an Anthropic error body as an OpenAI one). Pure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from meshroute_middleware.chat.dialects.wire.anthropic_stream import SseLines
from meshroute_middleware.core.contracts.error_body import error_object, error_type, sse_error_event

DEFAULT_MAX_TOKENS = 4096  # Messages requires max_tokens; chat requests may leave it out
FINISH_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
                  "tool_use": "tool_calls", "refusal": "content_filter",
                  "pause_turn": "stop"}
_CHOICES = {"auto": {"type": "auto"}, "required": {"type": "any"}, "none": {"type": "none"}}


def messages_request(chat: Mapping[str, Any], model: str) -> dict[str, Any]:
    """The Messages body for a (validated) chat-completions body, for upstream `model`."""
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    messages = chat.get("messages")
    for message in messages if isinstance(messages, list) else []:
        if not isinstance(message, Mapping):
            continue
        role = message.get("role")
        if role in ("system", "developer"):
            system.append(_text_of(message.get("content")))
        elif role == "tool":
            _append(turns, "user", [{"type": "tool_result",
                                     "tool_use_id": str(message.get("tool_call_id") or ""),
                                     "content": _text_of(message.get("content"))}])
        elif role == "assistant":
            _append(turns, "assistant", _assistant_blocks(message))
        else:
            _append(turns, "user", _user_blocks(message.get("content")))
    out: dict[str, Any] = {"model": model, "messages": turns,
                           "max_tokens": _max_tokens(chat)}
    if system:
        out["system"] = "\n\n".join(system)
    for name in ("temperature", "top_p"):
        if isinstance(chat.get(name), int | float) and not isinstance(chat.get(name), bool):
            out[name] = chat[name]
    stop = chat.get("stop")
    if isinstance(stop, str) and stop:
        out["stop_sequences"] = [stop]
    elif isinstance(stop, list) and stop:
        out["stop_sequences"] = [s for s in stop if isinstance(s, str) and s]
    if chat.get("stream") is True:
        out["stream"] = True
    out.update(_tools(chat))
    if isinstance(chat.get("user"), str) and chat["user"]:
        out["metadata"] = {"user_id": chat["user"]}
    return out


def _append(turns: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    """Add blocks as a turn; consecutive turns of one role become one (tool results and the
    user's next words make one user turn, as Messages wants)."""
    if turns and turns[-1]["role"] == role:
        turns[-1]["content"] += blocks
    else:
        turns.append({"role": role, "content": blocks})


def _text_of(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content
                       if isinstance(p, Mapping) and isinstance(p.get("text"), str))
    return ""


def _user_blocks(content: object) -> list[dict[str, Any]]:
    if not isinstance(content, list):
        return [{"type": "text", "text": _text_of(content)}]
    blocks: list[dict[str, Any]] = []
    for part in content:
        if not isinstance(part, Mapping):
            continue
        if part.get("type") == "text" and isinstance(part.get("text"), str):
            blocks.append({"type": "text", "text": part["text"]})
        elif part.get("type") == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, Mapping) else image
            if isinstance(url, str):
                blocks.append({"type": "image", "source": _image_source(url)})
    return blocks or [{"type": "text", "text": ""}]


def _image_source(url: str) -> dict[str, Any]:
    head, sep, data = url.partition(",")
    if url.startswith("data:") and sep and head.endswith(";base64"):
        return {"type": "base64", "media_type": head[5:-7], "data": data}
    return {"type": "url", "url": url}


def _assistant_blocks(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    text = _text_of(message.get("content"))
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping):
            continue
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except (TypeError, ValueError):
            arguments = {}
        blocks.append({"type": "tool_use", "id": str(call.get("id") or ""),
                       "name": str(function.get("name") or ""),
                       "input": arguments if isinstance(arguments, dict) else {}})
    return blocks or [{"type": "text", "text": ""}]


def _max_tokens(chat: Mapping[str, Any]) -> int:
    limit = chat.get("max_completion_tokens", chat.get("max_tokens"))
    ok = isinstance(limit, int) and not isinstance(limit, bool) and limit > 0
    return limit if ok else DEFAULT_MAX_TOKENS


def _tools(chat: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    tools = chat.get("tools")
    listed = []
    for tool in tools if isinstance(tools, list) else []:
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(function, Mapping) and isinstance(function.get("name"), str):
            entry = {"name": function["name"],
                     "input_schema": function.get("parameters") or {"type": "object"}}
            if isinstance(function.get("description"), str):
                entry["description"] = function["description"]
            listed.append(entry)
    if listed:
        out["tools"] = listed
    choice = chat.get("tool_choice")
    if isinstance(choice, str) and choice in _CHOICES:
        out["tool_choice"] = dict(_CHOICES[choice])
    elif isinstance(choice, Mapping) and isinstance(choice.get("function"), Mapping):
        out["tool_choice"] = {"type": "tool", "name": choice["function"].get("name")}
    if chat.get("parallel_tool_calls") is False and "tool_choice" in out:
        out["tool_choice"]["disable_parallel_tool_use"] = True
    return out


def chat_completion(message: Mapping[str, Any], model: str) -> dict[str, Any]:
    """A Messages `message` as a chat completion of `model`."""
    text, calls = "", []
    content = message.get("content")
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, Mapping):
            continue
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            text += block["text"]
        elif block.get("type") == "tool_use":
            calls.append({"id": block.get("id"), "type": "function", "function": {
                "name": block.get("name"), "arguments": json.dumps(block.get("input") or {})}})
    said: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
    if calls:
        said["tool_calls"] = calls
    reason = message.get("stop_reason")
    return {"id": f"chatcmpl-{message.get('id', '')}", "object": "chat.completion",
            "created": 0, "model": model,
            "choices": [{"index": 0, "message": said,
                         "finish_reason": FINISH_REASONS.get(str(reason), "stop")}],
            "usage": chat_usage(message.get("usage"))}


def chat_usage(usage: object) -> dict[str, Any]:
    """Messages usage as chat completions'. The prompt is Messages' input tokens, cache reads
    and cache writes (issue 35); the reads are `prompt_tokens_details.cached_tokens`, the
    writes (which OpenAI's shape has no field for) `cache_creation_input_tokens`."""
    usage = usage if isinstance(usage, Mapping) else {}
    given, made = usage.get("input_tokens"), usage.get("output_tokens")
    read, wrote = usage.get("cache_read_input_tokens"), usage.get("cache_creation_input_tokens")
    read = read if isinstance(read, int) and read > 0 else 0
    wrote = wrote if isinstance(wrote, int) and wrote > 0 else 0
    prompt = (given if isinstance(given, int) else 0) + read + wrote
    completion = made if isinstance(made, int) else 0
    out: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                           "total_tokens": prompt + completion}
    if "cache_read_input_tokens" in usage or "cache_creation_input_tokens" in usage:
        out["prompt_tokens_details"] = {"cached_tokens": read}
        if wrote:
            out["cache_creation_input_tokens"] = wrote
    return out


def chat_error(status: int, body: bytes) -> bytes:
    """An error answer of a Messages route as an OpenAI-style error body."""
    try:
        decoded = json.loads(body)
        message = decoded["error"]["message"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        message = None
    text = message if isinstance(message, str) else f"the route answered HTTP {status}"
    return json.dumps(error_object(text, "upstream_error", error_type(status))).encode()


def _index(event: Mapping[str, Any]) -> int:
    index = event.get("index")
    return index if isinstance(index, int) else 0


class ChatStream:
    """Feed it a Messages SSE stream's chunks; it returns the chat-completions chunks."""

    def __init__(self, model: str, include_usage: bool) -> None:
        self.model, self.include_usage = model, include_usage
        self._lines = SseLines()
        self._id = "chatcmpl-"
        self._tools: dict[int, int] = {}  # Messages block index -> tool call index
        self._usage: dict[str, Any] = {}
        self._done = False

    def feed(self, chunk: bytes) -> bytes:
        return b"".join(self._line(line) for line in self._lines.feed(chunk))

    def close(self) -> bytes:
        out = self._line(self._lines.rest())
        return out if self._done else out + sse_error_event(
            "the route's stream ended before its answer was complete")

    def _line(self, line: bytes) -> bytes:
        if self._done or not line.startswith(b"data:"):
            return b""
        try:
            event = json.loads(line[5:].strip())
        except (ValueError, UnicodeDecodeError, RecursionError):
            return b""
        return self._event(event) if isinstance(event, Mapping) else b""

    def _event(self, event: Mapping[str, Any]) -> bytes:
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message")
            message = message if isinstance(message, Mapping) else {}
            self._id = f"chatcmpl-{message.get('id', '')}"
            self._count(message.get("usage"))
            return self._chunk({"role": "assistant", "content": ""})
        if kind == "content_block_start":
            return self._block(event)
        if kind == "content_block_delta":
            return self._delta(event)
        if kind == "message_delta":
            self._count(event.get("usage"))
            delta = event.get("delta")
            reason = delta.get("stop_reason") if isinstance(delta, Mapping) else None
            return self._chunk({}, FINISH_REASONS.get(str(reason), "stop"))
        if kind == "message_stop":
            self._done = True
            tail = (self._sse({"id": self._id, "object": "chat.completion.chunk", "created": 0,
                               "model": self.model, "choices": [],
                               "usage": chat_usage(self._usage)})
                    if self.include_usage else b"")
            return tail + b"data: [DONE]\n\n"
        if kind == "error":
            self._done = True
            error = event.get("error")
            message = error.get("message") if isinstance(error, Mapping) else None
            return sse_error_event(message if isinstance(message, str) else
                                   "the route failed mid-stream")
        return b""  # ping and what comes later

    def _count(self, usage: object) -> None:
        """Keep a usage's counts (a stream's later ones are its totals)."""
        if isinstance(usage, Mapping):
            self._usage.update(usage)

    def _block(self, event: Mapping[str, Any]) -> bytes:
        block = event.get("content_block")
        if not isinstance(block, Mapping) or block.get("type") != "tool_use":
            return b""
        at = self._tools.setdefault(_index(event), len(self._tools))
        return self._chunk({"tool_calls": [{"index": at, "id": block.get("id"),
                                            "type": "function", "function": {
                                                "name": block.get("name"), "arguments": ""}}]})

    def _delta(self, event: Mapping[str, Any]) -> bytes:
        delta = event.get("delta")
        if not isinstance(delta, Mapping):
            return b""
        if delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
            return self._chunk({"content": delta["text"]})
        at = self._tools.get(_index(event))
        if delta.get("type") == "input_json_delta" and at is not None:
            return self._chunk({"tool_calls": [{"index": at, "function": {
                "arguments": str(delta.get("partial_json") or "")}}]})
        return b""

    def _chunk(self, delta: Mapping[str, Any], finish: str | None = None) -> bytes:
        return self._sse({"id": self._id, "object": "chat.completion.chunk", "created": 0,
                          "model": self.model,
                          "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    @staticmethod
    def _sse(data: Mapping[str, Any]) -> bytes:
        return b"data: " + json.dumps(data).encode() + b"\n\n"
