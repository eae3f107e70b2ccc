"""The OpenAI chat-completions shapes the emulator reads and writes; pure functions."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from meshroute_middleware.core.prefix import Prefix, message_chain

from .shard import EmulatorConfig, EmulatorError

# Deterministic filler: the emulator's "generated" text, one word per token.
FILLER = ("mesh", "route", "layer", "shard", "token", "node", "hop", "learns", "fast",
          "bandit", "gossip", "tracker", "measure", "span", "queue", "slot")


class ChatRequestError(EmulatorError):
    """The request is not a chat-completions request this node can serve."""

    status = 400
    kind = "invalid_request_error"


class ModelNotServedError(EmulatorError):
    """The request names a model this node does not serve."""

    status = 404
    kind = "invalid_request_error"


@dataclass(frozen=True, slots=True)
class ChatJob:
    """What a chat request asks for, validated."""

    model: str
    max_tokens: int
    stream: bool
    include_usage: bool
    prompt_tokens: int
    finish_reason: str
    prompt: Prefix | None = None  # the messages' hash chain: what a prefix cache matches
    tool: dict[str, Any] | None = None  # the tool call to answer with (`tool_call`)


def _prompt_tokens(messages: list[Any]) -> int:
    count = 0
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ChatRequestError("each message needs a string 'role'")
        content = message.get("content")
        if isinstance(content, str):
            count += len(content.split())
        elif isinstance(content, list):
            count += sum(len(str(p.get("text", "")).split()) for p in content
                         if isinstance(p, dict))
        count += 1  # the role marker
    return count


def _max_tokens(body: dict[str, Any], config: EmulatorConfig) -> int | None:
    raw = body.get("max_completion_tokens", body.get("max_tokens"))
    if raw is None:
        return None
    if type(raw) is not int or not 1 <= raw <= config.max_tokens_limit:
        raise ChatRequestError(f"max_tokens must be an integer in 1..{config.max_tokens_limit}")
    return raw


def served_body(body: Any, config: EmulatorConfig) -> dict[str, Any]:
    """A request body that is a JSON object naming this node's model (every endpoint's first
    check); else ChatRequestError or ModelNotServedError."""
    if not isinstance(body, dict):
        raise ChatRequestError("request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str):
        raise ChatRequestError("'model' must be a string")
    if model != config.model:
        raise ModelNotServedError(f"model {model[:64]!r} not served here (serving "
                                  f"{config.model!r})")
    return body


def parse_chat(body: Any, config: EmulatorConfig) -> ChatJob:
    """Validate a chat-completions body; raise ChatRequestError or ModelNotServedError."""
    served_body(body, config)
    model, messages = body["model"], body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ChatRequestError("'messages' must be a non-empty list")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ChatRequestError("'stream_options' must be an object")
    requested = _max_tokens(body, config)
    return ChatJob(model=model,
                   max_tokens=config.max_tokens_default if requested is None else requested,
                   stream=body.get("stream") is True,
                   include_usage=options.get("include_usage") is True,
                   prompt_tokens=_prompt_tokens(messages),
                   finish_reason="stop" if requested is None else "length",
                   prompt=message_chain(messages), tool=tool_call(body))


def words(n: int) -> Iterator[str]:
    """The n tokens of filler text; every token after the first starts with a space."""
    for index in range(n):
        word = FILLER[(index * 7) % len(FILLER)]
        yield word if index == 0 else " " + word


def usage(job: ChatJob) -> dict[str, int]:
    """The usage object of a finished request."""
    return {"prompt_tokens": job.prompt_tokens, "completion_tokens": job.max_tokens,
            "total_tokens": job.prompt_tokens + job.max_tokens}


def completion(job: ChatJob, ident: str, text: str, created: int) -> dict[str, Any]:
    """A non-streamed chat.completion object."""
    choice = {"index": 0, "message": {"role": "assistant", "content": text},
              "logprobs": None, "finish_reason": job.finish_reason}
    return {"id": ident, "object": "chat.completion", "created": created, "model": job.model,
            "choices": [choice], "usage": usage(job)}


def chunk(job: ChatJob, ident: str, created: int, delta: dict[str, Any],
          finish_reason: str | None) -> dict[str, Any]:
    """One chat.completion.chunk carrying a delta (usage null when usage was asked for)."""
    out: dict[str, Any] = {
        "id": ident, "object": "chat.completion.chunk", "created": created, "model": job.model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None,
                     "finish_reason": finish_reason}],
    }
    if job.include_usage:
        out["usage"] = None
    return out


def usage_chunk(job: ChatJob, ident: str, created: int) -> dict[str, Any]:
    """The last chunk when stream_options.include_usage: no choices, the usage."""
    return {"id": ident, "object": "chat.completion.chunk", "created": created,
            "model": job.model, "choices": [], "usage": usage(job)}


def tool_call(body: dict[str, Any]) -> dict[str, Any] | None:
    """The call an emulated node answers with when the request offers tools and its last
    message is no tool's result: the first function tool, each required argument "mesh"."""
    tools, messages = body.get("tools"), body.get("messages")
    if not isinstance(tools, list) or not tools or not isinstance(messages, list):
        return None
    last = messages[-1] if messages else None
    if isinstance(last, dict) and last.get("role") == "tool":
        return None
    function = tools[0].get("function") if isinstance(tools[0], dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ChatRequestError("tools[0] must be a function tool with a name")
    schema = function.get("parameters")
    required = schema.get("required", []) if isinstance(schema, dict) else []
    arguments = {str(name): "mesh" for name in required if isinstance(name, str)}
    return {"id": f"call_{len(messages)}", "type": "function",
            "function": {"name": function["name"], "arguments": json.dumps(arguments)}}


def tool_completion(job: ChatJob, ident: str, created: int) -> dict[str, Any]:
    """A non-streamed chat.completion whose answer is `job.tool`."""
    out = completion(job, ident, "", created)
    out["choices"][0].update(finish_reason="tool_calls", message={
        "role": "assistant", "content": None, "tool_calls": [job.tool]})
    return out


def tool_chunks(job: ChatJob, ident: str, created: int) -> Iterator[dict[str, Any]]:
    """The chunks that stream `job.tool`: its name first, its arguments in two halves."""
    assert job.tool is not None
    arguments = job.tool["function"]["arguments"]
    half = len(arguments) // 2
    yield chunk(job, ident, created, {"role": "assistant", "content": None, "tool_calls": [
        {"index": 0, "id": job.tool["id"], "type": "function",
         "function": {"name": job.tool["function"]["name"], "arguments": ""}}]}, None)
    for part in (arguments[:half], arguments[half:]):
        yield chunk(job, ident, created,
                    {"tool_calls": [{"index": 0, "function": {"arguments": part}}]}, None)
    yield chunk(job, ident, created, {}, "tool_calls")
