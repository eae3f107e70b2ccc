"""Mid-stream failover (issue 34): a streamed answer whose route dies after content reached
the client is continued on the next route of the same model, in the same stream (the rule:
chat/failover.py; mesh routes: chat/forward.py; provider routes: chat/providers/continued.py).

The next route gets the original request plus what was relayed so far: chat completions as a
trailing assistant message (llama.cpp's server continues it, as most servers that accept a
prefill do), a completions prompt with the text appended (a prompt continues exactly). Its
answer is spliced in: one id, the first route's `created` and `model`, no second role chunk,
one `finish_reason`, `usage` summed over the attempts, an SSE comment at the switch and a
`meshroute` field (`attempts`, `routes`) on the chunk that carries the `finish_reason` and on
the usage chunk.

What is not continued (docs/reliability.md, "Mid-stream failover"): a stream that relayed a
tool call, reasoning or more than one choice, that had already finished, that is larger than
MAX_TRANSCRIPT_BYTES or sent an event larger than MAX_EVENT_BYTES, a request that says
`"meshroute": {"continue": false}`, a prompt that is not one string, and a route a node
announced cannot continue. Those end as before: with the API's SSE error event.

`Transcript` is the relay's transform: it sends whole SSE events only (an event cut in half
would be read by nobody) and keeps the bytes it sent, parsed only when a route fails.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from meshroute_middleware.core import Decision, Router
from meshroute_middleware.core.routes import Route
from meshroute_middleware.http.request import RequestKind

# What a stream keeps of its own answer to continue it: 4 MiB is ~1M tokens of text, past any
# answer a bound allows (MAX_ANSWER_TOKENS); a larger stream is not continued.
MAX_TRANSCRIPT_BYTES = 4 * 1024 * 1024
# An event held back until its blank line: a route that sends a larger one (or never ends it)
# has it passed on as it comes, and its stream is no more continued.
MAX_EVENT_BYTES = 1024 * 1024
_DATA = b"data:"


def can_continue(route: Route) -> bool:
    """Whether every node of `route` continues a trailing assistant message (a node says it
    cannot in its announcement: `continues: false`)."""
    return all(hop.node.continues for hop in route.hops)


def next_continuing(router: Router, after: Decision) -> Decision | None:
    """The next ranked route after `after` whose nodes can continue an answer (begun, as
    `Router.fallback` begins it), with only such routes left to fall back to; None when
    there is none. The routes passed over here were never tried: they are not recorded."""
    following = router.fallback(after)
    while following is not None and not can_continue(following.route):
        router.cancel(following)
        following = router.fallback(following)
    if following is not None:
        following._ranked = tuple(r for r in following.ranked if can_continue(r))
    return following


def events_of(raw: bytes) -> Iterator[bytes]:
    """The `data:` payloads of the whole SSE events in `raw`, in order."""
    for line in raw.replace(b"\r\n", b"\n").split(b"\n"):
        if line.startswith(_DATA):
            yield line[len(_DATA):].strip()


def json_object(data: bytes) -> dict[str, Any] | None:
    """`data` read as a JSON object; None when it is not one."""
    if not data.startswith(b"{"):
        return None
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


@dataclass(slots=True)
class Partial:
    """What a stream told its client before its route failed."""

    text: str = ""
    id: str | None = None
    created: Any = None
    model: Any = None
    refusal: str = ""  # why it cannot be continued (empty: it can)
    finished: bool = False


def partial_of(sent: bytes, kind: RequestKind) -> Partial:
    """Parse the events a stream sent: its text so far, its id, and whether it can go on."""
    out = Partial()
    pieces: list[str] = []
    for data in events_of(sent):
        chunk = json_object(data)
        if chunk is None:
            continue
        if out.id is None and isinstance(chunk.get("id"), str):
            out.id, out.created, out.model = chunk["id"], chunk.get("created"), chunk.get("model")
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, dict):
                continue
            if choice.get("index", 0) != 0:
                out.refusal = "it has more than one choice"
            if choice.get("finish_reason") is not None:
                out.finished = True
            delta = choice if kind == "completions" else choice.get("delta")
            if not isinstance(delta, dict):
                continue
            if delta.get("tool_calls") or delta.get("function_call"):
                out.refusal = out.refusal or "it relayed a tool call"
            if delta.get("reasoning_content") or delta.get("reasoning"):
                out.refusal = out.refusal or "it relayed reasoning"
            piece = delta.get("text" if kind == "completions" else "content")
            if isinstance(piece, str):
                pieces.append(piece)
    out.text = "".join(pieces)
    if out.finished:
        out.refusal = "its answer had finished"
    return out


# what names a constrained output format (OpenAI's response_format, llama.cpp's grammar and
# json_schema, vLLM's guided_*): looked for as bytes before the body is parsed
_CONSTRAINTS = (b'"response_format"', b'"grammar"', b'"json_schema"', b'"guided_')


def constrained(body: bytes) -> bool:
    """Whether the request constrains its answer's format by a grammar or schema: a server
    applies it from the continuation's first token, as if the answer began there, so such an
    answer is not continued."""
    if not any(name in body for name in _CONSTRAINTS):
        return False
    payload = json_object(body) or {}
    shape = payload.get("response_format")
    return ((isinstance(shape, dict) and shape.get("type") not in (None, "text"))
            or bool(payload.get("grammar") or payload.get("json_schema"))
            or any(k.startswith("guided_") and payload[k] for k in payload))


def continuation_body(body: bytes, kind: RequestKind, text: str,
                      tokens_done: int) -> bytes | None:
    """The request that continues an answer that got as far as `text` (`tokens_done` tokens
    of it, taken off its bound): chat with a trailing assistant message, a completions prompt
    with `text` appended; None when the request cannot carry it (a prompt that is not one
    string). Without text the request goes as it was: there is nothing to continue."""
    payload = json_object(body)
    if payload is None:
        return None
    if text:
        if kind == "completions":
            prompt = payload.get("prompt")
            if not isinstance(prompt, str):
                return None
            payload["prompt"] = prompt + text
        else:
            messages = payload.get("messages")
            if not isinstance(messages, list):
                return None
            payload["messages"] = [*messages, {"role": "assistant", "content": text}]
    for bound in ("max_tokens", "max_completion_tokens"):
        asked = payload.get(bound)
        if type(asked) is int and asked > 0:
            payload[bound] = max(asked - tokens_done, 1)
    return json.dumps(payload).encode()


@dataclass(slots=True)
class Splice:
    """Rewrites a continuing route's events into the first route's answer.

    A chat route may answer a prefill with the prefill itself first (llama.cpp's server
    does: its first content is the assistant message it was given, then the new text): what
    the continuation says while it is still the text relayed so far is that echo, dropped."""

    first: Partial
    routes: list[str]  # every route that served a part, in order
    done: list[int] = field(default_factory=list)  # tokens each failed attempt delivered
    comment: bytes = b""  # sent before the next event: the switch, visible
    _failed: str = ""  # the route that failed last, and how
    _echo: str | None = None  # the text relayed so far, while the continuation may repeat it
    _pending: str = ""  # the continuation's text so far, while it is a prefix of the echo

    def meshroute(self) -> dict[str, Any]:
        """The `meshroute` field of the answer's last chunks."""
        return {"attempts": len(self.routes), "routes": list(self.routes)}

    def switch(self, failed: str, error: str, tokens_done: int, echo: str = "") -> None:
        """`failed` broke off (`error`) after `tokens_done` tokens; the next route may first
        repeat `echo` (a chat prefill: the text relayed so far)."""
        self.done.append(tokens_done)
        self._failed = f"{failed} failed mid-stream ({error})"
        self._echo, self._pending = (echo or None), ""

    def echoes(self, text: str) -> None:
        """The next route may first repeat `text` only (not the whole text relayed so far)."""
        self._echo, self._pending = (text or None), ""

    def going_on(self, route: str) -> None:
        """`route` answered the continuation: its events come next."""
        self.routes.append(route)
        self.comment += f": meshroute: {self._failed}; the answer continues on {route}\n\n" \
            .encode()

    def __call__(self, events: bytes) -> bytes:
        """The whole events `events` of the continuing route, rewritten."""
        out = [self.comment] if self.comment else []
        self.comment = b""
        for event in events.replace(b"\r\n", b"\n").split(b"\n\n"):
            if event.strip():
                rewritten = self._event(event)
                if rewritten is not None:
                    out.append(rewritten + b"\n\n")
        return b"".join(out)

    def _event(self, event: bytes) -> bytes | None:
        data = next(events_of(event), None)
        chunk = None if data is None else json_object(data)
        if chunk is None:
            return event  # [DONE], a comment: as it came
        for name, value in (("id", self.first.id), ("created", self.first.created),
                            ("model", self.first.model)):
            if value is not None and name in chunk:
                chunk[name] = value
        choices = chunk.get("choices")
        last = False
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta")
            if isinstance(delta, dict):
                delta.pop("role", None)  # the answer has its role chunk
                if self._echo is not None and isinstance(delta.get("content"), str):
                    delta["content"] = self._unecho(delta["content"])
            last = last or choice.get("finish_reason") is not None
        usage = chunk.get("usage")
        if not last and usage is None and _empty(choices):
            return None  # nothing left to say: a role chunk, an echo
        if isinstance(usage, dict):
            chunk["usage"] = self._summed(usage)
            last = True
        if last:
            chunk["meshroute"] = self.meshroute()
        return b"data: " + json.dumps(chunk).encode()

    def _unecho(self, piece: str) -> str:
        """`piece` of the continuation's text, less any repeat of the text relayed so far."""
        echo = self._echo or ""
        seen = self._pending + piece
        if len(seen) < len(echo) and echo.startswith(seen):
            self._pending = seen  # maybe the echo: held until it is told apart
            return ""
        self._echo, self._pending = None, ""
        return seen[len(echo):] if seen.startswith(echo) else seen

    def _summed(self, usage: dict[str, Any]) -> dict[str, Any]:
        """The continuation's usage plus the failed attempts': each delivered its counted
        tokens and read the prompt as the continuation did, less the text added to it since
        (an estimate: a route that died sent no usage)."""
        prompt, made = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if type(prompt) is not int or type(made) is not int:
            return usage
        before = sum(self.done)
        original = max(prompt - before, 0)
        prompts = prompt + sum(original + sum(self.done[:i]) for i in range(len(self.done)))
        made += before
        return {**usage, "prompt_tokens": prompts, "completion_tokens": made,
                "total_tokens": prompts + made}


def _empty(choices: object) -> bool:
    """Whether a chunk's choices carry no text (a role-only opening chunk)."""
    if not isinstance(choices, list):
        return True
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict) and any(v for v in delta.values()):
            return False
        if choice.get("text"):
            return False
    return True


class Transcript:
    """The relay's transform for a stream that may be continued: whole events only (up to
    MAX_EVENT_BYTES each), each kept (up to MAX_TRANSCRIPT_BYTES) for `partial()`; a
    continuing route's events pass through its `splice` first."""

    __slots__ = ("_held", "kind", "overflow", "sent", "splice")

    def __init__(self, kind: RequestKind) -> None:
        self.kind = kind
        self.sent = bytearray()
        self._held = b""  # an event not yet whole
        self.overflow = False
        self.splice: Splice | None = None

    def __call__(self, chunk: bytes) -> bytes:
        data = self._held + chunk if self._held else chunk
        end = data.rfind(b"\n\n")
        end = 0 if end < 0 else end + 2
        if b"\r" in data:  # events ended by CRLF CRLF
            crlf = data.rfind(b"\r\n\r\n")
            end = max(end, 0 if crlf < 0 else crlf + 4)
        whole, self._held = data[:end], data[end:]
        if len(self._held) > MAX_EVENT_BYTES:
            whole, self._held = data, b""
            self.overflow, self.sent = True, bytearray()
        return self._keep(whole)

    def _keep(self, whole: bytes) -> bytes:
        if self.splice is not None and whole:
            whole = self.splice(whole)
        if not self.overflow:
            if len(self.sent) + len(whole) > MAX_TRANSCRIPT_BYTES:
                self.overflow, self.sent = True, bytearray()
            else:
                self.sent += whole
        return whole

    def flush(self) -> bytes:
        """What is held back at the stream's end (an event without its blank line)."""
        held, self._held = self._held, b""
        if held and self.splice is not None:
            return self.splice(held + b"\n\n")
        return held

    def restart(self) -> None:
        """The route failed: an event it had begun is dropped (the client never saw it)."""
        self._held = b""

    def partial(self) -> Partial:
        """What the client has been told so far."""
        if self.overflow:
            return Partial(refusal="it is larger than meshroute keeps to continue it")
        return partial_of(bytes(self.sent), self.kind)
