"""`meshroute mitm [meshroute flags] [mitmdump options]`: mitmdump with the addon loaded.

meshroute's own flags (`--nodes-file`, `--policy`, `--mdns/--no-mdns`, `--gossip-peer`, ...,
the settings table's, as for `meshroute serve`, plus `--side-port`) become `--set meshroute_*`;
everything else is mitmdump's (`--listen-port 8080`, `--mode reverse:http://…`, `-w flows`).
mitmdump listens on 127.0.0.1 unless `--listen-host` says otherwise. Runs mitmproxy in this
process, so it needs the `mitm` extra (its own venv: scripts/mitm-venv).

Ready for the composition root: `add_arguments(parser)` and `run(args, extra)`, where `extra`
are the arguments the parser did not know (the root must `parse_known_args` for this command).
`python -m meshroute_middleware.app.mitm.cli …` runs it alone.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from meshroute_middleware.app.mitm import options
from meshroute_middleware.app.settings import add_arguments as add_settings
from node_agent.serving import ListenError, listen_socket

ADDON_SCRIPT = Path(__file__).with_name("addon.py")
PROXY_PORT_DEFAULT = 8080  # mitmproxy's


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The settings table's flags the addon has, `--config`, and `--side-port`."""
    add_settings(parser, only=[o.name for o in options.table_options()])
    parser.add_argument("--side-port", dest="side_port", type=int, default=argparse.SUPPRESS,
                        help="port of the side server on 127.0.0.1 (/v1/routing, /dashboard); "
                        f"default {options.SIDE_PORT_DEFAULT}")
    parser.add_argument("--chat-hosts", dest="chat_hosts", action="append",
                        default=argparse.SUPPRESS, help="HOST,...: hosts whose chat requests "
                        "are routed over the mesh (default: every host)")


def set_args(values: Mapping[str, Any]) -> list[str]:
    """Parsed meshroute flags as mitmdump `--set meshroute_*=…` arguments."""
    out: list[str] = []
    for name, value in values.items():
        key = {"config": options.CONFIG, "side_port": options.SIDE_PORT,
               "chat_hosts": options.CHAT_HOSTS}.get(name, options.PREFIX + name)
        items = value if isinstance(value, list | tuple) else [value]
        if name == "chat_hosts":  # repeatable and comma-separated, as the table's lists
            items = [h.strip() for i in items for h in str(i).split(",") if h.strip()]
        for item in items:
            text = str(item).lower() if isinstance(item, bool) else str(item)
            out += ["--set", f"{key}={text}"]
    return out


def mitmdump_argv(args: argparse.Namespace, extra: Sequence[str]) -> list[str]:
    """The whole mitmdump command line (without the program name)."""
    values = {k: v for k, v in vars(args).items() if not k.startswith("_") and k != "command"}
    argv = ["-s", str(ADDON_SCRIPT), *set_args(values)]
    if not any(a == "--listen-host" or a.startswith("--listen-host=") for a in extra):
        argv += ["--listen-host", "127.0.0.1"]
    return argv + list(extra)


def run(args: argparse.Namespace, extra: Sequence[str] = ()) -> int:
    """Run mitmdump with the addon until it is stopped."""
    try:
        from mitmproxy.tools.main import mitmdump
    except ModuleNotFoundError:
        print("meshroute mitm: mitmproxy is not installed; it needs a venv of its own "
              "(scripts/mitm-venv, or pip install 'meshroute[mitm]')", file=sys.stderr)
        return 2
    problem = busy_port(args, extra)
    if problem:
        print(f"meshroute mitm: {problem}", file=sys.stderr)
        return 2
    mitmdump(mitmdump_argv(args, extra))
    return 0


def busy_port(args: argparse.Namespace, extra: Sequence[str]) -> str:
    """Why the proxy's or the side server's port cannot be listened on ('' when both can),
    checked before mitmdump starts, so that a port in use is one line."""
    proxy_host = _value(extra, "--listen-host") or "127.0.0.1"
    proxy_port = int(_value(extra, "--listen-port", "-p") or PROXY_PORT_DEFAULT)
    side_port = int(getattr(args, "side_port", options.SIDE_PORT_DEFAULT))
    for host, port, flag in ((proxy_host, proxy_port, "--listen-port"),
                             ("127.0.0.1", side_port, "--side-port")):
        if port == 0:
            continue
        try:
            listen_socket(host, port).close()
        except ListenError as exc:
            return f"{exc.strerror}; choose another port with {flag}"
    return ""


def _value(argv: Sequence[str], *names: str) -> str | None:
    """The last value given to one of `names` (`--name V` or `--name=V`) in argv."""
    found = None
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                found = argv[i + 1]
            elif arg.startswith(name + "="):
                found = arg[len(name) + 1:]
    return found


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m meshroute_middleware.app.mitm.cli`."""
    parser = argparse.ArgumentParser(prog="meshroute mitm", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args, extra = parser.parse_known_args(argv)
    return run(args, extra)


if __name__ == "__main__":
    sys.exit(main())
