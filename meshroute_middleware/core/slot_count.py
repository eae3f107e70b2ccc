"""A server's slot count as a prior for a route's saturation knee.

A node may announce `slots`: how many requests its server runs at once (its batch; more
queue). llama.cpp's `/props` counts them (`total_slots`) and `/slots` lists them, SGLang
exports `max_running_requests` (node_agent/engines.py reads them); vLLM's is its
`--max-num-seqs`, which an operator states with `meshroute node --slots`. A chain runs no
more requests at once than its narrowest hop, so a route's slots are its hops' smallest,
and unknown when any hop does not say: the router never believes a route batches more than
its smallest hop's slots.

The field comes from another process (TXT record, registration): `parse_slot_count` bounds
it and raises InvalidNodeError, so a bad value rejects the record like any field.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from .contracts.limits import MAX_SLOTS
from .errors import InvalidNodeError

SLOTS_KEY: Final = "slots"
_MAX_DIGITS: Final = len(str(MAX_SLOTS))


def slot_count(value: Any, what: str = f"'{SLOTS_KEY}'") -> int:
    """`value` as a slot count, 1..MAX_SLOTS: an integer, an integral float or ASCII digits;
    InvalidNodeError naming `what` otherwise (a boolean, a fraction, text `int()` would
    read, such as '١٢' or '1_0')."""
    if isinstance(value, str):
        text = value.strip()
        if not (text.isascii() and text.isdigit() and len(text) <= _MAX_DIGITS):
            raise InvalidNodeError(f"{what} must be an integer in 1..{MAX_SLOTS}, "
                                   f"got {text[:16]!r}")
        value = int(text)
    elif isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SLOTS:
        raise InvalidNodeError(f"{what} must be an integer in 1..{MAX_SLOTS}, "
                               f"got {str(value)[:16]!r}")
    return value


def parse_slot_count(data: Mapping[str, Any]) -> int | None:
    """The record's `slots`, bounded; None when it has none."""
    value = data.get(SLOTS_KEY)
    if value is None or value == "":
        return None
    return slot_count(value)


def slot_fields(slots: int | None) -> dict[str, int]:
    """The slot count as record fields (what parse_slot_count reads back); {} for none."""
    return {} if slots is None else {SLOTS_KEY: slots}


def route_slots(slots: Iterable[int | None]) -> int | None:
    """A chain's slots from its hops': the smallest, None when any hop does not say."""
    smallest: int | None = None
    for count in slots:
        if count is None:
            return None
        smallest = count if smallest is None else min(smallest, count)
    return smallest
