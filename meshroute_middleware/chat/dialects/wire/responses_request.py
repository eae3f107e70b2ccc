"""An OpenAI Responses request (`POST /v1/responses`) as the chat-completions request the chat
path serves: the stateless subset, validated field by field (docs/apis.md, "Responses").

Nothing is stored, so what needs a stored response (`previous_response_id`, `conversation`,
`background`, item references, file ids) is refused, and so are the built-in tools (web
search, file search, computer use, code interpreter, ...): a chat route runs function tools
only. A custom (freeform) tool, as Codex's `apply_patch`, becomes a function tool taking one
string, `input`, and its calls come back as custom tool calls. Pure: a parsed JSON object in,
a JSON-ready chat body out, or ResponsesRequestError.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from meshroute_middleware.core.errors import MeshRouteError

STATELESS = ("meshroute's /v1/responses is stateless (nothing is stored): send the whole "
             "conversation in 'input'")
FUNCTIONS_ONLY = ("meshroute's /v1/responses supports function tools only (and custom "
                  "tools, as functions)")
ITEM_TYPES = ("message", "function_call", "function_call_output", "custom_tool_call",
              "custom_tool_call_output")
# A custom tool's one parameter, as the function tool a chat route gets.
CUSTOM_PARAMETERS = {"type": "object", "properties": {"input": {
    "type": "string", "description": "the tool's whole input, as free text"}},
    "required": ["input"], "additionalProperties": False}
# Refused: each needs state meshroute does not keep. Any field neither translated nor refused
# is accepted and has no effect (what it asks has no chat equivalent, or concerns the stored
# or reasoning state meshroute does not have: `include`, `reasoning`, `metadata`, ...):
# clients add fields as OpenAI does (Codex's `client_metadata`), and one must not break them.
STATEFUL = ("previous_response_id", "conversation", "prompt")


class ResponsesRequestError(MeshRouteError, ValueError):
    """The request is not one meshroute's /v1/responses serves; `param` names the field and
    `code` is OpenAI's error code for why (invalid_type, unsupported_parameter, ...)."""

    def __init__(self, param: str, message: str, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param, self.code = param, code


@dataclass(frozen=True, slots=True)
class Echo:
    """What the answer repeats of its request (the Response object carries it)."""

    model: str
    stream: bool = False
    instructions: str | None = None
    tools: list[Any] = field(default_factory=list)
    tool_choice: Any = "auto"
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    parallel_tool_calls: bool = True
    text: dict[str, Any] = field(default_factory=lambda: {"format": {"type": "text"}})
    custom_tools: frozenset[str] = frozenset()  # names whose calls answer as custom calls


def to_chat(payload: dict[str, Any]) -> tuple[dict[str, Any], Echo]:
    """The chat-completions body for a Responses request, and what its answer repeats."""
    _refuse_stateful(payload)
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise ResponsesRequestError("model", "'model' is required and must be a non-empty "
                                    "string.", "missing_required_parameter")
    instructions = _optional(payload, "instructions", str, "a string")
    messages = [{"role": "system", "content": instructions}] if instructions else []
    messages += input_messages(payload.get("input"))
    if not messages:
        raise ResponsesRequestError("input", "'input' is required (a string or a list of "
                                    "items).", "missing_required_parameter")
    chat: dict[str, Any] = {"model": model, "messages": messages}
    tools = payload.get("tools")
    if tools is not None and (chat_tools := chat_tools_of(tools)):
        chat["tools"] = chat_tools
    tool_choice = payload.get("tool_choice")
    if tool_choice is not None:
        chat["tool_choice"] = chat_tool_choice(tool_choice)
    limit = payload.get("max_output_tokens")
    if limit is not None:
        if not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0:
            raise ResponsesRequestError("max_output_tokens", "'max_output_tokens' must be a "
                                        "positive integer.", "invalid_type")
        chat["max_tokens"] = limit
    _options(payload, chat)
    text = payload.get("text")
    if text is not None and (response_format := chat_response_format(text)) is not None:
        chat["response_format"] = response_format
    if "route" in payload:
        chat["route"] = payload["route"]  # checked by the chat path's own parser
    parallel = payload.get("parallel_tool_calls")
    return chat, Echo(model, bool(chat.get("stream")), instructions, list(tools or []),
                      "auto" if tool_choice is None else tool_choice,
                      payload.get("temperature"), payload.get("top_p"), limit,
                      True if parallel is None else parallel,
                      text if isinstance(text, dict) else {"format": {"type": "text"}},
                      frozenset(t["name"] for t in tools or () if t.get("type") == "custom"))


def _refuse_stateful(payload: dict[str, Any]) -> None:
    """ResponsesRequestError for a field that needs a stored response."""
    for name in STATEFUL:
        if payload.get(name) is not None:
            raise ResponsesRequestError(name, f"'{name}' is not supported: {STATELESS}.",
                                        "unsupported_parameter")
    if payload.get("background"):
        raise ResponsesRequestError("background", "'background' is not supported: "
                                    f"{STATELESS}.", "unsupported_parameter")


def _options(payload: dict[str, Any], chat: dict[str, Any]) -> None:
    """The sampling and streaming options, checked, into `chat`."""
    for name in ("temperature", "top_p"):
        value = payload.get(name)
        if value is not None:
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise ResponsesRequestError(name, f"'{name}' must be a number.",
                                            "invalid_type")
            chat[name] = value
    _optional(payload, "store", bool, "a boolean")  # either way nothing is stored
    if _optional(payload, "stream", bool, "a boolean"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}  # the answer reports usage
    parallel = _optional(payload, "parallel_tool_calls", bool, "a boolean")
    if parallel is not None and "tools" in chat:
        chat["parallel_tool_calls"] = parallel
    user = _optional(payload, "user", str, "a string")
    if user is not None:
        chat["user"] = user


def _optional(payload: dict[str, Any], name: str, kind: type, what: str) -> Any:
    value = payload.get(name)
    if value is not None and (not isinstance(value, kind)
                              or (kind is not bool and isinstance(value, bool))):
        raise ResponsesRequestError(name, f"'{name}' must be {what}.", "invalid_type")
    return value


def input_messages(value: Any) -> list[dict[str, Any]]:
    """The chat messages of `input`: a string (one user message) or a list of items."""
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise ResponsesRequestError("input", "'input' must be a string or a list of items.",
                                    "invalid_type")
    messages: list[dict[str, Any]] = []
    # Images a tool returned: a chat tool message takes text only, so they follow the turn's
    # tool messages as a user message (placed there so no tool message is cut off its call).
    images: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise ResponsesRequestError(where, f"'{where}' must be an object.", "invalid_type")
        kind = item.get("type", "message")
        if kind not in ("function_call_output", "custom_tool_call_output") and images:
            messages.append({"role": "user", "content": images})
            images = []
        if kind == "message":
            messages.append(_message(item, where))
        elif kind == "function_call":
            _add_call(messages, item, where)
        elif kind == "custom_tool_call":
            _add_call(messages, item, where, custom=True)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            messages.append(_call_output(item, where, images))
        elif kind == "reasoning":
            continue  # a model's own reasoning, handed back: no chat route takes it
        elif kind == "item_reference":
            raise ResponsesRequestError(where, f"'{where}': item references are not "
                                        f"supported: {STATELESS}.", "unsupported_parameter")
        else:
            raise ResponsesRequestError(f"{where}.type", f"'{where}': items of type "
                                        f"{str(kind)[:64]!r} are not supported: {FUNCTIONS_ONLY}"
                                        f" (input items: {', '.join(ITEM_TYPES)}).",
                                        "unsupported_parameter")
    if images:
        messages.append({"role": "user", "content": images})
    return messages


ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise ResponsesRequestError(f"{where}.role", f"'{where}.role' must be one of "
                                    "'user', 'assistant', 'system', 'developer'.")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": ROLES[role], "content": content}
    if not isinstance(content, list):
        raise ResponsesRequestError(f"{where}.content", f"'{where}.content' must be a string "
                                    "or a list of content parts.", "invalid_type")
    parts = [_part(part, f"{where}.content[{j}]") for j, part in enumerate(content)]
    texts = [p["text"] for p in parts if p["type"] == "text"]
    if role != "user":  # system and assistant messages take text only
        if len(texts) != len(parts):
            raise ResponsesRequestError(f"{where}.content", f"'{where}.content': a {role} "
                                        "message takes text parts only.")
        return {"role": ROLES[role], "content": "".join(texts)}
    if len(parts) == 1 and texts:
        return {"role": "user", "content": texts[0]}
    return {"role": "user", "content": parts}


TEXT_PARTS = ("input_text", "output_text", "text")


def _part(part: Any, where: str) -> dict[str, Any]:
    """One content part as a chat content part."""
    if not isinstance(part, dict):
        raise ResponsesRequestError(where, f"'{where}' must be an object.", "invalid_type")
    kind = part.get("type")
    if kind in TEXT_PARTS:
        text = part.get("text")
        if not isinstance(text, str):
            raise ResponsesRequestError(f"{where}.text", f"'{where}.text' must be a string.",
                                        "invalid_type")
        return {"type": "text", "text": text}
    if kind == "refusal" and isinstance(part.get("refusal"), str):
        return {"type": "text", "text": part["refusal"]}
    if kind == "input_image":
        if part.get("file_id") is not None:
            raise ResponsesRequestError(f"{where}.file_id", f"'{where}.file_id' is not "
                                        f"supported: {STATELESS} (send 'image_url').",
                                        "unsupported_parameter")
        url = part.get("image_url")
        if not isinstance(url, str) or not url:
            raise ResponsesRequestError(f"{where}.image_url", f"'{where}.image_url' must be "
                                        "a URL or a data URL.", "invalid_type")
        image: dict[str, Any] = {"url": url}
        if isinstance(part.get("detail"), str):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    raise ResponsesRequestError(f"{where}.type", f"'{where}': content parts of type "
                                f"{str(kind)[:64]!r} are not supported (input_text, "
                                "input_image).", "unsupported_parameter")


def _string(item: dict[str, Any], name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str) or not value:
        raise ResponsesRequestError(f"{where}.{name}", f"'{where}.{name}' is required and "
                                    "must be a non-empty string.", "missing_required_parameter")
    return value


def _add_call(messages: list[dict[str, Any]], item: dict[str, Any], where: str,
              custom: bool = False) -> None:
    """A function_call (or custom_tool_call) item: a tool call of the assistant message it
    follows, or of a new one (consecutive calls are one turn's parallel calls)."""
    name = "input" if custom else "arguments"
    arguments = item.get(name, "")
    if not isinstance(arguments, str):
        raise ResponsesRequestError(f"{where}.{name}", f"'{where}.{name}' must be a string"
                                    f"{'' if custom else ' (JSON text)'}.", "invalid_type")
    if custom:
        arguments = json.dumps({"input": arguments})
    call = {"id": _string(item, "call_id", where), "type": "function",
            "function": {"name": _string(item, "name", where), "arguments": arguments}}
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant" and isinstance(
            last.get("content"), str | None):
        last.setdefault("tool_calls", []).append(call)
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _call_output(item: dict[str, Any], where: str,
                 images: list[dict[str, Any]]) -> dict[str, Any]:
    """A tool message; the output's image parts are added to `images`."""
    output = item.get("output")
    if isinstance(output, list):  # content parts, as newer clients send
        parts = [_part(part, f"{where}.output[{j}]") for j, part in enumerate(output)]
        texts = [p["text"] for p in parts if p["type"] == "text"]
        shown = [p for p in parts if p["type"] != "text"]
        images.extend(shown)
        output = "".join(texts) or ("(the tool's output is the image that follows)"
                                    if shown else "")
    if not isinstance(output, str):
        raise ResponsesRequestError(f"{where}.output", f"'{where}.output' must be a string.",
                                    "invalid_type")
    return {"role": "tool", "tool_call_id": _string(item, "call_id", where),
            "content": output}


def chat_tools_of(tools: Any) -> list[dict[str, Any]]:
    """Function tools as chat tools; a built-in tool is refused."""
    if not isinstance(tools, list):
        raise ResponsesRequestError("tools", "'tools' must be a list.", "invalid_type")
    out: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise ResponsesRequestError(where, f"'{where}' must be an object.", "invalid_type")
        kind = tool.get("type")
        if kind == "custom":
            out.append({"type": "function", "function": _custom_function(tool, where)})
            continue
        if kind != "function":
            raise ResponsesRequestError(f"{where}.type", f"'{where}': the built-in tool "
                                        f"{str(kind)[:64]!r} is not supported: "
                                        f"{FUNCTIONS_ONLY}.", "unsupported_parameter")
        function: dict[str, Any] = {"name": _string(tool, "name", where)}
        for name in ("description", "parameters", "strict"):
            if tool.get(name) is not None:
                function[name] = tool[name]
        out.append({"type": "function", "function": function})
    names = [t["function"]["name"] for t in out]
    if len(set(names)) != len(names):
        raise ResponsesRequestError("tools", "'tools' names a tool twice.")
    return out


def _custom_function(tool: dict[str, Any], where: str) -> dict[str, Any]:
    """A custom tool as a function of one string; its grammar, if any, told in words."""
    description = tool.get("description")
    text = description if isinstance(description, str) else ""
    fmt = tool.get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "grammar":
        definition, syntax = fmt.get("definition"), fmt.get("syntax")
        if isinstance(definition, str) and definition:
            kind = f"{syntax} grammar" if isinstance(syntax, str) and syntax else "grammar"
            text += f"\n\nThe input must match this {kind}:\n{definition}"
    return {"name": _string(tool, "name", where), "description": text.strip(),
            "parameters": CUSTOM_PARAMETERS}


def chat_tool_choice(choice: Any) -> Any:
    """`tool_choice` as chat's: a mode, or one function by name."""
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") in ("function", "custom"):
        return {"type": "function",
                "function": {"name": _string(choice, "name", "tool_choice")}}
    raise ResponsesRequestError("tool_choice", "'tool_choice' must be 'auto', 'none', "
                                "'required' or {'type': 'function', 'name': ...}: "
                                f"{FUNCTIONS_ONLY}.", "unsupported_parameter")


def chat_response_format(text: Any) -> dict[str, Any] | None:
    """`text.format` as chat's `response_format` (None: plain text)."""
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None:
        if not isinstance(text, dict):
            raise ResponsesRequestError("text", "'text' must be an object.", "invalid_type")
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = {"name": _string(fmt, "name", "text.format")}
        for name in ("schema", "strict", "description"):
            if fmt.get(name) is not None:
                schema[name] = fmt[name]
        return {"type": "json_schema", "json_schema": schema}
    raise ResponsesRequestError("text.format.type", "'text.format.type' must be 'text', "
                                "'json_object' or 'json_schema'.")
