"""Configuration for `meshroute serve`, built in one place: defaults < TOML file < env < CLI.

Every option has one row in app/options.py's table: its field, type, CLI flags and
environment variables; here its default (a ServeSettings field), its checks, --help and the
loading. Library code never reads os.environ: only `load_settings` looks at the mapping given.
"""

from __future__ import annotations

import argparse
import importlib.util
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from gossip.peers import parse_address
from gossip.service import GossipConfig, load_secret
from meshroute_middleware.app.edge import EdgeLimits
from meshroute_middleware.app.options import GC_MODES, LOG_FORMATS, STATE_FILE_NAME
from meshroute_middleware.app.options import GROUPS as GROUPS  # re-exported: importers of
from meshroute_middleware.app.options import OPTIONS as OPTIONS  # the table by its old path
from meshroute_middleware.app.options import Option as Option
from meshroute_middleware.chat.attempts import DEFAULT_REQUEST_TIMEOUT_S
from meshroute_middleware.core.clients import ClientConfigError, ClientTable, parse_clients
from meshroute_middleware.core.config import RouterConfig
from meshroute_middleware.core.errors import MeshRouteError
from meshroute_middleware.core.hedging import (
    DEFAULT_MAX_SHARE,
    HedgeAfter,
    HedgePlan,
    HedgeSyntaxError,
    hedge_keys,
    parse_hedge_after,
)
from meshroute_middleware.core.providers.config import TABLES as PROVIDER_TABLES
from meshroute_middleware.core.providers.config import (
    ProviderConfigError,
    ProvidersConfig,
    parse_providers_config,
)
from meshroute_middleware.forwarding.client import ForwardTimeouts
from meshroute_middleware.http.guard import GuardConfig
from meshroute_middleware.http.request import DEFAULT_BODY_TIMEOUT_S
from meshroute_middleware.http.shape import (
    DEFAULT_MAX_CONTENT_PARTS,
    DEFAULT_MAX_JSON_VALUES,
    DEFAULT_MAX_MESSAGES,
    BodyLimits,
)
from meshroute_middleware.mesh import DEFAULT_MAX_NODES
from meshroute_middleware.middleware import DEFAULT_MAX_BODY_BYTES, MiddlewareConfig
from meshroute_middleware.state.limits import RETENTION_DAYS
from node_agent.discovery import HEALTH_INTERVAL_S

OTLP_INSTALL = "pip install 'meshroute[otlp]'"  # pyproject's extra (docs/observability.md)
# SIGTERM lets streams in flight finish this long (issue 33): a long answer of a slow node
# (~1,000 tokens at ~40 tokens/s) fits; systemd's default stop timeout (90 s) is above it
DEFAULT_DRAIN_TIMEOUT_S = 30.0
LIMITS_MODES = ("local", "state-file")  # or a redis:// URL
_TIMEOUTS = ForwardTimeouts()  # the defaults live with the forwarder (health: with discovery)
_EDGE = EdgeLimits()  # the HTTP edge's defaults live with its protocol
_GOSSIP = GossipConfig()  # gossip's with gossip


@dataclass(frozen=True, slots=True)
class ServeSettings:
    """Everything `meshroute serve` needs; RouterConfig nested."""

    router: RouterConfig = field(default_factory=RouterConfig)
    host: str = "127.0.0.1"
    port: int = 8080
    seed: int | None = None
    tracker_id: str | None = None
    node_token: str | None = None
    nodes_file: str | None = None
    max_nodes: int = DEFAULT_MAX_NODES
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_messages: int = DEFAULT_MAX_MESSAGES  # http/shape.py: a body's shape (issue 32)
    max_content_parts: int = DEFAULT_MAX_CONTENT_PARTS
    max_json_values: int = DEFAULT_MAX_JSON_VALUES
    connect_timeout_s: float = _TIMEOUTS.connect_s
    first_byte_timeout_s: float = _TIMEOUTS.first_byte_s
    idle_timeout_s: float = _TIMEOUTS.idle_s
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    hedge_after: str | None = None  # chat/hedge.py: core.hedging.parse_hedge_after's
    hedge_max_share: float = DEFAULT_MAX_SHARE
    hedges: Mapping[str, HedgeAfter | None] = field(default_factory=dict)  # by model, chain
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    header_timeout_s: float = _EDGE.header_timeout_s
    max_connections: int = _EDGE.max_connections
    max_header_bytes: int = _EDGE.max_header_bytes
    max_headers: int = _EDGE.max_headers
    forward_headers: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()  # http/guard.py: browsers' writes (docs/security.md)
    allowed_hosts: tuple[str, ...] = ()  # http/guard.py: the DNS-rebinding defence
    mdns: bool = True
    mdns_interfaces: str = "all"
    mesh_secret: str | None = None
    health_interval_s: float = HEALTH_INTERVAL_S
    gossip_listen: str | None = None
    gossip_peers: tuple[str, ...] = ()
    gossip_interval_s: float = _GOSSIP.interval_s
    gossip_fanout: int = _GOSSIP.fanout
    gossip_secret_file: str | None = None
    gossip_secret: str | None = None
    insecure_gossip: bool = False
    log_level: str = "info"
    log_format: str = "text"  # app/logs.py: "json", one object a line
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S  # app/run.py: SIGTERM's drain
    state_file: str | None = None  # load_settings: default_state_file() with provider tables
    admin_token: str | None = None
    providers: ProvidersConfig | None = None  # the file's provider tables, when it has any
    clients: tuple[ClientTable, ...] = ()  # the file's [[clients]] (keys still references)
    anonymous_clients: bool = False  # app/config.py: no [[clients]] on a network listener
    workers: int = 1
    gc: str = "paced"  # app/gcpace.py; "python": CPython's own collector (serve.settle_heap)
    limits_store: str | None = None  # None: "local", "state-file" with --workers N
    usage_retention_days: int = RETENTION_DAYS  # Redis ledger rows expire after this
    otlp_endpoint: str | None = None  # telemetry/tracing.py: None exports nothing
    otlp_headers: str | None = None
    otlp_service_name: str = "meshroute"
    otlp_content: bool = False
    # a --workers worker (app/workers.py, no option): HTTP node writes shared through the
    # state file (app/nodeshare.py)
    share_node_writes: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if self.max_nodes <= 0:
            raise ValueError(f"max_nodes must be positive, got {self.max_nodes}")
        if self.max_body_bytes <= 0:
            raise ValueError(f"max_body_bytes must be positive, got {self.max_body_bytes}")
        for name in ("connect_timeout_s", "first_byte_timeout_s", "health_interval_s",
                     "gossip_interval_s", "idle_timeout_s", "request_timeout_s",
                     "body_timeout_s", "header_timeout_s", "max_connections",
                     "max_header_bytes", "max_headers", "max_messages", "max_content_parts",
                     "max_json_values", "drain_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not 1 <= self.workers <= 64:
            raise ValueError(f"workers must be in 1..64, got {self.workers}")
        if self.log_format not in LOG_FORMATS:
            raise ValueError(f"log_format must be one of {', '.join(LOG_FORMATS)}, "
                             f"got {self.log_format!r}")
        if self.gc not in GC_MODES:
            raise ValueError(f"gc must be one of {', '.join(GC_MODES)}, got {self.gc!r}")
        if self.limits_store is not None and not (
                self.limits_store in LIMITS_MODES
                or self.limits_store.startswith(("redis://", "rediss://"))):
            raise ValueError("limits_store must be redis://HOST:PORT/DB, 'state-file' or "
                             f"'local', got {self.limits_store!r}")
        if self.usage_retention_days < 1:
            raise ValueError("usage_retention_days must be >= 1, got "
                             f"{self.usage_retention_days}")
        self.hedge_plan()  # HedgeSyntaxError (a ValueError) names a bad one
        if self.gossip_fanout < 1:
            raise ValueError(f"gossip_fanout must be >= 1, got {self.gossip_fanout}")
        if self.otlp_endpoint and not otlp_installed():
            raise ValueError("traces need the OpenTelemetry SDK: "
                             f"{OTLP_INSTALL}")

    @property
    def gossip(self) -> bool:
        """Whether this tracker gossips at all."""
        return bool(self.gossip_listen or self.gossip_peers)

    def middleware(self) -> MiddlewareConfig:
        """The gateway's middleware options."""
        return MiddlewareConfig(mode="forward", max_body_bytes=self.max_body_bytes,
                                forward_headers=self.forward_headers,
                                request_timeout_s=self.request_timeout_s,
                                body_timeout_s=self.body_timeout_s,
                                body_limits=BodyLimits(self.max_messages,
                                                       self.max_content_parts,
                                                       self.max_json_values))

    def hedge_plan(self) -> HedgePlan:
        """Which requests hedge, when, and how many may (chat/hedge.py)."""
        return HedgePlan(parse_hedge_after(self.hedge_after or ""), self.hedges,
                         self.hedge_max_share)

    def guard(self) -> GuardConfig:
        """What the request guard allows: origins, Host names, and the listening address."""
        return GuardConfig(self.allowed_origins, self.allowed_hosts, self.host)

    def forward_timeouts(self) -> ForwardTimeouts:
        """How long the forwarder waits for a head."""
        return ForwardTimeouts(self.connect_timeout_s, self.first_byte_timeout_s,
                               self.idle_timeout_s)

    def gossip_config(self) -> GossipConfig | None:
        """Gossip's config (None: this tracker does not gossip); the secret is read now.
        ValueError names a bad address or secret file; InsecureGossipError an exposed
        listener without a secret."""
        if not self.gossip:
            return None
        return GossipConfig(
            parse_address(self.gossip_listen) if self.gossip_listen else None,
            tuple(parse_address(p) for p in self.gossip_peers), self.gossip_interval_s,
            self.gossip_fanout, load_secret(self.gossip_secret_file, self.gossip_secret),
            insecure=self.insecure_gossip).checked()

    def edge_limits(self) -> EdgeLimits:
        """The HTTP server's limits (uvicorn's protocol, app.edge)."""
        return EdgeLimits(self.max_connections, self.max_header_bytes, self.max_headers,
                          self.header_timeout_s)


def otlp_installed() -> bool:
    """Whether the `otlp` extra is installed (nothing of it is imported here)."""
    try:
        return all(importlib.util.find_spec(name) is not None for name in (
            "opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http"))
    except (ImportError, ValueError, AttributeError):  # a parent package missing or blocked
        return False


class SettingsError(MeshRouteError, ValueError):
    """A configuration value is malformed; the message names its source."""


def add_arguments(parser: argparse.ArgumentParser, only: Sequence[str] | None = None) -> None:
    """Add every option's flags to a parser, in its --help group, each with its default and
    its environment variables; unset flags stay absent from the namespace."""
    chosen = [o for o in OPTIONS if only is None or o.name in only]
    for title, description in GROUPS.items():
        members = [o for o in chosen if o.group == title]
        if not members:
            continue
        env_only = [f"{', '.join(o.env)}: {o.help}" for o in members if not o.flags]
        if env_only:  # no flag (a secret): its variable is the only way to set it
            description += "; environment only: " + "; ".join(env_only)
        group = parser.add_argument_group(title, description)
        for opt in members:
            if opt.flags:
                _add_option(group, opt)
    parser.add_argument("--config", dest="config", default=argparse.SUPPRESS,
                        help="TOML configuration file; env MESHROUTE_CONFIG")


def _add_option(group: argparse._ArgumentGroup, opt: Option) -> None:
    text = option_help(opt).replace("%", "%%")
    if opt.kind is bool:
        group.add_argument(*opt.flags, dest=opt.name, action=argparse.BooleanOptionalAction,
                           default=argparse.SUPPRESS, help=text)
    elif opt.many:
        group.add_argument(*opt.flags, dest=opt.name, action="append",
                           default=argparse.SUPPRESS, help=text)
    else:
        group.add_argument(*opt.flags, dest=opt.name, type=opt.kind, default=argparse.SUPPRESS,
                           help=text, metavar=_metavar(opt))


def _metavar(opt: Option) -> str:
    if opt.choices:
        return "{" + ",".join(opt.choices) + "}"
    return "SECONDS" if opt.name.endswith("_s") else opt.flags[0][2:].upper().replace("-", "_")


def option_help(opt: Option) -> str:
    """An option's --help text: what it does, its default and its variables (a secret's
    variable first: a flag's value is visible to every user of the machine in `ps`)."""
    env = ", ".join(opt.env)
    if opt.secret:
        return f"set {env} rather than the flag (visible in ps); {opt.help}"
    return f"{opt.help} (default: {default_text(opt)}; env {env})"


def default_text(opt: Option) -> str:
    """The default of an option as --help says it."""
    if opt.default is not None:
        return opt.default
    router_names = {f.name for f in fields(RouterConfig)}
    value = getattr(RouterConfig() if opt.name in router_names else ServeSettings(), opt.name)
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None or value == ():
        return "none"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _convert(opt: Option, raw: Any, source: str) -> Any:
    if opt.many:
        items = [raw] if isinstance(raw, str) else raw
        if not isinstance(items, list | tuple):
            raise SettingsError(f"{source}: {opt.name} must be a list")
        parts = [p for i in items for p in str(i).split(",")]  # 'a,b' and repeated flags
        return tuple(p.strip() for p in parts if p.strip())
    if opt.kind is bool and isinstance(raw, str):
        low = raw.strip().lower()
        if low not in {"1", "0", "true", "false", "yes", "no", "on", "off"}:
            raise SettingsError(f"{source}: {opt.name} must be a boolean, got {raw!r}")
        return low in {"1", "true", "yes", "on"}
    try:
        if opt.kind is int and isinstance(raw, float):
            raise TypeError
        return opt.kind(raw)
    except (TypeError, ValueError):
        raise SettingsError(f"{source}: {opt.name} must be {opt.kind.__name__}, "
                            f"got {raw!r}") from None


def _from_file(path: str) -> tuple[dict[str, tuple[Any, str]], ProvidersConfig | None,
                                   tuple[ClientTable, ...]]:
    """The file's options, its provider tables parsed (None when it has none) and its
    [[clients]]."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"cannot read config file {path}: {exc}") from exc
    try:
        clients = parse_clients(data.pop("clients")) if "clients" in data else ()
    except ClientConfigError as exc:
        raise SettingsError(f"{path}: {exc}") from exc
    tables = {k: data.pop(k) for k in PROVIDER_TABLES if k in data}
    routing = tables.get("routing")
    if isinstance(routing, dict) and "hedge" in routing:  # the file's default hedge
        data.setdefault("hedge_after", routing["hedge"])
    try:
        data["hedges"] = hedge_keys(tables)
    except HedgeSyntaxError as exc:
        raise SettingsError(f"{path}: {exc}") from exc
    limits = data.pop("limits", {})  # [limits] store = "redis://…", usage_retention_days
    if not isinstance(limits, dict) or set(limits) - {"store", "usage_retention_days"}:
        raise SettingsError(f"{path}: [limits] takes store and usage_retention_days")
    if "store" in limits:
        data["limits_store"] = limits["store"]
    if "usage_retention_days" in limits:
        data["usage_retention_days"] = limits["usage_retention_days"]
    providers = None
    if tables:
        try:
            providers = parse_providers_config(tables)
        except ProviderConfigError as exc:
            raise SettingsError(f"{path}: {exc}") from exc
    hedges = data.pop("hedges")
    flat = {**data.get("router", {}), **{k: v for k, v in data.items() if k != "router"}}
    known = {o.name: o for o in OPTIONS}
    unknown = sorted(set(flat) - set(known))
    if unknown:
        raise SettingsError(f"{path}: unknown option(s) {', '.join(unknown)}")
    return ({**{k: (_convert(known[k], v, path), path) for k, v in flat.items()},
             "hedges": (hedges, path)}, providers, clients)


def _from_env(environ: Mapping[str, str]) -> dict[str, tuple[Any, str]]:
    out: dict[str, tuple[Any, str]] = {}
    for opt in OPTIONS:
        for name in reversed(opt.env):  # the first name listed (ours) wins
            if environ.get(name, "") != "":
                out[opt.name] = (_convert(opt, environ[name], name), name)
    return out


def load_settings(cli: Mapping[str, Any] | None = None,
                  environ: Mapping[str, str] | None = None) -> ServeSettings:
    """Build settings: defaults, then the TOML file, then the environment, then CLI flags."""
    cli, environ = dict(cli or {}), dict(environ or {})
    values: dict[str, tuple[Any, str]] = {}  # option -> (value, where it came from)
    config_file = cli.pop("config", None) or environ.get("MESHROUTE_CONFIG")
    providers: ProvidersConfig | None = None
    clients: tuple[ClientTable, ...] = ()
    if config_file:
        from_file, providers, clients = _from_file(config_file)
        values.update(from_file)
    values.update(_from_env(environ))
    known = {o.name: o for o in OPTIONS}
    for key, raw in cli.items():
        if key in known:
            flag = known[key].flags[0] if known[key].flags else key
            values[key] = (_convert(known[key], raw, flag), flag)
    router_names = {f.name for f in fields(RouterConfig)}
    for key, (value, source) in values.items():  # range checks, naming the source
        try:
            if key in router_names:
                RouterConfig(**{key: value})
            else:
                replace(ServeSettings(), **{key: value})
        except ValueError as exc:
            raise SettingsError(f"{source}: {exc}") from exc
    router = RouterConfig(**{k: v for k, (v, _) in values.items() if k in router_names})
    serve = {k: v for k, (v, _) in values.items() if k not in router_names}
    if providers is not None and "state_file" not in serve:  # quotas and cooldowns persist
        serve["state_file"] = default_state_file(environ)
    return replace(ServeSettings(), router=router, providers=providers, clients=clients,
                   **serve)


def default_state_file(environ: Mapping[str, str]) -> str:
    """The state file in the user's state directory: $XDG_STATE_HOME/meshroute/state.db
    (an absolute XDG_STATE_HOME only, as the XDG base directory spec says), else
    $HOME/.local/state/meshroute/state.db."""
    base = environ.get("XDG_STATE_HOME", "")
    if not Path(base).is_absolute():
        home = environ.get("HOME") or str(Path.home())
        base = str(Path(home) / ".local" / "state")
    return str(Path(base) / STATE_FILE_NAME)
