"""A request's token estimate, before any tokenizer: what to reserve and what must fit.

Upstreams settle the truth in `usage`; until then the gates hold an estimate. Prompt tokens are
estimated as characters / 4 (the usual rule of thumb for English BPE vocabularies) plus 4 per
message for the chat template, rounded up. The characters counted are every message's text
(content parts' `text`, not images), its tool calls (names and arguments), its reasoning
(`reasoning_content` / `reasoning`), and the request's tool schemas (`tools`, `functions`):
every string in them, keys included, since the upstream renders them all into the prompt
(issue 32: a prompt hidden in a tool schema was estimated at 0). The completion is the
request's `max_tokens` (or `max_completion_tokens`), else DEFAULT_COMPLETION_TOKENS for the
reservation only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

CHARS_PER_TOKEN = 4.0
TOKENS_PER_MESSAGE = 4  # role markers and separators of a chat template
DEFAULT_COMPLETION_TOKENS = 256  # reserved against tpm/tpd when the request sets no maximum


@dataclass(frozen=True, slots=True)
class TokenEstimate:
    """Estimated prompt tokens and the completion maximum the request asked for (if any)."""

    prompt: int
    max_completion: int | None = None

    @property
    def reserve(self) -> int:
        """Tokens to hold against tpm/tpd/budget while the request is in flight."""
        completion = self.max_completion
        return self.prompt + (DEFAULT_COMPLETION_TOKENS if completion is None else completion)

    @property
    def context_need(self) -> int:
        """Tokens the route's context must hold: the prompt plus an explicit maximum."""
        return self.prompt + (self.max_completion or 0)


_MESSAGE_EXTRAS = ("tool_calls", "function_call", "reasoning_content", "reasoning")
_REQUEST_EXTRAS = ("tools", "functions")


def estimate(body: Mapping[str, Any]) -> TokenEstimate:
    """Estimate a chat completion request's tokens from its parsed JSON body."""
    messages = body.get("messages")
    chars, count = 0, 0
    if isinstance(messages, list):
        for message in messages:
            count += 1
            if isinstance(message, Mapping):
                chars += _chars(message.get("content"))
                chars += sum(_strings(message.get(k)) for k in _MESSAGE_EXTRAS if k in message)
    chars += sum(_strings(body.get(k)) for k in _REQUEST_EXTRAS if k in body)
    prompt = math.ceil(chars / CHARS_PER_TOKEN) + TOKENS_PER_MESSAGE * count
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    ok = isinstance(limit, int) and not isinstance(limit, bool) and limit >= 0
    return TokenEstimate(prompt, limit if ok else None)


def _chars(content: object) -> int:
    """Characters of a message's content: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(p["text"]) for p in content
                   if isinstance(p, Mapping) and isinstance(p.get("text"), str))
    return 0


def _strings(value: object) -> int:
    """Characters of every string in a JSON value, object keys included (iteratively: a
    parsed body is nested at most MAX_JSON_DEPTH deep, but no recursion is needed)."""
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, Mapping):
            total += sum(len(k) for k in item if isinstance(k, str))
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return total
