"""The one `Option` table of `meshroute serve`: every option's field, type, CLI flags,
environment variables and --help group. `settings.py` loads and checks what it names.

ADR-0021's names (`--route-explore-share`, `MESHNET_ROUTE_EXPLORE_SHARE`, ...) are aliases of
our own. New options go in this table, nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from meshroute_middleware.core.policies import POLICIES

GC_MODES = ("paced", "python")
LOG_FORMATS = ("text", "json")  # app/logs.py
STATE_FILE_NAME = "meshroute/state.db"  # under the user's state directory (XDG base dirs)

# --help's groups, in the order shown: an option names its group (Option.group)
LISTENING, NODES, FORWARDING, GOSSIP, STATE, PROVIDERS, POLICY, TRACES = (
    "listening", "nodes and discovery", "forwarding limits", "gossip", "state", "providers",
    "policy", "traces")
GROUPS: dict[str, str] = {
    LISTENING: "the HTTP server: address, request limits, processes, logs",
    NODES: "where nodes come from (mDNS, --nodes-file, POST /v1/nodes) and who may add them",
    FORWARDING: "how long a route's head may take, and what it may see",
    GOSSIP: "learned statistics shared with peer trackers",
    STATE: "what a restart keeps",
    PROVIDERS: "provider routes: the [routing] and [[providers]] tables of --config",
    POLICY: "how a route is chosen",
    TRACES: "OpenTelemetry traces over OTLP/HTTP (pip install 'meshroute[otlp]'; "
            "docs/observability.md)",
}


@dataclass(frozen=True, slots=True)
class Option:
    """One configuration option: where it comes from, what it becomes, where --help shows
    it (`group`, one of GROUPS) and, for a secret, that its variable is the way to set it."""

    name: str
    kind: type
    flags: tuple[str, ...]
    env: tuple[str, ...]
    help: str
    many: bool = False  # repeatable flag / comma-separated env value
    group: str = field(kw_only=True)
    secret: bool = field(default=False, kw_only=True)  # a flag's value shows in `ps`
    default: str | None = field(default=None, kw_only=True)  # --help's, when not the field's
    choices: tuple[str, ...] = field(default=(), kw_only=True)  # --help lists them


OPTIONS: tuple[Option, ...] = (
    Option("policy", str, ("--policy",), ("MESHROUTE_POLICY",),
           "route-selection policy by name", group=POLICY, choices=tuple(POLICIES)),
    Option("explore_share", float, ("--route-explore-share", "--explore-share"),
           ("MESHROUTE_EXPLORE_SHARE", "MESHNET_ROUTE_EXPLORE_SHARE"),
           "probability of scouting an unproven route (ADR-0021)", group=POLICY),
    Option("weight_alpha", float, ("--route-weight-alpha", "--weight-alpha"),
           ("MESHROUTE_WEIGHT_ALPHA", "MESHNET_ROUTE_WEIGHT_ALPHA"),
           "exploit weight exponent: P(route) ∝ tps^alpha", group=POLICY),
    Option("half_life_s", float, ("--route-stats-half-life", "--half-life"),
           ("MESHROUTE_HALF_LIFE", "MESHNET_ROUTE_STATS_HALF_LIFE"),
           "half-life of sample mass, seconds", group=POLICY),
    Option("min_sample_tokens", int, ("--min-sample-tokens",),
           ("MESHROUTE_MIN_SAMPLE_TOKENS", "MESHNET_ROUTE_MIN_SAMPLE_TOKENS"),
           "completions with fewer tokens are no tps sample", group=POLICY),
    Option("host", str, ("--host",), ("MESHROUTE_HOST",), "address to listen on", group=LISTENING),
    Option("port", int, ("--port",), ("MESHROUTE_PORT",), "port to listen on (0: any free)",
           group=LISTENING),
    Option("seed", int, ("--seed",), ("MESHROUTE_SEED",), "seed of the routing rng", group=POLICY),
    Option("tracker_id", str, ("--tracker-id",), ("MESHROUTE_TRACKER_ID",),
           "this tracker's origin id in gossip", group=GOSSIP,
           default="the state file's, else a new tracker-<12 hex digits>"),
    Option("node_token", str, ("--node-token",), ("MESHROUTE_NODE_TOKEN",),
           "bearer token required by /v1/nodes writes", group=NODES, secret=True),
    Option("max_nodes", int, ("--max-nodes",), ("MESHROUTE_MAX_NODES",),
           "most nodes this tracker holds over every model; new ones past it are refused",
           group=NODES),
    Option("nodes_file", str, ("--nodes-file",), ("MESHROUTE_NODES_FILE",),
           "JSON file listing a static mesh", group=NODES),
    Option("max_body_bytes", int, ("--max-body-bytes",), ("MESHROUTE_MAX_BODY_BYTES",),
           "largest request body accepted", group=LISTENING),
    Option("max_messages", int, ("--max-messages",), ("MESHROUTE_MAX_MESSAGES",),
           "most messages (or Responses input items) a request may hold (413 past it)",
           group=LISTENING),
    Option("max_content_parts", int, ("--max-content-parts",),
           ("MESHROUTE_MAX_CONTENT_PARTS",),
           "most content parts a request's messages may hold in all (413 past it)",
           group=LISTENING),
    Option("max_json_values", int, ("--max-json-values",), ("MESHROUTE_MAX_JSON_VALUES",),
           "most JSON values (outside strings) a request body may hold (413 past it)",
           group=LISTENING),
    Option("connect_timeout_s", float, ("--connect-timeout",), ("MESHROUTE_CONNECT_TIMEOUT",),
           "seconds to connect to a route head", group=FORWARDING),
    Option("first_byte_timeout_s", float, ("--first-byte-timeout",),
           ("MESHROUTE_FIRST_BYTE_TIMEOUT",), "seconds to wait for a head's first byte",
           group=FORWARDING),
    Option("idle_timeout_s", float, ("--idle-timeout",), ("MESHROUTE_IDLE_TIMEOUT",),
           "seconds a head may stay silent between two chunks of an answer", group=FORWARDING),
    Option("hedge_after", str, ("--hedge-after",), ("MESHROUTE_HEDGE_AFTER",),
           "start the next route too when a first byte is late: a quantile of the route's "
           "learned first-byte times ('p95') or a delay ('250ms'); 'off' (TOML [routing] "
           "hedge)", group=FORWARDING, default="off"),
    Option("hedge_max_share", float, ("--hedge-max-share",), ("MESHROUTE_HEDGE_MAX_SHARE",),
           "most hedges per request, over the gateway's requests", group=FORWARDING),
    Option("request_timeout_s", float, ("--request-timeout",), ("MESHROUTE_REQUEST_TIMEOUT",),
           "total seconds a chat request may take, every fallback included", group=FORWARDING),
    Option("body_timeout_s", float, ("--body-timeout",), ("MESHROUTE_BODY_TIMEOUT",),
           "seconds for a request body to arrive (else 408)", group=LISTENING),
    Option("header_timeout_s", float, ("--header-timeout",), ("MESHROUTE_HEADER_TIMEOUT",),
           "seconds for a request head to arrive (else 408)", group=LISTENING),
    Option("max_connections", int, ("--max-connections",), ("MESHROUTE_MAX_CONNECTIONS",),
           "open client connections at most (503 past it)", group=LISTENING),
    Option("max_header_bytes", int, ("--max-header-bytes",), ("MESHROUTE_MAX_HEADER_BYTES",),
           "largest request head accepted (431 past it)", group=LISTENING),
    Option("max_headers", int, ("--max-headers",), ("MESHROUTE_MAX_HEADERS",),
           "most header lines a request may have (431 past it)", group=LISTENING),
    Option("forward_headers", str, ("--forward-header",), ("MESHROUTE_FORWARD_HEADERS",),
           "client credential header a node may see (repeatable)", many=True,
           group=FORWARDING),
    Option("node_networks", str, ("--node-networks",), ("MESHROUTE_NODE_NETWORKS",),
           "CIDR,...: node URLs must point into these networks", many=True, group=NODES),
    Option("allowed_origins", str, ("--allowed-origins",), ("MESHROUTE_ALLOWED_ORIGINS",),
           "ORIGIN,...: browser origins besides the gateway's own that may send POSTs "
           "(chat included; default: none)", many=True, group=LISTENING),
    Option("allowed_hosts", str, ("--allowed-hosts",), ("MESHROUTE_ALLOWED_HOSTS",),
           "HOST,...: Host names served besides this machine's, its addresses and loopback "
           "('*': any; '.example.com': it and its subdomains)", many=True, group=LISTENING),
    Option("mdns", bool, ("--mdns",), ("MESHROUTE_MDNS",), "discover nodes over mDNS", group=NODES),
    Option("mdns_interfaces", str, ("--mdns-interfaces",), ("MESHROUTE_MDNS_INTERFACES",),
           "interfaces for mDNS: 'all' or comma-separated addresses", group=NODES),
    Option("mesh_secret", str, ("--mesh-secret",), ("MESHROUTE_MESH_SECRET",),
           "shared secret: node records must carry its HMAC", group=NODES, secret=True),
    Option("health_interval_s", float, ("--health-interval",), ("MESHROUTE_HEALTH_INTERVAL",),
           "seconds between node health probes", group=NODES),
    Option("gossip_listen", str, ("--gossip-listen",), ("MESHROUTE_GOSSIP_LISTEN",),
           "HOST:PORT to gossip on", group=GOSSIP),
    Option("gossip_peers", str, ("--gossip-peer",), ("MESHROUTE_GOSSIP_PEERS",),
           "HOST:PORT of a peer tracker (repeatable)", many=True, group=GOSSIP),
    Option("gossip_interval_s", float, ("--gossip-interval",), ("MESHROUTE_GOSSIP_INTERVAL",),
           "seconds between gossip rounds", group=GOSSIP),
    Option("gossip_fanout", int, ("--gossip-fanout",), ("MESHROUTE_GOSSIP_FANOUT",),
           "peers contacted per gossip round", group=GOSSIP),
    Option("gossip_secret_file", str, ("--gossip-secret-file",),
           ("MESHROUTE_GOSSIP_SECRET_FILE",), "file holding the gossip secret", group=GOSSIP),
    Option("gossip_secret", str, (), ("MESHROUTE_GOSSIP_SECRET",), "gossip secret",
           group=GOSSIP, secret=True),
    Option("insecure_gossip", bool, ("--insecure-gossip",), ("MESHROUTE_INSECURE_GOSSIP",),
           "allow a non-loopback --gossip-listen without a gossip secret", group=GOSSIP),
    Option("log_level", str, ("--log-level",), ("MESHROUTE_LOG_LEVEL",), "logging level",
           group=LISTENING),
    Option("log_format", str, ("--log-format",), ("MESHROUTE_LOG_FORMAT",),
           "every log line as 'text' or as one JSON object ('json')", group=LISTENING,
           choices=LOG_FORMATS),
    Option("drain_timeout_s", float, ("--drain-timeout",), ("MESHROUTE_DRAIN_TIMEOUT",),
           "seconds SIGTERM lets the streams in flight finish before they are cut",
           group=LISTENING),
    Option("state_file", str, ("--state-file",), ("MESHROUTE_STATE_FILE",),
           "SQLite file of learned state, restored at start; ':memory:' keeps nothing",
           group=STATE, default=f"none; with provider tables $XDG_STATE_HOME/{STATE_FILE_NAME}"
           f" (else ~/.local/state/{STATE_FILE_NAME}), created 0600"),
    Option("admin_token", str, ("--admin-token",), ("MESHROUTE_ADMIN_TOKEN",),
           "bearer token required by POST /v1/cooldowns/clear (default: the node token)",
           group=PROVIDERS, secret=True),
    Option("anonymous_clients", bool, ("--anonymous-clients",),
           ("MESHROUTE_ANONYMOUS_CLIENTS",),
           "serve provider routes on a non-loopback address with no [[clients]]: anyone who "
           "reaches the port can spend the provider keys", group=PROVIDERS),
    Option("workers", int, ("--workers",), ("MESHROUTE_WORKERS",),
           "processes serving the one port, sharing learned statistics over loopback gossip",
           group=LISTENING),
    Option("limits_store", str, ("--limits-store",), ("MESHROUTE_LIMITS_STORE",),
           "where provider key limits are shared (TOML [limits] store): 'redis://HOST:PORT/DB' "
           "across trackers, 'state-file' (the default of --workers N), 'local'",
           group=PROVIDERS),
    Option("usage_retention_days", int, ("--usage-retention-days",),
           ("MESHROUTE_USAGE_RETENTION_DAYS",),
           "days the Redis usage ledger keeps a row after its UTC day (TOML [limits] "
           "usage_retention_days)", group=PROVIDERS),
    Option("gc", str, ("--gc",), ("MESHROUTE_GC",),
           "garbage collector: 'paced' (short pauses, full collections when cheap) or "
           "'python' (CPython's own, on a frozen start-up heap)", group=LISTENING,
           choices=GC_MODES),
    Option("otlp_endpoint", str, ("--otlp-endpoint",),
           ("MESHROUTE_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"),
           "export a span per routed request to this OTLP/HTTP collector (a base URL: "
           "/v1/traces is added)", group=TRACES),
    Option("otlp_headers", str, (), ("MESHROUTE_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS"),
           "headers sent with every export, 'name=value,name=value'", group=TRACES,
           secret=True),
    Option("otlp_service_name", str, ("--otlp-service-name",),
           ("MESHROUTE_OTLP_SERVICE_NAME", "OTEL_SERVICE_NAME"),
           "the spans' service.name", group=TRACES),
    Option("otlp_content", bool, ("--otlp-content",), ("MESHROUTE_OTLP_CONTENT",),
           "put the messages and the answer in the spans (off: never)", group=TRACES),
)
