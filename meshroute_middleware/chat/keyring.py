"""Resolves provider key references (`env:NAME`, `file:PATH`) to secrets that never print.

The environment is passed in (library code never reads `os.environ`); files are read here, at
start-up, once. A `Secret` shows as `Secret(***)` in every repr, str, format, log record and
traceback; only `reveal()` hands out the value, for the Authorization header.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, NoReturn

from meshroute_middleware.core.errors import MeshRouteError
from meshroute_middleware.core.providers.config import ProvidersConfig

MAX_KEY_FILE_BYTES = 64 * 1024  # a key file is a line, not a data set
REDACTED = "***"


class KeyRefError(MeshRouteError, ValueError):
    """A key reference cannot be resolved; the message names the reference, never a value."""


class Secret:
    """A key whose value never appears in a repr, str, format or pickle."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"Secret({REDACTED})"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(("Secret", self._value))

    def __reduce__(self) -> NoReturn:
        raise TypeError("a Secret is not pickled")


def resolve_key(ref: str, environ: Mapping[str, str],
                read_text: Callable[[Path], str] | None = None) -> Secret:
    """The secret behind `env:NAME` (from `environ`) or `file:PATH` (its first line)."""
    kind, _, target = ref.partition(":")
    if kind == "env" and target:
        value = environ.get(target, "").strip()
        if not value:
            raise KeyRefError(f"{ref}: the environment variable {target} is not set or empty")
        return Secret(value)
    if kind == "file" and target:
        return Secret(_read_key_file(Path(target).expanduser(), ref, read_text))
    raise KeyRefError(f"a key reference must be 'env:NAME' or 'file:PATH' (got one of "
                      f"{len(ref)} characters)")


NodeSecrets = Mapping[str, tuple[str, Secret]]  # node id -> (the URL it may go to, its key)


def resolve_node_keys(cfg: ProvidersConfig, environ: Mapping[str, str],
                      read_text: Callable[[Path], str] | None = None) -> dict[str, tuple[str,
                                                                                     Secret]]:
    """Every `[[node_keys]]` entry's key, by node id, with the URL it is bound to."""
    out: dict[str, tuple[str, Secret]] = {}
    for entry in cfg.node_keys:
        try:
            out[entry.node] = (entry.url, resolve_key(entry.key, environ, read_text))
        except KeyRefError as exc:
            raise KeyRefError(f"[[node_keys]] {entry.node!r}: {exc}") from None
    return out


def resolve_keys(cfg: ProvidersConfig, environ: Mapping[str, str],
                 read_text: Callable[[Path], str] | None = None) -> dict[str, tuple[Secret, ...]]:
    """Every provider's keys, in `keys` order (position 1 is the first)."""
    out: dict[str, tuple[Secret, ...]] = {}
    for provider in cfg.providers:
        try:
            out[provider.name] = tuple(resolve_key(ref, environ, read_text)
                                       for ref in provider.keys)
        except KeyRefError as exc:
            raise KeyRefError(f"[[providers]] {provider.name!r}: {exc}") from None
    return out


def scrub(text: str, secrets: Iterable[Secret]) -> str:
    """`text` with every secret's value replaced by `***` (a last line of defence for logs)."""
    for secret in secrets:
        value = secret.reveal()
        if value:
            text = text.replace(value, REDACTED)
    return text


def scrub_json(value: Any, secrets: Iterable[Secret]) -> Any:
    """`scrub` over every string inside a JSON-like value."""
    secrets = tuple(secrets)
    if isinstance(value, str):
        return scrub(value, secrets)
    if isinstance(value, list):
        return [scrub_json(v, secrets) for v in value]
    if isinstance(value, dict):
        return {scrub(str(k), secrets): scrub_json(v, secrets) for k, v in value.items()}
    return value


def _read_key_file(path: Path, ref: str, read_text: Callable[[Path], str] | None) -> str:
    try:
        if read_text is not None:
            text = read_text(path)
        else:
            if path.stat().st_size > MAX_KEY_FILE_BYTES:
                raise KeyRefError(f"{ref}: the file is larger than {MAX_KEY_FILE_BYTES} bytes")
            text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise KeyRefError(f"{ref}: cannot read the key file ({reason})") from None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise KeyRefError(f"{ref}: the key file is empty")
    if len(lines) > 1:
        raise KeyRefError(f"{ref}: the key file holds more than one line")
    return lines[0]
