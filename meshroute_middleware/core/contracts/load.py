"""The `x-meshroute-load` response header (issue 31): on every answer a node tells how many
requests it holds, running and waiting for a slot, from every sender, as the answer starts.
Written by the node emulator (`node_agent/emulator.py`), read by the gateway's forward path
into `Router.note_load` (`core/node_load.py`). The value is a plain decimal count."""

from __future__ import annotations

LOAD_HEADER = "x-meshroute-load"
MAX_HELD = 1 << 16  # a count above this is not believed (a node's slots are at most 65536)
MAX_DIGITS = 6


def parse_held(value: bytes | str | None) -> int | None:
    """The count an `x-meshroute-load` value states; None when absent or not a plain
    decimal count within MAX_HELD (a malformed value says nothing)."""
    if value is None:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    text = text.strip()
    if not text.isascii() or not text.isdigit() or len(text) > MAX_DIGITS:
        return None
    held = int(text)
    return held if held <= MAX_HELD else None
