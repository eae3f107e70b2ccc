"""Conversations recognised by their prompt prefix.

A chat prompt is a list of messages; turn k+1 of a conversation repeats turn k's messages and
adds the answer and a new message. `message_chain` turns the messages into a chain of hashes,
h_i of messages 1..i, with the estimated prompt tokens through message i: two prompts share a
prefix exactly as far as their chains agree, and no message text is kept. `PrefixTable` is the
router's bounded memory of which routes served which prefixes; `PrefixCache` is a server's
prefix cache (an LRU over prompts, capacity in tokens) as the simulator and the emulated node
model it (vLLM's automatic prefix caching, SGLang's RadixAttention, llama.cpp's slot cache).
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, NamedTuple

MAX_CHAIN = 256  # hashes kept per prompt: the first MAX_CHAIN - 1 messages and the last
CHARS_PER_TOKEN = 4  # the usual estimate of an English prompt's tokens
MESSAGE_OVERHEAD = 4  # tokens of a chat template's framing of one message
# Prefixes the router remembers (LRU), ~400 bytes each (measured with tracemalloc): ~6.5 MB,
# two per conversation and route (its first message and the end of its last prompt).
TABLE_PREFIXES = 16384
ROUTES_PER_PREFIX = 8  # routes remembered per prefix (the newest)
SESSIONS = 16384  # x-session-id hints remembered (LRU)


class Prefix(NamedTuple):
    """A prompt's chain of per-message hashes and its cumulative estimated tokens."""

    hashes: tuple[int, ...]  # hashes[i]: of messages 0..i (chained)
    tokens: tuple[int, ...]  # tokens[i]: estimated prompt tokens of messages 0..i
    session: int = 0  # hash of an explicit x-session-id, 0 when none

    @property
    def prompt_tokens(self) -> int:
        """Estimated tokens of the whole prompt."""
        return self.tokens[-1] if self.tokens else 0

    def extended(self, key: bytes, tokens: int) -> Prefix:
        """The chain with one more message (`tokens` long) appended."""
        last = self.hashes[-1] if self.hashes else 0
        total = self.prompt_tokens + tokens
        return Prefix((*self.hashes, _link(last, key)), (*self.tokens, total), self.session)


def _link(previous: int, data: bytes) -> int:
    """The chained 64-bit hash of one more message."""
    digest = hashlib.blake2b(previous.to_bytes(8, "little") + data, digest_size=8).digest()
    return int.from_bytes(digest, "little") or 1


def session_key(session_id: str | None) -> int:
    """The hash of an explicit session id (0 when none)."""
    return _link(0, session_id.encode()) if session_id else 0


def chain(keys: Sequence[bytes], tokens: Sequence[int], session: int = 0) -> Prefix:
    """The chain of messages given as byte keys with their token counts (bounded to
    MAX_CHAIN entries: the first ones and the last, which carries the whole prompt)."""
    hashes: list[int] = []
    totals: list[int] = []
    h, total = 0, 0
    for key, n in zip(keys, tokens, strict=True):
        h = _link(h, key)
        total += n
        hashes.append(h)
        totals.append(total)
    if len(hashes) > MAX_CHAIN:
        hashes = [*hashes[: MAX_CHAIN - 1], hashes[-1]]
        totals = [*totals[: MAX_CHAIN - 1], totals[-1]]
    return Prefix(tuple(hashes), tuple(totals), session)


def message_key(role: Any, content: Any) -> tuple[bytes, int]:
    """One message's hash input and estimated tokens."""
    text = content if isinstance(content, str) else json.dumps(
        content, sort_keys=True, default=str)
    return (f"{role}\0{text}".encode("utf-8", "surrogatepass"),
            len(text) // CHARS_PER_TOKEN + MESSAGE_OVERHEAD)


def message_chain(messages: Any, session_id: str | None = None) -> Prefix | None:
    """The chain of a chat body's `messages` (None unless a non-empty list of objects).

    `chain` of the messages' `message_key`s, inlined (it is on every chat request's path):
    the same hashes, without the intermediate lists and calls."""
    if not isinstance(messages, list) or not messages:
        return None
    hashes: list[int] = []
    totals: list[int] = []
    append_hash, append_total = hashes.append, totals.append
    blake2b, from_bytes, dumps = hashlib.blake2b, int.from_bytes, json.dumps
    previous, total = _ZERO, 0
    for message in messages:
        if not isinstance(message, dict):
            return None
        content = message.get("content")
        text = content if isinstance(content, str) else dumps(
            content, sort_keys=True, default=str)
        digest = blake2b(previous + f"{message.get('role')}\0{text}".encode(
            "utf-8", "surrogatepass"), digest_size=8).digest()
        h = from_bytes(digest, "little") or 1
        previous = digest if h != 1 else _ONE  # as _link: the int's bytes, 0 read as 1
        total += len(text) // CHARS_PER_TOKEN + MESSAGE_OVERHEAD
        append_hash(h)
        append_total(total)
    if len(hashes) > MAX_CHAIN:
        hashes = [*hashes[: MAX_CHAIN - 1], hashes[-1]]
        totals = [*totals[: MAX_CHAIN - 1], totals[-1]]
    return Prefix(tuple(hashes), tuple(totals), session_key(session_id))


_ZERO = (0).to_bytes(8, "little")
_ONE = (1).to_bytes(8, "little")


class PrefixTable:
    """Which routes served which prefixes, bounded (LRU over prefix hashes).

    A route that served a whole prompt also generated (and cached) its answer, which the
    next turn repeats as the message after that prompt: that message counts as warm there.
    Only a prompt's first message (a shared system prompt) and its end are kept, and serving
    the next turn drops the end it extends: a conversation costs two entries per route, not
    one per message (a prompt that branches off mid-way is then matched at its first message).
    """

    def __init__(self, capacity: int = TABLE_PREFIXES, sessions: int = SESSIONS) -> None:
        self.capacity = capacity
        # prefix hash -> route -> (tokens through it, whether a whole prompt ended there)
        self._by_hash: OrderedDict[int, dict[str, tuple[int, bool]]] = OrderedDict()
        self._sessions: OrderedDict[int, tuple[str, int]] = OrderedDict()
        self._session_cap = sessions

    def __len__(self) -> int:
        return len(self._by_hash)

    def warm(self, prefix: Prefix) -> dict[str, int]:
        """Per route, the tokens of this prompt's longest prefix it served (routes that
        served none are absent); a session hint names the route that served it last."""
        out: dict[str, int] = {}
        by_hash = self._by_hash
        last = len(prefix.hashes) - 1
        for i in range(last, -1, -1):
            routes = by_hash.get(prefix.hashes[i])
            if routes:
                for signature, (_, ended) in routes.items():
                    if signature not in out:
                        # the answer it generated, when the prompt goes on past it
                        out[signature] = prefix.tokens[i + 1 if ended and i < last else i]
        if prefix.session:
            hint = self._sessions.get(prefix.session)
            if hint is not None and hint[0] not in out:
                out[hint[0]] = min(hint[1], prefix.prompt_tokens)
        return out

    def served(self, prefix: Prefix, signature: str) -> None:
        """A route served this prompt: each of its prefixes is warm there now."""
        by_hash = self._by_hash
        hashes, end = prefix.hashes, len(prefix.hashes) - 1
        if not hashes:
            return
        for k in range(end - 1, 0, -1):  # the end this prompt extends, if this route has it
            routes = by_hash.get(hashes[k])
            if routes is not None and routes.pop(signature, None) is not None:
                if not routes:
                    del by_hash[hashes[k]]
                break
        for k in (0, end) if end else (0,):
            h = hashes[k]
            routes = by_hash.get(h)
            if routes is None:
                routes = by_hash[h] = {}
            else:
                by_hash.move_to_end(h)
                routes.pop(signature, None)
            routes[signature] = (prefix.tokens[k], k == end)
            if len(routes) > ROUTES_PER_PREFIX:
                del routes[next(iter(routes))]
        while len(by_hash) > self.capacity:
            by_hash.popitem(last=False)
        if prefix.session:
            self._sessions[prefix.session] = (signature, prefix.prompt_tokens)
            self._sessions.move_to_end(prefix.session)
            while len(self._sessions) > self._session_cap:
                self._sessions.popitem(last=False)


class PrefixCache:
    """A server's prefix cache: whole prompts in LRU order, at most `capacity` tokens (and
    at most `max_entries` prompts: a cache per slot, as llama.cpp's, keeps each slot's last
    prompt and no more; None: no limit)."""

    def __init__(self, capacity: int, max_entries: int | None = None) -> None:
        self.capacity = capacity
        self.max_entries = max_entries
        self.used = 0
        self._entries: OrderedDict[int, Prefix] = OrderedDict()  # by last hash
        self._owner: dict[int, int] = {}  # prefix hash -> the entry holding it

    def __len__(self) -> int:
        return len(self._entries)

    def match(self, prefix: Prefix, touch: bool = True) -> int:
        """Tokens of the prompt's longest cached prefix (a hit refreshes its entry)."""
        for i in range(len(prefix.hashes) - 1, -1, -1):
            key = self._owner.get(prefix.hashes[i])
            if key is not None:
                if touch:
                    self._entries.move_to_end(key)
                return prefix.tokens[i]
        return 0

    def store(self, prefix: Prefix) -> None:
        """Cache a prompt (its KV state); entries it extends are replaced, the least
        recently used ones evicted while over capacity."""
        if not prefix.hashes:
            return
        ours = set(prefix.hashes)
        for key in {self._owner[h] for h in prefix.hashes if h in self._owner}:
            if key in ours:
                self._remove(key)
        key = prefix.hashes[-1]
        self._entries[key] = prefix
        for h in prefix.hashes:
            self._owner[h] = key
        self.used += prefix.prompt_tokens
        limit = self.max_entries
        while self._entries and (self.used > self.capacity
                                 or (limit is not None and len(self._entries) > limit)):
            self._remove(next(iter(self._entries)))

    def _remove(self, key: int) -> None:
        entry = self._entries.pop(key)
        self.used -= entry.prompt_tokens
        for h in entry.hashes:
            if self._owner.get(h) == key:
                del self._owner[h]
