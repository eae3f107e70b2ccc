"""Who may spend (issue 24): a client of the gateway, as `[[clients]]` configures it.

Pure data and rules: the `[[clients]]` tables parsed and checked (`parse_clients`), a presented
key matched against every client's digest in constant time (`find_client`), and the model
allow-list (`check_model`). The key itself is never kept, only its SHA-256 digest
(`key_digest`); reading `env:`/`file:` references is the adapters' job (chat/keyring.py)."""

from __future__ import annotations

import hashlib
import hmac
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from .errors import MeshRouteError

# Where an authenticated request carries its client: scope["state"][CLIENT_STATE].
CLIENT_STATE = "meshroute.client"
CLIENT_NAME = re.compile(r"[a-z0-9-]+")
MAX_CLIENT_NAME = 64  # a name is a metric label and a log word: short
MIN_KEY_CHARS = 16  # a resolved env:/file: key shorter than this is refused (guessable)
SHA256_REF = re.compile(r"sha256:([0-9a-fA-F]{64})")
_ENV_REF = re.compile(r"env:[A-Za-z_][A-Za-z0-9_]*")
_KNOWN = frozenset({"name", "key", "models", "rpm", "tpm", "daily_tokens", "monthly_usd"})


class ClientConfigError(MeshRouteError, ValueError):
    """A `[[clients]]` table is malformed; the message names the table, never a key."""


class MissingKeyError(MeshRouteError):
    """An inference request without a client key, when clients are configured (401)."""


class InvalidKeyError(MeshRouteError):
    """An inference request whose key is no client's (401)."""


class ModelNotAllowedError(MeshRouteError):
    """The client may not use the model it asked for (403)."""


@dataclass(frozen=True, slots=True)
class Client:
    """One client: its name (what logs, metrics and usage show), the digest of its key, the
    models it may use (glob patterns; empty: everything), and its limits and budgets (None:
    unlimited)."""

    name: str
    key_digest: bytes
    models: tuple[str, ...] = ()
    rpm: int | None = None
    tpm: int | None = None
    daily_tokens: int | None = None
    monthly_usd: float | None = None
    # whether a limit or a budget applies (a client without one is only recorded); set from
    # the limits, read on every request
    limited: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "limited", not (
            self.rpm is None and self.tpm is None and self.daily_tokens is None
            and self.monthly_usd is None))


@dataclass(frozen=True, slots=True)
class ClientTable:
    """A `[[clients]]` table as written: its key still a reference ("env:NAME", "file:PATH"
    or "sha256:<hex>"), resolved into a `Client` by `client()` once the key is read."""

    name: str
    key: str
    models: tuple[str, ...] = ()
    rpm: int | None = None
    tpm: int | None = None
    daily_tokens: int | None = None
    monthly_usd: float | None = None

    @property
    def hashed(self) -> bool:
        """Whether the key is given as its digest (nothing to read)."""
        return self.key.startswith("sha256:")

    def client(self, key: str | None = None) -> Client:
        """The Client, from the resolved key of an env:/file: reference (None for sha256:)."""
        if self.hashed:
            digest = bytes.fromhex(self.key[len("sha256:"):])
        else:
            if key is None or len(key) < MIN_KEY_CHARS:
                raise ClientConfigError(f"[[clients]] {self.name!r}: {self.key}: the key is "
                                        f"shorter than {MIN_KEY_CHARS} characters (make one "
                                        "with `meshroute keys new NAME`)")
            digest = key_digest(key)
        return Client(self.name, digest, self.models, self.rpm, self.tpm,
                      self.daily_tokens, self.monthly_usd)


def key_digest(key: str | bytes) -> bytes:
    """The SHA-256 digest of a key (as configured, or as a request presents it)."""
    return hashlib.sha256(key.encode() if isinstance(key, str) else key).digest()


def parse_clients(tables: object) -> tuple[ClientTable, ...]:
    """The `[[clients]]` array of tables, checked: names unique, keys references, limits
    positive. ClientConfigError names the table at fault."""
    if not isinstance(tables, list):
        raise ClientConfigError("clients must be an array of tables: [[clients]]")
    out = tuple(_table(i, t) for i, t in enumerate(tables))
    names = [c.name for c in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ClientConfigError(f"[[clients]] {dup[0]!r}: the name is configured twice")
    keys = [c.key for c in out]
    same = next((c for c in out if keys.count(c.key) > 1), None)
    if same is not None:
        raise ClientConfigError(f"[[clients]] {same.name!r}: its key reference is another "
                                "client's too (each client needs its own key)")
    return out


def check_distinct(clients: Iterable[Client]) -> None:
    """ClientConfigError when two clients share one key (whose request would it be?)."""
    seen: dict[bytes, str] = {}
    for c in clients:
        if c.key_digest in seen:
            raise ClientConfigError(f"[[clients]] {c.name!r}: its key is {seen[c.key_digest]!r}'s "
                                    "too (each client needs its own key)")
        seen[c.key_digest] = c.name


def find_client(clients: Iterable[Client], key: bytes) -> Client | None:
    """The client whose key is `key`, or None. Every client's digest is compared, in
    constant time (hmac.compare_digest), whichever matches: the time taken says nothing of
    which client, or how much of a key, was right."""
    digest = key_digest(key)
    found = None
    for c in clients:
        if hmac.compare_digest(c.key_digest, digest) and found is None:
            found = c
    return found


def may_use(client: Client | None, model: str) -> bool:
    """Whether `client` may ask for `model` (its name as the request gives it: `auto`,
    `auto:coding`, `fastco/big-model`, a mesh model); no client or no patterns: yes."""
    return client is None or not client.models or any(
        fnmatchcase(model, pattern) for pattern in client.models)


def check_model(client: Client | None, model: str) -> None:
    """ModelNotAllowedError when `client` may not ask for `model` (`may_use`)."""
    if not may_use(client, model):
        assert client is not None
        raise ModelNotAllowedError(f"client {client.name!r} may not use model {model!r}")


def check_pin(client: Client | None, pin: Iterable[str]) -> None:
    """ModelNotAllowedError when a chain's pin (`"route": ["provider/model"]`, routes by
    name) names a route `client` may not ask for by name: a pin is no way around the
    allow-list (issue 32)."""
    for route in pin:
        if not may_use(client, route):
            assert client is not None
            raise ModelNotAllowedError(f"client {client.name!r} may not use model {route!r} "
                                       "(pinned with 'route')")


def _table(i: int, t: object) -> ClientTable:
    where = f"[[clients]] #{i + 1}"
    if not isinstance(t, Mapping):
        raise ClientConfigError(f"{where} must be a table")
    name = t.get("name")
    if (not isinstance(name, str) or not CLIENT_NAME.fullmatch(name)
            or len(name) > MAX_CLIENT_NAME):
        raise ClientConfigError(f"{where}: name must be a string matching [a-z0-9-]+ "
                                f"(at most {MAX_CLIENT_NAME} characters)")
    where = f"[[clients]] {name!r}"
    unknown = sorted(set(t) - _KNOWN)
    if unknown:
        raise ClientConfigError(f"{where}: unknown key(s) {', '.join(map(str, unknown))}")
    return ClientTable(name, _key(t.get("key"), where), _models(t, where),
                       rpm=_positive_int(t, "rpm", where), tpm=_positive_int(t, "tpm", where),
                       daily_tokens=_positive_int(t, "daily_tokens", where),
                       monthly_usd=_usd(t, where))


def _key(ref: object, where: str) -> str:
    ok = isinstance(ref, str) and bool(
        _ENV_REF.fullmatch(ref) or SHA256_REF.fullmatch(ref)
        or (ref.startswith("file:") and len(ref) > len("file:")))
    if not ok:  # the value is not echoed: it may be a pasted key
        raise ClientConfigError(f"{where}: key must be 'env:NAME', 'file:PATH' or "
                                "'sha256:<64 hex digits>' (a key is never written into the "
                                "config itself; `meshroute keys new NAME` prints its sha256)")
    assert isinstance(ref, str)
    return ref.lower() if ref.startswith("sha256:") else ref


def _models(t: Mapping[str, Any], where: str) -> tuple[str, ...]:
    if "models" not in t:
        return ()
    models = t["models"]
    if (not isinstance(models, list) or not models
            or not all(isinstance(m, str) and m for m in models)):
        raise ClientConfigError(f"{where}: models must be a non-empty list of model names or "
                                "glob patterns (leave it out to allow every model)")
    return tuple(models)


def _positive_int(t: Mapping[str, Any], key: str, where: str) -> int | None:
    value = t.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ClientConfigError(f"{where}: {key} must be a positive integer")
    return value


def _usd(t: Mapping[str, Any], where: str) -> float | None:
    value = t.get("monthly_usd")
    if value is None:
        return None
    if (not isinstance(value, int | float) or isinstance(value, bool)
            or not math.isfinite(value) or value < 0):
        raise ClientConfigError(f"{where}: monthly_usd must be a number of USD, 0 or more")
    return float(value)
