"""The addon's mitmproxy options, generated from the project's one settings table.

Every row of `app.options.OPTIONS` that has a CLI flag becomes `meshroute_<name>` (so
`--set meshroute_nodes_file=nodes.json`, `--set meshroute_policy=adr0021`,
`--set meshroute_gossip_peers=10.0.0.2:7946`). They are registered as optional strings (a
sequence for repeatable ones): mitmproxy's `--set` cannot parse floats, and leaving a value unset
(None) lets the TOML file (`meshroute_config`) and `MESHROUTE_*` variables apply beneath it, as
for `meshroute serve`. Conversion and range checks are the table's own (`load_settings`).

Not generated: `host`/`port` (mitmproxy listens itself; the side server has
`meshroute_side_port`), `log_level` (mitmproxy's `termlog_verbosity`), and options without a
flag (secrets: environment or file only, never a `--set` that shows up in a process list).

The table lives in `meshroute_middleware/settings.py` today; it moves to
`meshroute_middleware/app/settings.py` in the composition-package restructuring: change the one
import below.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any, Optional

from meshroute_middleware.app.options import OPTIONS, Option
from meshroute_middleware.app.settings import ServeSettings, load_settings
from meshroute_middleware.core.config import RouterConfig

PREFIX = "meshroute_"
SIDE_PORT = "meshroute_side_port"
SIDE_PORT_DEFAULT = 8089  # beside mitmproxy's own 8080
CONFIG = "meshroute_config"
CHAT_HOSTS = "meshroute_chat_hosts"
NOT_FOR_MITM = frozenset({"host", "port", "log_level"})


def table_options() -> list[Option]:
    """The settings rows the addon exposes."""
    return [o for o in OPTIONS if o.flags and o.name not in NOT_FOR_MITM]


def _defaults() -> dict[str, Any]:
    serve = ServeSettings()
    out = {f.name: getattr(serve.router, f.name) for f in fields(RouterConfig)}
    out.update({f.name: getattr(serve, f.name) for f in fields(ServeSettings)
                if f.name != "router"})
    return out


def register(loader: Any) -> None:
    """Add every option to mitmproxy's loader (in the addon's `load` hook)."""
    defaults = _defaults()
    for opt in table_options():
        default = defaults.get(opt.name)
        shown = ",".join(default) if isinstance(default, tuple) else default
        help_text = f"{opt.help} (meshroute {opt.flags[0]}; default: {shown})"
        if opt.many:
            loader.add_option(PREFIX + opt.name, Sequence[str], [], help_text)
        else:
            loader.add_option(PREFIX + opt.name, Optional[str], None, help_text)  # noqa: UP045
    loader.add_option(CONFIG, Optional[str], None,  # noqa: UP045
                      "meshroute TOML configuration file (also MESHROUTE_CONFIG)")
    loader.add_option(CHAT_HOSTS, Sequence[str], [],
                      "hosts whose chat requests the addon routes over the mesh ('api.openai.com',"
                      " '.example.com': it and its subdomains); default: every host, so a node "
                      "announcing a model takes chat requests meant for any upstream")
    loader.add_option(SIDE_PORT, int, SIDE_PORT_DEFAULT,
                      "port of meshroute's side server on 127.0.0.1 (/v1/routing, /metrics, "
                      "/dashboard, the relay); 0: any free port")


def given(options: Any) -> dict[str, Any]:
    """The table values set on mitmproxy's options (unset ones are absent)."""
    out: dict[str, Any] = {}
    for opt in table_options():
        value = getattr(options, PREFIX + opt.name)
        if opt.many:
            if value:
                out[opt.name] = list(value)
        elif value is not None:
            out[opt.name] = value
    config = getattr(options, CONFIG)
    if config:
        out["config"] = config
    return out


def settings_from(options: Any, environ: Mapping[str, str] | None = None) -> ServeSettings:
    """ServeSettings from defaults < TOML < environment < `--set meshroute_*`
    (SettingsError naming the source when a value is bad)."""
    return load_settings(given(options), environ or {})
