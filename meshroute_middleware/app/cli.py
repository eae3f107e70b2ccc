"""The `meshroute` command: serve, node, bench, demo; each subcommand's module adds its flags
and runs it."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType

import node_agent.cli

from ..sim import cli as bench
from . import demo, serve

# subcommand -> module with `add_arguments(parser)` and `run(args) -> int`
SUBCOMMANDS: dict[str, tuple[ModuleType, str]] = {
    "serve": (serve, "run a tracker gateway"),
    "node": (node_agent.cli, "announce (or emulate) an inference node over mDNS"),
    "bench": (bench, "run benchmarks (learning quality)"),
    "demo": (demo, "a whole mesh learning live, on this machine"),
}


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser; each subcommand's module adds its own flags."""
    parser = argparse.ArgumentParser(
        prog="meshroute", description="A learned router for LLM chat traffic.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        child = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(child)
        child.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    command: Callable[[argparse.Namespace], int] | None = getattr(args, "_run", None)
    if command is None:
        parser.print_help()
        return 2
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    try:
        return int(command(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
