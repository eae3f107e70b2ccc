"""The GenAI semantic conventions' side of a trace (issue 35; telemetry/tracing.py), pure:
the OTLP endpoint's URL and headers, a path's `gen_ai.operation.name`, `gen_ai.usage.*` of
each API's usage object, an error answer's `error.type`, and (for `--otlp-content` only) a
request's and an answer's text."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import orjson

TRACES_PATH = "/v1/traces"  # OTLP/HTTP's signal path under a base endpoint
MAX_CONTENT = 64 * 1024  # characters of --otlp-content per attribute


def number(value: Any) -> int | None:
    """An integer (never a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL of `endpoint`, a base URL (as OTEL_EXPORTER_OTLP_ENDPOINT
    is) or the full `/v1/traces` URL."""
    base = endpoint.rstrip("/")
    return base if base.endswith(TRACES_PATH) else base + TRACES_PATH


def parse_headers(text: str | None) -> dict[str, str]:
    """OTEL_EXPORTER_OTLP_HEADERS' form: `name=value,name=value`, values URL-encoded."""
    from urllib.parse import unquote
    out: dict[str, str] = {}
    for part in (text or "").split(","):
        name, eq, value = part.partition("=")
        if eq and name.strip():
            out[unquote(name.strip()).lower()] = unquote(value.strip())
    return out


def operation(path: str) -> str:
    """gen_ai.operation.name of a routed path."""
    if path.endswith("/embeddings"):
        return "embeddings"
    if path == "/v1/completions":
        return "text_completion"
    return "chat"



def json_object(body: bytes) -> dict[str, Any]:
    try:
        value = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def usage_attributes(usage: Mapping[str, Any]) -> dict[str, int]:
    """gen_ai.usage.* of an OpenAI, Anthropic or Responses usage object."""
    out: dict[str, int] = {}
    inp = number(usage.get("prompt_tokens"))
    if inp is None:
        inp = number(usage.get("input_tokens"))
    outp = number(usage.get("completion_tokens"))
    if outp is None:
        outp = number(usage.get("output_tokens"))
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
    cached = number(details.get("cached_tokens")) if isinstance(details, dict) else None
    if cached is None:
        cached = number(usage.get("cache_read_input_tokens"))
    written = number(usage.get("cache_creation_input_tokens"))
    for name, value in (("gen_ai.usage.input_tokens", inp),
                        ("gen_ai.usage.output_tokens", outp),
                        ("gen_ai.usage.cache_read.input_tokens", cached),
                        ("gen_ai.usage.cache_creation.input_tokens", written)):
        if value is not None:
            out[name] = value
    return out


def error_type(body: bytes, status: int) -> str:
    """An error answer's code (OpenAI's or Anthropic's shape), else its status."""
    error = json_object(body).get("error")
    if isinstance(error, dict):
        code = error.get("code") or error.get("type")
        if isinstance(code, str) and code:
            return code
    return str(status)


def content(request: Mapping[str, Any]) -> str:
    """The request's messages (or input, or prompt) as JSON, bounded."""
    for name in ("messages", "input", "prompt"):
        if name in request:
            return orjson.dumps(request[name]).decode()[:MAX_CONTENT]
    return ""


def answer_text(answer: Mapping[str, Any]) -> Iterator[str]:
    for choice in answer.get("choices") or ():
        if isinstance(choice, dict):
            message = choice.get("message")
            if isinstance(message, dict) and isinstance(message.get("content"), str):
                yield message["content"]
            elif isinstance(choice.get("text"), str):
                yield choice["text"]
    for block in answer.get("content") or ():
        if isinstance(block, dict) and isinstance(block.get("text"), str):
            yield block["text"]


def stream_text(event: Mapping[str, Any]) -> Iterator[str]:
    for choice in event.get("choices") or ():
        if isinstance(choice, dict):
            delta = choice.get("delta")
            if isinstance(delta, dict) and isinstance(delta.get("content"), str):
                yield delta["content"]
            elif isinstance(choice.get("text"), str):
                yield choice["text"]
    delta = event.get("delta")
    if isinstance(delta, dict) and isinstance(delta.get("text"), str):
        yield delta["text"]
