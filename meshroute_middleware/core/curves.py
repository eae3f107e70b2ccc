"""An origin's saturation-curve summary (issue 14), and the checks of the numbers another
process sends: gossip's decoder and the state file read curves and entries through them.

A summary is (concurrency bin, decayed mass, mean log tokens/s) per bin, bins strictly
ascending, at most MAX_CURVE_BINS of them (the policy's `saturation.SUMMARY_BINS` heaviest). A
bin is round(4 · log2(concurrency)).
"""

from __future__ import annotations

import math

from .contracts.limits import MAX_TPS

CurveBin = tuple[int, float, float]
Curve = tuple[CurveBin, ...]
MAX_CURVE_BINS = 8
MAX_CURVE_BIN = 80  # 4 bins an octave: 2**20 requests in flight
MAX_CURVE_MASS = 1e9  # decayed weights: ~1.4 million samples/s over a 600 s half-life
# A bin's mean log tokens/s: a sample's tps is capped at MAX_TPS; the floor, 1e-6 tok/s, is
# 8 tokens over three months.
MAX_CURVE_LOG_TPS = math.log(MAX_TPS)


def parse_curve(obj: object) -> Curve:
    """A curve summary from its plain form `[[bin, mass, mean log tps], ...]` (gossip's wire,
    the state file), checked: 1..MAX_CURVE_BINS bins, strictly ascending in 0..MAX_CURVE_BIN,
    masses finite in [0, MAX_CURVE_MASS], means finite within ±MAX_CURVE_LOG_TPS. ValueError
    saying what is wrong."""
    if not isinstance(obj, list) or not 1 <= len(obj) <= MAX_CURVE_BINS:
        raise ValueError(f"a curve must be a list of 1..{MAX_CURVE_BINS} bins")
    out: list[CurveBin] = []
    for point in obj:
        if not isinstance(point, list) or len(point) != 3:
            raise ValueError("a curve bin must be [bin, mass, mean log tps]")
        key = checked_int(point[0], "curve bin", MAX_CURVE_BIN)
        if out and key <= out[-1][0]:
            raise ValueError("curve bins must be strictly ascending")
        out.append((key, checked_number(point[1], "curve mass", 0.0, MAX_CURVE_MASS),
                    checked_number(point[2], "curve mean", -MAX_CURVE_LOG_TPS,
                                   MAX_CURVE_LOG_TPS)))
    return tuple(out)


def checked_number(obj: object, what: str, low: float = 0.0, high: float = math.inf) -> float:
    """`obj` as a float when it is a finite number (not a bool) in [low, high]; ValueError
    saying what is wrong. Gossip's decoder and the state file check with it."""
    if isinstance(obj, bool) or not isinstance(obj, int | float):
        raise ValueError(f"{what} must be a number")
    value = float(obj)
    if not math.isfinite(value) or not low <= value <= high:
        raise ValueError(f"{what} must be finite and in [{low:g}, {high:g}]")
    return value


def checked_int(obj: object, what: str, high: int) -> int:
    """`obj` when it is an integer (not a bool) in 0..high; ValueError saying what is not."""
    if isinstance(obj, bool) or not isinstance(obj, int) or not 0 <= obj <= high:
        raise ValueError(f"{what} must be an integer in 0..{high}")
    return obj
