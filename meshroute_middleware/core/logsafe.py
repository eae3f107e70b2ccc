"""Network-supplied strings as log lines may show them: control characters escaped, bounded.

An unsigned mDNS record put raw terminal escapes into a log line (issue 22): every node id,
URL, service name or peer string that came from the network passes through `shown` before it
is logged.
"""

from __future__ import annotations

MAX_SHOWN_CHARS = 200  # of one value in a log line


def shown(value: object, limit: int = MAX_SHOWN_CHARS) -> str:
    """`value` as text with every non-printable character escaped (`\\x1b`, `\\u200b`),
    cut to `limit` characters (with `…` when cut)."""
    text = str(value)
    cut = len(text) > limit
    text = text[:limit]
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text + "…" if cut else text
