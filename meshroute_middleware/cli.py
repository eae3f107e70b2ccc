"""The `meshroute` command: serve, node, bench, demo. The one composition root."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

# subcommand -> module with `add_arguments(parser)` and `run(args) -> int`
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("meshroute_middleware.serve_cli", "run a tracker gateway"),
    "node": ("node_agent.cli", "announce (or emulate) an inference node over mDNS"),
    "bench": ("meshroute_middleware.sim.cli", "run benchmarks (learning quality)"),
    "demo": ("meshroute_middleware.demo", "a whole mesh learning live, on this machine"),
}


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser; each subcommand's module adds its own flags."""
    parser = argparse.ArgumentParser(
        prog="meshroute", description="A learned router for LLM chat traffic.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not module_name.startswith(exc.name):
                raise
            continue  # a subcommand not built yet
        child = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(child)
        child.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
