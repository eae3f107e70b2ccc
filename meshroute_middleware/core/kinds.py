"""The closed sets of words the core hands out: decision modes, record results, change kinds,
error kinds and route statuses.

`Literal` types rather than enums: the values travel as they are in headers, events, JSON and
Prometheus labels, and a `Literal` is a plain `str` at run time, so nothing on the wire changes.
"""

from __future__ import annotations

from typing import Final, Literal

# ADR-0021 decision modes (the x-meshroute-mode header, the route-selected event).
DecisionMode = Literal["scout", "exploit", "pinned", "greedy-fallback", "fallback", "hedge"]
SCOUT: Final = "scout"  # an unproven route tried on purpose
EXPLOIT: Final = "exploit"  # a proven route drawn by its learned speed
PINNED: Final = "pinned"  # the request named its route
GREEDY: Final = "greedy-fallback"  # nothing proven yet: the best prior
FALLBACK: Final = "fallback"  # the next ranked route after a failed attempt
HEDGE: Final = "hedge"  # the next ranked route, raced beside a slow first byte (chat/hedge.py)

# What Router.record made of an attempt.
RecordResult = Literal["sample", "success", "failure"]
SAMPLE: Final = "sample"  # a success with enough tokens to be a tokens/s sample
SUCCESS: Final = "success"  # a success too short to measure
FAILURE: Final = "failure"

# What Topology.upsert / Router.upsert_node did with a record.
ChangeKind = Literal["join", "shard-change", "refresh"]
JOIN: Final = "join"
SHARD_CHANGE: Final = "shard-change"  # layers, layer count or URL changed: a new epoch
REFRESH: Final = "refresh"  # a heartbeat or a load update: same epoch

# Why an attempt failed (Outcome.error; "" on success), as the forwarders report it.
ErrorKind = Literal["connect", "timeout", "http_5xx", "http_429", "stream", "redirect",
                    "app_error", "context", "client_error"]
CONNECT: Final = "connect"  # the head could not be reached
TIMEOUT: Final = "timeout"  # no answer in time
HTTP_5XX: Final = "http_5xx"  # the head answered 5xx before any byte of the body
HTTP_429: Final = "http_429"  # the head is rate-limited
STREAM: Final = "stream"  # the head died mid-response
REDIRECT: Final = "redirect"  # the head answered 3xx: never followed (docs/security.md)
APP_ERROR: Final = "app_error"  # annotate mode: the wrapped app raised before its first byte
CONTEXT: Final = "context"  # a provider refused the prompt as too long for its context
CLIENT_ERROR: Final = "client_error"  # a provider refused the request itself (4xx)

# A route's statistics as a decision sees them (ADR-0021).
Status = Literal["proven", "unsampled", "stale", "decayed"]
PROVEN: Final = "proven"  # in the exploit pool: decayed mass >= 0.5 since the last change
UNSAMPLED: Final = "unsampled"  # never measured
STALE: Final = "stale"  # measured only before the last topology change
DECAYED: Final = "decayed"  # measured since the change, but the mass has decayed below 0.5
