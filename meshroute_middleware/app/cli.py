"""The `meshroute` command: serve, node, bench, demo, mitm, keys, limits; each subcommand's module
adds its flags and runs it."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from importlib import metadata
from types import ModuleType

import node_agent.cli
from meshroute_middleware.app import demo, keys, migrate, serve
from meshroute_middleware.app.bench import cli as bench
from meshroute_middleware.app.mitm import cli as mitm

# subcommand -> module with `add_arguments(parser)` and `run(args) -> int`
SUBCOMMANDS: dict[str, tuple[ModuleType, str]] = {
    "serve": (serve, "run a tracker gateway"),
    "node": (node_agent.cli, "announce (or emulate) an inference node over mDNS"),
    "bench": (bench, "run benchmarks (learning quality)"),
    "demo": (demo, "a whole mesh learning live, on this machine"),
    "mitm": (mitm, "route chat traffic passing through mitmproxy (mitmdump options pass on)"),
    "keys": (keys, "make client keys: `keys new NAME` prints one and its [[clients]] lines"),
    "limits": (migrate, "move limits, budgets and the usage ledger: `limits migrate --from "
               "state-file --to redis://…`"),
}
PASS_ON = {"mitm"}  # subcommands whose unknown options belong to the program they run


def version() -> str:
    """`meshroute X.Y.Z`, from the installed package's metadata."""
    try:
        return f"meshroute {metadata.version('meshroute')}"
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "meshroute (not installed)"


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser; each subcommand's module adds its own flags."""
    parser = argparse.ArgumentParser(
        prog="meshroute", description="A learned router for LLM chat traffic.")
    parser.add_argument("--version", action="version", version=version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        child = sub.add_parser(name, help=help_text, description=help_text)
        if name == "serve":
            child.add_argument("--version", action="version", version=version())
        module.add_arguments(child)
        child.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    command: Callable[..., int] | None = getattr(args, "_run", None)
    if command is None:
        parser.print_help()
        return 2
    if extra and args.command not in PASS_ON:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    try:
        return int((command(args, extra) if args.command in PASS_ON else command(args)) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
