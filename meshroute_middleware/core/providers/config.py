"""The validated, frozen model of the provider tables of the config file (issue 12).

Parses what `tomllib` gives for `[routing]`, `[profiles.NAME]`, `[[providers]]`,
`[[providers.models]]` and `[mesh.MODEL]`. Key references (`env:NAME`, `file:PATH`) are checked
for form only; `meshroute_middleware.keyring` resolves them. Errors name the table and the key,
and never echo what sits in a `keys` entry (it might be a pasted secret).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..aliases import NO_ALIASES, Aliases, parse_aliases
from ..capabilities import DEFAULT_CAPS, parse_caps
from .affinity import DEFAULT_CACHE_TTL_S, parse_ttl
from .config_read import ProviderConfigError as ProviderConfigError
from .config_read import (
    _chain,
    _choice,
    _flag,
    _list,
    _no_unknown,
    _number,
    _opt_int,
    _opt_str,
    _table,
)
from .scoring import AUTO_ALIASES

# top-level tables owned here
TABLES = ("routing", "profiles", "providers", "mesh", "aliases", "node_keys")
TIERS = ("frontier", "large", "medium", "small")
APIS = ("openai", "anthropic")  # the API a provider model speaks (issue 25)
STRATEGIES = ("balanced", "fastest", "reliable", "smartest", "cheapest", "priority")
DEFAULT_MESH_TIER = "medium"  # issue 12: a mesh model's tier unless [mesh.MODEL] says
DEFAULT_MAX_ATTEMPTS = 4  # routes tried per request before answering the exhaustion error
DEFAULT_TOTAL_BUDGET_S = 120.0  # wall time for all attempts of one request together

_NAME = re.compile(r"[a-z0-9-]+")
_ENV_REF = re.compile(r"env:[A-Za-z_][A-Za-z0-9_]*")
_LIMITS = ("rpm", "rpd", "tpm", "tpd")


@dataclass(frozen=True, slots=True)
class ProviderModel:
    """One `[[providers.models]]` entry: the upstream's model id and what it is worth."""

    id: str
    tier: str
    context: int | None = None  # tokens; None = not stated (never refused for size)
    price_in: float = 0.0  # USD per million input tokens
    price_out: float = 0.0  # USD per million output tokens
    monthly_tokens: int | None = None  # free-tier budget per key behind the headroom factor
    capabilities: frozenset[str] = DEFAULT_CAPS  # what it serves beyond plain chat
    # "openai": POST {base_url}/chat/completions; "anthropic": POST {base_url}/messages, which
    # takes /v1/messages requests untranslated and chat requests translated (docs/apis.md)
    api: str = "openai"
    # tokens: the most one answer writes when the request sets no max_tokens (the upstream's
    # default cap); a client's request without one holds this much completion in flight
    # (issue 32). None = not stated (DEFAULT_COMPLETION_TOKENS is held)
    max_output: int | None = None
    # USD per million prompt tokens read from / written to the provider's cache (issue 35);
    # None = not stated: price_in
    price_cached_in: float | None = None
    price_cache_write: float | None = None
    continues: bool = False  # `continue`: a broken stream may go on here (chat/continuation.py)

    @property
    def cache_prices(self) -> tuple[float, float]:
        """(cached read, cache write) USD per million tokens, price_in where not stated."""
        return (self.price_in if self.price_cached_in is None else self.price_cached_in,
                self.price_in if self.price_cache_write is None else self.price_cache_write)


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-key request/token limits of one provider; None = no limit."""

    rpm: int | None = None
    rpd: int | None = None
    tpm: int | None = None
    tpd: int | None = None


@dataclass(frozen=True, slots=True)
class Provider:
    """One `[[providers]]` entry. `keys` holds references, never secrets."""

    name: str
    base_url: str
    keys: tuple[str, ...]
    limits: Limits
    models: tuple[ProviderModel, ...]
    cache_ttl_s: float = DEFAULT_CACHE_TTL_S  # `cache_ttl`: how long its prompt cache stays warm

    def model(self, model_id: str) -> ProviderModel | None:
        return next((m for m in self.models if m.id == model_id), None)


@dataclass(frozen=True, slots=True)
class NodeKey:
    """One `[[node_keys]]` entry: a node's own API key (vLLM `--api-key`), sent by the
    forwarder to that node only, and only while its record points at `url`."""

    node: str  # the node id
    url: str  # the node's URL as its record gives it (no trailing slash)
    key: str  # a reference, `env:NAME` or `file:PATH`; never the key itself


@dataclass(frozen=True, slots=True)
class MeshLimits:
    """What a `[mesh.MODEL]` table says of a mesh model's size (issue 33): its nodes' context
    and largest answer, in tokens (None: not stated, never refused for size), and whether a
    request asking for a longer answer is served with `max_tokens` lowered (`clamp`) rather
    than passed over for a route that fits."""

    context: int | None = None
    max_tokens: int | None = None
    clamp: bool = False


NO_MESH_LIMITS = MeshLimits()


@dataclass(frozen=True, slots=True)
class Profile:
    """One `[profiles.NAME]` table: its chain and, optionally, its own strategy."""

    name: str
    chain: tuple[str, ...]
    strategy: str | None = None


@dataclass(frozen=True, slots=True)
class Routing:
    """The `[routing]` table."""

    strategy: str = "balanced"
    chain: tuple[str, ...] = ()
    profile: str | None = None
    wait_for_key_s: float = 0.0  # wait this long for a limited key to free instead of failing
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    total_budget_s: float = DEFAULT_TOTAL_BUDGET_S


@dataclass(frozen=True, slots=True)
class ProvidersConfig:
    """Everything issue 12 adds to the config file, validated and cross-checked."""

    routing: Routing = field(default_factory=Routing)
    profiles: tuple[Profile, ...] = ()
    providers: tuple[Provider, ...] = ()
    mesh_tiers: Mapping[str, str] = field(default_factory=dict)
    aliases: Aliases = NO_ALIASES  # `[aliases]`: requested model names onto routable ones
    node_keys: tuple[NodeKey, ...] = ()  # `[[node_keys]]`: nodes' own API keys (references)
    # `[mesh.MODEL]` context, max_tokens and clamp, by model (declared models only)
    mesh_limits: Mapping[str, MeshLimits] = field(default_factory=dict)

    def provider(self, name: str) -> Provider | None:
        return next((p for p in self.providers if p.name == name), None)

    def profile(self, name: str) -> Profile | None:
        return next((p for p in self.profiles if p.name == name), None)

    def split_route(self, entry: str) -> tuple[Provider, ProviderModel] | None:
        """(provider, model) when `entry` is `<provider>/<model id>` of a configured provider."""
        head, sep, tail = entry.partition("/")
        provider = self.provider(head) if sep else None
        model = provider.model(tail) if provider else None
        return (provider, model) if provider and model else None

    def names_provider(self, entry: str) -> bool:
        """True when `entry` starts with a configured provider name and a slash."""
        head, sep, _ = entry.partition("/")
        return bool(sep) and self.provider(head) is not None

    def mesh_tier(self, model: str) -> str:
        return self.mesh_tiers.get(model, DEFAULT_MESH_TIER)

    def mesh_size(self, model: str) -> MeshLimits:
        """A mesh model's declared size limits (none when it has no `[mesh.MODEL]` table)."""
        return self.mesh_limits.get(model, NO_MESH_LIMITS)


def parse_providers_config(doc: Mapping[str, Any]) -> ProvidersConfig:
    """Build the config from a parsed TOML document; other top-level tables are ignored."""
    providers = tuple(_provider(i, t) for i, t in enumerate(_list(doc, "providers", "")))
    names = [p.name for p in providers]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ProviderConfigError(f"[[providers]]: name {dup[0]!r} is configured twice")
    profiles = tuple(_profile(n, t) for n, t in _table(doc, "profiles", "").items())
    mesh_tables = _table(doc, "mesh", "")
    mesh = {str(n): _mesh_tier(n, t) for n, t in mesh_tables.items()}
    limits = {str(n): _mesh_limits(n, t) for n, t in mesh_tables.items()}
    try:
        aliases = parse_aliases(_table(doc, "aliases", ""))
    except ValueError as exc:
        raise ProviderConfigError(str(exc)) from None
    node_keys = tuple(_node_key(i, t) for i, t in enumerate(_list(doc, "node_keys", "")))
    if len({k.node for k in node_keys}) != len(node_keys):
        raise ProviderConfigError("[[node_keys]]: a node is listed twice")
    cfg = ProvidersConfig(_routing(_table(doc, "routing", "")), profiles, providers, mesh,
                          aliases, node_keys, limits)
    _check_chains(cfg)
    _check_aliases(cfg)
    return cfg


def _routing(t: Mapping[str, Any]) -> Routing:
    where = "[routing]"
    _no_unknown(t, where, {"strategy", "chain", "profile", "wait_for_key_s", "max_attempts",
                           "total_budget_s", "hedge"})  # hedge: app/settings.py
    return Routing(
        strategy=_choice(t, "strategy", STRATEGIES, where, "balanced") or "balanced",
        chain=_chain(t, where),
        profile=_opt_str(t, "profile", where),
        wait_for_key_s=_number(t, "wait_for_key_s", where, 0.0, low=0.0),
        max_attempts=int(_number(t, "max_attempts", where, DEFAULT_MAX_ATTEMPTS, low=1,
                                 integer=True)),
        total_budget_s=_number(t, "total_budget_s", where, DEFAULT_TOTAL_BUDGET_S, low=0.001),
    )


def _profile(name: object, t: object) -> Profile:
    where = f"[profiles.{name}]"
    if not isinstance(t, Mapping):
        raise ProviderConfigError(f"{where} must be a table")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ProviderConfigError(f"{where}: a profile name must match [a-z0-9-]+")
    if name in AUTO_ALIASES:
        raise ProviderConfigError(f"{where}: 'auto:{name}' already means the {AUTO_ALIASES[name]}"
                                  " strategy; give the profile another name")
    _no_unknown(t, where, {"chain", "strategy", "hedge"})  # hedge: core/hedging.py
    strategy = _choice(t, "strategy", STRATEGIES, where, None) if "strategy" in t else None
    return Profile(name, _chain(t, where), strategy)


def _provider(i: int, t: object) -> Provider:
    where = f"[[providers]] #{i + 1}"
    if not isinstance(t, Mapping):
        raise ProviderConfigError(f"{where} must be a table")
    name = t.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ProviderConfigError(f"{where}: name must be a string matching [a-z0-9-]+")
    where = f"[[providers]] {name!r}"
    _no_unknown(t, where, {"name", "base_url", "keys", "models", "cache_ttl", *_LIMITS})
    ttl = parse_ttl(t.get("cache_ttl", DEFAULT_CACHE_TTL_S))
    if ttl is None:
        raise ProviderConfigError(f"{where}: cache_ttl must be seconds or like '5m', '300s'")
    base_url = t.get("base_url")
    if not isinstance(base_url, str) or not re.fullmatch(r"https?://[^\s/]+(/\S*)?", base_url):
        raise ProviderConfigError(f"{where}: base_url must be an http(s) URL")
    limits = Limits(**{k: _opt_int(t, k, where) for k in _LIMITS})
    models = tuple(_model(where, j, m) for j, m in enumerate(_list(t, "models", where)))
    ids = [m.id for m in models]
    if not models:
        raise ProviderConfigError(f"{where}: needs at least one [[providers.models]]")
    if len(set(ids)) != len(ids):
        raise ProviderConfigError(f"{where}: a model id is listed twice")
    return Provider(name, base_url.rstrip("/"), _keys(t, where), limits, models, ttl)


def _node_key(i: int, t: object) -> NodeKey:
    where = f"[[node_keys]] #{i + 1}"
    if not isinstance(t, Mapping):
        raise ProviderConfigError(f"{where} must be a table")
    _no_unknown(t, where, {"node", "url", "key"})
    node, url = t.get("node"), t.get("url")
    if not isinstance(node, str) or not re.fullmatch(r"[A-Za-z0-9._:@/+-]{1,256}", node):
        raise ProviderConfigError(f"{where}: node must be a node id")
    if not isinstance(url, str) or not re.fullmatch(r"https?://[^\s/?#@]+(/[^\s?#]*)?", url):
        raise ProviderConfigError(f"{where}: url must be the node's http(s) URL")
    keys = _keys({"keys": [t.get("key")]}, f"[[node_keys]] {node!r}")
    return NodeKey(node, url.rstrip("/"), keys[0])


def _keys(t: Mapping[str, Any], where: str) -> tuple[str, ...]:
    keys = t.get("keys")
    if not isinstance(keys, list) or not keys:
        raise ProviderConfigError(f"{where}: keys must be a non-empty list of 'env:NAME' or "
                                  "'file:PATH' references")
    for j, ref in enumerate(keys):
        ok = isinstance(ref, str) and (_ENV_REF.fullmatch(ref) or
                                       (ref.startswith("file:") and len(ref) > 5))
        if not ok:  # the value is not echoed: it may be a pasted key
            raise ProviderConfigError(f"{where}: keys[{j}] must be 'env:NAME' or 'file:PATH' "
                                      "(a key is never written into the config itself)")
    if len(set(keys)) != len(keys):
        raise ProviderConfigError(f"{where}: a key reference is listed twice")
    return tuple(keys)


def _model(where: str, j: int, t: object) -> ProviderModel:
    here = f"{where} models[{j}]"
    if not isinstance(t, Mapping):
        raise ProviderConfigError(f"{here} must be a table")
    _no_unknown(t, here, {"id", "tier", "context", "price_in", "price_out", "monthly_tokens",
                          "capabilities", "api", "max_output", "price_cached_in",
                          "price_cache_write", "continue"})
    model_id = t.get("id")
    if not isinstance(model_id, str) or not model_id.strip() or model_id != model_id.strip():
        raise ProviderConfigError(f"{here}: id must be a non-empty string")
    here = f"{where} model {model_id!r}"
    tier = _choice(t, "tier", TIERS, here, None)
    if tier is None:
        raise ProviderConfigError(f"{here}: tier is required ({' | '.join(TIERS)})")
    cached = [None if k not in t else _number(t, k, here, 0.0, low=0.0)
              for k in ("price_cached_in", "price_cache_write")]
    return ProviderModel(model_id, tier, _opt_int(t, "context", here),
                         _number(t, "price_in", here, 0.0, low=0.0),
                         _number(t, "price_out", here, 0.0, low=0.0),
                         _opt_int(t, "monthly_tokens", here), _capabilities(t, here),
                         _choice(t, "api", APIS, here, "openai") or "openai",
                         _opt_int(t, "max_output", here), cached[0], cached[1],
                         _flag(t, "continue", here))


def _capabilities(t: Mapping[str, Any], where: str) -> frozenset[str]:
    """`capabilities = [...]` of a provider model; DEFAULT_CAPS when it says none."""
    if "capabilities" not in t:
        return DEFAULT_CAPS
    value = t["capabilities"]
    if not isinstance(value, list):
        raise ProviderConfigError(f"{where}: capabilities must be a list of names")
    try:
        return parse_caps(value, f"{where}: capabilities")
    except ValueError as exc:
        raise ProviderConfigError(str(exc)) from None


def _mesh_tier(name: object, t: object) -> str:
    where = f"[mesh.{name}]"
    if not isinstance(t, Mapping):
        raise ProviderConfigError(f"{where} must be a table")
    _no_unknown(t, where, {"tier", "context", "max_tokens", "clamp", "hedge"})
    return _choice(t, "tier", TIERS, where, DEFAULT_MESH_TIER) or DEFAULT_MESH_TIER


def _mesh_limits(name: object, t: Mapping[str, Any]) -> MeshLimits:
    """`context`, `max_tokens` and `clamp` of a `[mesh.MODEL]` table (checked by _mesh_tier)."""
    where = f"[mesh.{name}]"
    clamp = _flag(t, "clamp", where)
    context, max_tokens = _opt_int(t, "context", where), _opt_int(t, "max_tokens", where)
    if context is not None and max_tokens is not None and max_tokens > context:
        raise ProviderConfigError(f"{where}: max_tokens ({max_tokens}) cannot exceed context "
                                  f"({context})")
    if clamp and context is None and max_tokens is None:
        raise ProviderConfigError(f"{where}: clamp needs context or max_tokens to clamp to")
    return MeshLimits(context, max_tokens, clamp)


def _check_chains(cfg: ProvidersConfig) -> None:
    chains = [("[routing] chain", cfg.routing.chain)]
    chains += [(f"[profiles.{p.name}] chain", p.chain) for p in cfg.profiles]
    for where, chain in chains:
        for entry in chain:
            if cfg.names_provider(entry) and cfg.split_route(entry) is None:
                raise ProviderConfigError(f"{where}: {entry!r} names provider "
                                          f"{entry.partition('/')[0]!r}, which has no such model")
    if cfg.routing.profile is not None and cfg.profile(cfg.routing.profile) is None:
        raise ProviderConfigError(f"[routing] profile {cfg.routing.profile!r}: no "
                                  f"[profiles.{cfg.routing.profile}] table")


def unserved_chain_entries(cfg: ProvidersConfig) -> list[tuple[str, str]]:
    """(where, entry) for each chain entry that names no provider model and no declared
    `[mesh.NAME]` table: nothing may ever serve it (a typo), unless a mesh node announces a
    model of that name (issue 33). Chains are read in file order, `[routing]` first."""
    chains = [("[routing] chain", cfg.routing.chain)]
    chains += [(f"[profiles.{p.name}] chain", p.chain) for p in cfg.profiles]
    return [(where, entry) for where, chain in chains for entry in chain
            if cfg.split_route(entry) is None and entry not in cfg.mesh_limits]


def _check_aliases(cfg: ProvidersConfig) -> None:
    """An alias onto `auto:NAME` needs that strategy or profile; onto `provider/model`,
    that provider model (a mesh model's nodes come and go: never checked here)."""
    for alias in cfg.aliases.entries:
        where, target = f"[aliases] {alias.pattern!r}", alias.target
        name = target[5:] if target.startswith("auto:") else None
        if name is not None and name not in AUTO_ALIASES and cfg.profile(name) is None:
            raise ProviderConfigError(f"{where}: {target!r} names no strategy and no profile")
        if cfg.names_provider(target) and cfg.split_route(target) is None:
            raise ProviderConfigError(f"{where}: {target!r} names provider "
                                      f"{target.partition('/')[0]!r}, which has no such model")
