"""The checks every gossip body's decoder shares: nothing read from a peer is trusted.

A fault in a frame's structure raises `MalformedMessage` (the frame is refused); a decoder that
refuses one item for its values counts it in a `Refused` instead and keeps the rest.
"""

from __future__ import annotations

import math
from typing import Any

import msgpack

from meshroute_middleware.core.curves import checked_int, checked_number

from . import errors as err

MAX_COUNT = 2**53  # counts stay exact as floats
MAX_MASS = 1e9  # decayed weights: ~1.4 million samples/s sustained over a 600 s half-life
MAX_TTFB_S = 3600.0  # no first byte is awaited for an hour


class Refused:
    """Counts the items a decode dropped for their values."""

    def __init__(self) -> None:
        self.n = 0
        self.curves = 0


def fail(what: str) -> err.MalformedMessage:
    """The refusal of a frame whose structure is wrong."""
    return err.MalformedMessage(what)


def as_map(obj: Any, what: str) -> dict[Any, Any]:
    """`obj` when it is a map."""
    if not isinstance(obj, dict):
        raise fail(f"{what} must be a map")
    return obj


def text(obj: Any, what: str, max_chars: int) -> str:
    """`obj` when it is a printable string of 1..max_chars characters."""
    if not isinstance(obj, str) or not obj or len(obj) > max_chars or not obj.isprintable():
        raise fail(f"{what} must be a printable string of 1..{max_chars} characters")
    return obj


def number(obj: Any, what: str, low: float = 0.0, high: float = math.inf) -> float:
    """`obj` as a float when it is a finite number in [low, high]."""
    try:
        return checked_number(obj, what, low, high)
    except ValueError as exc:
        raise fail(str(exc)) from None


def is_int(obj: Any) -> bool:
    """Whether `obj` is an int and not a bool."""
    return isinstance(obj, int) and not isinstance(obj, bool)


def integer(obj: Any, what: str, high: int) -> int:
    """`obj` when it is an integer in 0..high."""
    try:
        return checked_int(obj, what, high)
    except ValueError as exc:
        raise fail(str(exc)) from None


def pack(obj: Any) -> bytes:
    """The msgpack of `obj`."""
    data: bytes = msgpack.packb(obj)
    return data


def unpack(data: bytes, **limits: int) -> Any:
    """The msgpack object `data` holds, within `limits`; MalformedMessage if it is not one."""
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True,
                               max_ext_len=0, **limits)
    except Exception as exc:  # msgpack raises many types on hostile input: all are "malformed"
        raise err.MalformedMessage(f"not valid msgpack: {type(exc).__name__}") from exc
