"""Anthropic's Messages API <-> OpenAI chat completions, as pure functions (issue 25).

`chat_request` turns a Messages request (parsed JSON) into a chat-completions body and what the
answer must echo (`Asked`); `message` turns a chat completion into a Messages `message`;
`error_object` is an error in Anthropic's shape. Streams: `anthropic_stream.MessageStream`.
Shapes: https://docs.anthropic.com/en/api/messages and /en/api/messages-streaming.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from meshroute_middleware.core.errors import MeshRouteError

ANTHROPIC_VERSION = "2023-06-01"  # sent upstream when the client named none
IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")  # what the API accepts
TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}  # "tool": one function
# OpenAI finish_reason -> Anthropic stop_reason; anything else (or none) ends the turn
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                "function_call": "tool_use", "content_filter": "refusal"}
# HTTP status -> Anthropic error type (https://docs.anthropic.com/en/api/errors)
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large",
               429: "rate_limit_error", 500: "api_error", 502: "api_error", 504: "api_error",
               503: "overloaded_error", 529: "overloaded_error"}
_SKIPPED_BLOCKS = ("thinking", "redacted_thinking")  # earlier turns' reasoning: not resent


class MessagesError(MeshRouteError, ValueError):
    """A Messages request that is not valid; the message names the field."""


@dataclass(frozen=True, slots=True)
class Asked:
    """What the answer echoes of the request: the model asked for, its stop sequences."""

    model: str
    stop_sequences: tuple[str, ...] = ()
    stream: bool = False


def error_type(status: int) -> str:
    """Anthropic's error `type` for an HTTP status."""
    if status in ERROR_TYPES:
        return ERROR_TYPES[status]
    return "invalid_request_error" if 400 <= status < 500 else "api_error"


def error_object(status: int, message: str) -> dict[str, Any]:
    """`{"type": "error", "error": {"type", "message"}}` for an answer with `status`."""
    return {"type": "error", "error": {"type": error_type(status), "message": message}}


def sse_error(status: int, message: str) -> bytes:
    """The error as the `error` event that ends a Messages stream."""
    return sse("error", error_object(status, message))


def stream_failed(message: str) -> bytes:
    """The `error` event that ends a Messages stream whose route failed mid-answer."""
    return sse("error", {"type": "error", "error": {"type": "api_error", "message": message}})


def sse(event: str, data: Mapping[str, Any]) -> bytes:
    """One server-sent event of a Messages stream."""
    return b"event: " + event.encode() + b"\ndata: " + json.dumps(data).encode() + b"\n\n"


# -- the request ---------------------------------------------------------------------------

def chat_request(body: object, *, count_only: bool = False) -> tuple[dict[str, Any], Asked]:
    """The chat-completions body for a Messages request, and what its answer echoes; raises
    MessagesError. `count_only` (count_tokens): `max_tokens` is not required."""
    if not isinstance(body, Mapping):
        raise MessagesError("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise MessagesError("model: a non-empty string is required")
    messages = _system(body.get("system")) + _messages(body.get("messages"))
    chat: dict[str, Any] = {"model": model, "messages": messages}
    limit = body.get("max_tokens")
    if limit is not None or not count_only:
        if not _integer(limit) or limit < 1:
            raise MessagesError("max_tokens: a positive integer is required")
        chat["max_tokens"] = limit
    for name in ("temperature", "top_p"):
        if name in body and body[name] is not None:
            if not _number(body[name]):
                raise MessagesError(f"{name}: must be a number")
            chat[name] = body[name]
    if "top_k" in body and body["top_k"] is not None and not _integer(body["top_k"]):
        raise MessagesError("top_k: must be an integer")  # valid, but chat has no top_k
    stops = _stop_sequences(body.get("stop_sequences"))
    if stops:
        chat["stop"] = list(stops)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise MessagesError("stream: must be a boolean")
    if stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    chat.update(_tools(body.get("tools"), body.get("tool_choice")))
    user = _user_id(body.get("metadata"))
    if user is not None:
        chat["user"] = user
    if "route" in body:  # meshroute's own pin, checked by the chat path
        chat["route"] = body["route"]
    return chat, Asked(model, stops, stream)


def _system(system: object) -> list[dict[str, Any]]:
    if system is None:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}] if system else []
    if not isinstance(system, list):
        raise MessagesError("system: must be a string or a list of text blocks")
    texts = []
    for i, block in enumerate(system):
        if not isinstance(block, Mapping) or block.get("type") != "text":
            raise MessagesError(f"system.{i}: must be a text block")
        texts.append(_text(block, f"system.{i}"))
    return [{"role": "system", "content": "\n\n".join(texts)}] if texts else []


def _messages(raw: object) -> list[dict[str, Any]]:
    if not isinstance(raw, list) or not raw:
        raise MessagesError("messages: a non-empty list is required")
    out: list[dict[str, Any]] = []
    for i, message in enumerate(raw):
        where = f"messages.{i}"
        if not isinstance(message, Mapping):
            raise MessagesError(f"{where}: must be an object")
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise MessagesError(f"{where}.role: must be 'user' or 'assistant'")
        content = message.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
        elif isinstance(content, list):
            out += (_user(content, where) if role == "user" else [_assistant(content, where)])
        else:
            raise MessagesError(f"{where}.content: must be a string or a list of blocks")
    return out


def _user(blocks: list[Any], where: str) -> list[dict[str, Any]]:
    """A user turn: its tool results as `tool` messages first (they answer the previous
    turn's calls), then one user message with the rest."""
    results: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        here = f"{where}.content.{j}"
        kind = _kind(block, here)
        if kind == "tool_result":
            result, images = _tool_result(block, here)
            results.append(result)
            parts += images
        elif kind in ("text", "image"):
            parts.append(_part(block, kind, here))
        else:
            raise MessagesError(f"{here}: a user message cannot hold a {kind!r} block")
    if parts or not results:
        results.append({"role": "user", "content": _content(parts)})
    return results


def _assistant(blocks: list[Any], where: str) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        here = f"{where}.content.{j}"
        kind = _kind(block, here)
        if kind == "text":
            texts.append(_text(block, here))
        elif kind == "tool_use":
            calls.append(_tool_call(block, here))
        elif kind not in _SKIPPED_BLOCKS:
            raise MessagesError(f"{here}: an assistant message cannot hold a {kind!r} block")
    out: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else
                           (None if calls else "")}
    if calls:
        out["tool_calls"] = calls
    return out


def _kind(block: object, where: str) -> str:
    if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
        raise MessagesError(f"{where}: a content block needs a string 'type'")
    return str(block["type"])


def _text(block: Mapping[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise MessagesError(f"{where}.text: must be a string")
    return text


def _part(block: Mapping[str, Any], kind: str, where: str) -> dict[str, Any]:
    """A text or image block as an OpenAI content part."""
    if kind == "text":
        return {"type": "text", "text": _text(block, where)}
    return {"type": "image_url", "image_url": {"url": _image_url(block.get("source"), where)}}


def _image_url(source: object, where: str) -> str:
    if not isinstance(source, Mapping):
        raise MessagesError(f"{where}.source: an image needs a source object")
    kind = source.get("type")
    if kind == "base64":
        media, data = source.get("media_type"), source.get("data")
        if media not in IMAGE_TYPES:
            raise MessagesError(f"{where}.source.media_type: must be one of "
                                f"{', '.join(IMAGE_TYPES)}")
        if not isinstance(data, str) or not data:
            raise MessagesError(f"{where}.source.data: base64 image data is required")
        return f"data:{media};base64,{data}"
    if kind == "url":
        url = source.get("url")
        if not isinstance(url, str) or not url.startswith(("https://", "http://")):
            raise MessagesError(f"{where}.source.url: an http(s) URL is required")
        return url
    raise MessagesError(f"{where}.source.type: must be 'base64' or 'url'")


def _content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """Text-only content as one string (every chat server takes it), else the parts."""
    if all(p["type"] == "text" for p in parts):
        return "\n\n".join(p["text"] for p in parts)
    return parts


def _tool_call(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    ident, name, arguments = block.get("id"), block.get("name"), block.get("input", {})
    if not isinstance(ident, str) or not ident:
        raise MessagesError(f"{where}.id: a tool_use block needs a string id")
    if not isinstance(name, str) or not name:
        raise MessagesError(f"{where}.name: a tool_use block needs a string name")
    if not isinstance(arguments, Mapping):
        raise MessagesError(f"{where}.input: must be an object")
    return {"id": ident, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}


def _tool_result(block: Mapping[str, Any],
                 where: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The `tool` message of a tool_result, and its images (a tool message holds text only:
    they go on in the user message that follows)."""
    ident = block.get("tool_use_id")
    if not isinstance(ident, str) or not ident:
        raise MessagesError(f"{where}.tool_use_id: a string is required")
    content = block.get("content", "")
    texts: list[str] = []
    images: list[dict[str, Any]] = []
    if isinstance(content, str):
        texts.append(content)
    elif isinstance(content, list):
        for k, inner in enumerate(content):
            here = f"{where}.content.{k}"
            kind = _kind(inner, here)
            if kind not in ("text", "image"):
                raise MessagesError(f"{here}: a tool_result holds text and image blocks only")
            (texts.append(_text(inner, here)) if kind == "text"
             else images.append(_part(inner, kind, here)))
    else:
        raise MessagesError(f"{where}.content: must be a string or a list of blocks")
    return {"role": "tool", "tool_call_id": ident, "content": "\n\n".join(texts)}, images


def _tools(tools: object, choice: object) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if tools is not None:
        if not isinstance(tools, list):
            raise MessagesError("tools: must be a list")
        if tools:
            out["tools"] = [_tool(t, f"tools.{i}") for i, t in enumerate(tools)]
    if choice is None:
        return out
    if not isinstance(choice, Mapping) or choice.get("type") not in (*TOOL_CHOICES, "tool"):
        raise MessagesError("tool_choice.type: must be 'auto', 'any', 'tool' or 'none'")
    if choice["type"] == "tool":
        name = choice.get("name")
        if not isinstance(name, str) or not name:
            raise MessagesError("tool_choice.name: a tool name is required for type 'tool'")
        out["tool_choice"] = {"type": "function", "function": {"name": name}}
    else:
        out["tool_choice"] = TOOL_CHOICES[choice["type"]]
    if choice.get("disable_parallel_tool_use") is True and "tools" in out:
        out["parallel_tool_calls"] = False
    return out


def _tool(tool: object, where: str) -> dict[str, Any]:
    if not isinstance(tool, Mapping):
        raise MessagesError(f"{where}: must be an object")
    kind = tool.get("type", "custom")
    if kind not in (None, "custom"):
        raise MessagesError(f"{where}.type: {kind!r} is a server tool, which meshroute's routes "
                            "do not run; only custom tools (name, input_schema) are supported")
    name, schema = tool.get("name"), tool.get("input_schema")
    if not isinstance(name, str) or not name:
        raise MessagesError(f"{where}.name: a string is required")
    if not isinstance(schema, Mapping):
        raise MessagesError(f"{where}.input_schema: a JSON schema object is required")
    function: dict[str, Any] = {"name": name, "parameters": dict(schema)}
    description = tool.get("description")
    if isinstance(description, str) and description:
        function["description"] = description
    return {"type": "function", "function": function}


def _stop_sequences(stops: object) -> tuple[str, ...]:
    if stops is None:
        return ()
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise MessagesError("stop_sequences: must be a list of non-empty strings")
    return tuple(stops)


def _user_id(metadata: object) -> str | None:
    if metadata is None:
        return None
    if not isinstance(metadata, Mapping):
        raise MessagesError("metadata: must be an object")
    user = metadata.get("user_id")
    if user is not None and not isinstance(user, str):
        raise MessagesError("metadata.user_id: must be a string")
    return user or None


def _integer(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# -- the answer ----------------------------------------------------------------------------

def message(chat: Mapping[str, Any], asked: Asked, message_id: str,
            input_tokens: int = 0) -> dict[str, Any]:
    """A chat completion as a Messages `message`; `input_tokens` stands in when the upstream
    sent no usage."""
    choice = _first_choice(chat)
    said = choice.get("message")
    said = said if isinstance(said, Mapping) else {}
    content: list[dict[str, Any]] = []
    text = said.get("content")
    if isinstance(text, list):  # some servers answer in parts
        text = "".join(p["text"] for p in text
                       if isinstance(p, Mapping) and isinstance(p.get("text"), str))
    if isinstance(text, str) and text:
        content.append({"type": "text", "text": text})
    calls = said.get("tool_calls")
    for i, call in enumerate(calls if isinstance(calls, list) else []):
        content.append(tool_use_block(call, f"{message_id}_{i}", parse=True))
    reason, sequence = stop_reason(choice, asked)
    if any(b["type"] == "tool_use" for b in content):
        reason, sequence = "tool_use", None
    return {"id": message_id, "type": "message", "role": "assistant", "model": asked.model,
            "content": content, "stop_reason": reason, "stop_sequence": sequence,
            "usage": usage(chat.get("usage"), input_tokens, 0)}


def _first_choice(chat: Mapping[str, Any]) -> Mapping[str, Any]:
    choices = chat.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    return first if isinstance(first, Mapping) else {}


def tool_use_block(call: object, fallback_id: str, *, parse: bool) -> dict[str, Any]:
    """An OpenAI tool call as a `tool_use` block; `parse`: its arguments as `input` (an
    object; arguments that are no JSON object give `{}`), else an empty input to stream into."""
    call = call if isinstance(call, Mapping) else {}
    function = call.get("function")
    function = function if isinstance(function, Mapping) else {}
    ident = call.get("id")
    name = function.get("name")
    arguments: Any = {}
    if parse:
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except (TypeError, ValueError):
            arguments = {}
    return {"type": "tool_use", "id": ident if isinstance(ident, str) and ident
            else f"toolu_{fallback_id}", "name": name if isinstance(name, str) else "",
            "input": arguments if isinstance(arguments, dict) else {}}


def stop_reason(choice: Mapping[str, Any], asked: Asked) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of a choice. A matched stop sequence is known only where
    the server names it (vLLM's `stop_reason`)."""
    finish = choice.get("finish_reason")
    matched = choice.get("stop_reason")
    if finish == "stop" and isinstance(matched, str) and matched in asked.stop_sequences:
        return "stop_sequence", matched
    return STOP_REASONS.get(finish, "end_turn") if isinstance(finish, str) else "end_turn", None


def usage(raw: object, input_tokens: int, output_tokens: int) -> dict[str, int]:
    """Messages `usage` from an OpenAI one, the fallbacks where it says nothing. The prompt's
    cached part (`prompt_tokens_details.cached_tokens`, and the cache writes a gateway may
    report as `cache_creation_input_tokens`) is Messages' `cache_read_input_tokens` /
    `cache_creation_input_tokens`, outside `input_tokens` as on Anthropic's API (issue 35)."""
    raw = raw if isinstance(raw, Mapping) else {}
    prompt, completion = raw.get("prompt_tokens"), raw.get("completion_tokens")
    out = {"input_tokens": prompt if _integer(prompt) else input_tokens,
           "output_tokens": completion if _integer(completion) else output_tokens}
    details = raw.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    written = raw.get("cache_creation_input_tokens")
    if _integer(cached) or _integer(written):
        read = max(0, int(cached)) if _integer(cached) else 0
        wrote = max(0, int(written)) if _integer(written) else 0
        out["input_tokens"] = max(0, int(out["input_tokens"]) - read - wrote)
        out["cache_creation_input_tokens"] = wrote
        out["cache_read_input_tokens"] = read
    return out
