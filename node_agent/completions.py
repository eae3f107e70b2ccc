"""The OpenAI (legacy) completions shapes the emulator reads and writes; pure functions.

A completions request is generated exactly as a chat request is (the same tokens, hops,
timing and faults): only the request's `prompt` and the answer's `text_completion` shape
differ, so the emulator runs it as a ChatJob and writes it with COMPLETIONS.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from meshroute_middleware.core.prefix import message_chain

from .chat import (
    ChatJob,
    ChatRequestError,
    chunk,
    completion,
    served_body,
    usage,
    usage_chunk,
)
from .shard import EmulatorConfig


@dataclass(frozen=True, slots=True)
class Shape:
    """How an answer is written: its id prefix, the whole object, one streamed token, the
    stream's last chunk (finish reason) and its usage chunk."""

    prefix: str
    whole: Callable[[ChatJob, str, str, int], dict[str, Any]]
    token: Callable[[ChatJob, str, int, str, bool], dict[str, Any]]
    finish: Callable[[ChatJob, str, int], dict[str, Any]]
    usage: Callable[[ChatJob, str, int], dict[str, Any]]


def _chat_token(job: ChatJob, ident: str, created: int, word: str,
                first: bool) -> dict[str, Any]:
    delta = {"role": "assistant", "content": word} if first else {"content": word}
    return chunk(job, ident, created, delta, None)


CHAT = Shape("chatcmpl", completion, _chat_token,
             lambda job, ident, created: chunk(job, ident, created, {}, job.finish_reason),
             usage_chunk)


def _prompt_words(prompt: Any) -> tuple[int, str | None]:
    """(prompt tokens, the prompt's text when it is one string)."""
    if isinstance(prompt, str):
        return max(len(prompt.split()), 1), prompt
    if isinstance(prompt, list) and prompt:
        if all(type(t) is int for t in prompt):
            return len(prompt), None
        if all(isinstance(p, str) for p in prompt):
            return sum(max(len(p.split()), 1) for p in prompt), None
        if all(isinstance(p, list) and all(type(t) is int for t in p) for p in prompt):
            return sum(len(p) for p in prompt), None
    raise ChatRequestError("'prompt' must be a string, a list of strings, a token array or "
                           "a list of token arrays")


def parse_completion(body: Any, config: EmulatorConfig) -> ChatJob:
    """Validate a completions body; raise ChatRequestError or ModelNotServedError."""
    body = served_body(body, config)
    model = body["model"]
    tokens, text = _prompt_words(body.get("prompt"))
    raw = body.get("max_tokens")
    if raw is not None and (type(raw) is not int or not 1 <= raw <= config.max_tokens_limit):
        raise ChatRequestError(f"max_tokens must be an integer in 1..{config.max_tokens_limit}")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ChatRequestError("'stream_options' must be an object")
    prompt = None if text is None else message_chain([{"role": "user", "content": text}])
    return ChatJob(model=model,
                   max_tokens=config.max_tokens_default if raw is None else raw,
                   stream=body.get("stream") is True,
                   include_usage=options.get("include_usage") is True,
                   prompt_tokens=tokens,
                   finish_reason="stop" if raw is None else "length",
                   prompt=prompt)


def _choice(text: str, finish_reason: str | None) -> dict[str, Any]:
    return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}


def _object(job: ChatJob, ident: str, created: int,
            choices: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": ident, "object": "text_completion", "created": created, "model": job.model,
            "choices": choices}


def text_completion(job: ChatJob, ident: str, text: str, created: int) -> dict[str, Any]:
    """A non-streamed text_completion object."""
    return {**_object(job, ident, created, [_choice(text, job.finish_reason)]),
            "usage": usage(job)}


def text_chunk(job: ChatJob, ident: str, created: int, word: str,
               first: bool) -> dict[str, Any]:
    """One streamed text_completion chunk carrying a token."""
    return _object(job, ident, created, [_choice(word, None)])


def text_finish(job: ChatJob, ident: str, created: int) -> dict[str, Any]:
    """The stream's last choice chunk: no text, the finish reason."""
    return _object(job, ident, created, [_choice("", job.finish_reason)])


def text_usage(job: ChatJob, ident: str, created: int) -> dict[str, Any]:
    """The last chunk when stream_options.include_usage: no choices, the usage."""
    return {**_object(job, ident, created, []), "usage": usage(job)}


COMPLETIONS = Shape("cmpl", text_completion, text_chunk, text_finish, text_usage)
