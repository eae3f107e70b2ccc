"""The provider config's small typed readers: each returns a key's value or raises
ProviderConfigError naming the table and the key (config.py's tables use them)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import MeshRouteError


class ProviderConfigError(MeshRouteError, ValueError):
    """A provider table is malformed; the message names the table and key."""


def _table(doc: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = doc.get(key, {})
    if not isinstance(value, Mapping):
        raise ProviderConfigError(f"{where or 'config'}: [{key}] must be a table")
    return value


def _list(doc: Mapping[str, Any], key: str, where: str) -> list[Any]:
    value = doc.get(key, [])
    if not isinstance(value, list):
        raise ProviderConfigError(f"{where or 'config'}: {key} must be an array of tables "
                                  f"([[{key}]])")
    return value


def _no_unknown(t: Mapping[str, Any], where: str, known: set[str]) -> None:
    unknown = sorted(set(t) - known)
    if unknown:
        raise ProviderConfigError(f"{where}: unknown key(s) {', '.join(unknown)}")


def _chain(t: Mapping[str, Any], where: str) -> tuple[str, ...]:
    chain = t.get("chain", [])
    if not isinstance(chain, list) or not all(isinstance(e, str) and e.strip() for e in chain):
        raise ProviderConfigError(f"{where}: chain must be a list of model names")
    if len(set(chain)) != len(chain):
        raise ProviderConfigError(f"{where}: chain lists an entry twice")
    return tuple(chain)


def _choice(t: Mapping[str, Any], key: str, allowed: tuple[str, ...], where: str,
            default: str | None) -> str | None:
    value = t.get(key, default)
    if value is not None and value not in allowed:
        raise ProviderConfigError(f"{where}: {key} must be one of {' | '.join(allowed)}, "
                                  f"got {value!r}")
    return value if value is None else str(value)


def _opt_str(t: Mapping[str, Any], key: str, where: str) -> str | None:
    value = t.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise ProviderConfigError(f"{where}: {key} must be a non-empty string")
    return value


def _flag(t: Mapping[str, Any], key: str, where: str) -> bool:
    value = t.get(key, False)
    if not isinstance(value, bool):
        raise ProviderConfigError(f"{where}: {key} must be true or false, got {value!r}")
    return value


def _opt_int(t: Mapping[str, Any], key: str, where: str) -> int | None:
    if key not in t:
        return None
    return int(_number(t, key, where, 0, low=1, integer=True))


def _number(t: Mapping[str, Any], key: str, where: str, default: float, *, low: float,
            integer: bool = False) -> float:
    value: Any = t.get(key, default)
    wrong = isinstance(value, bool) or not isinstance(value, int | float)
    if wrong or (integer and not isinstance(value, int)):
        kind = "an integer" if integer else "a number"
        raise ProviderConfigError(f"{where}: {key} must be {kind}, got {value!r}")
    number = float(value)
    if not number >= low:  # also refuses NaN
        raise ProviderConfigError(f"{where}: {key} must be >= {low:g}, got {value!r}")
    return number
