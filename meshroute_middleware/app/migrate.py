"""`meshroute limits migrate --from state-file --to redis://HOST:PORT/DB`: move what the state
file holds of provider key limits (windows, months), clients' limits and budgets, and the
usage ledger into a Redis limits store, so that a team moving to `--limits-store` starts
from what was spent, not from zero (issue 32). Run it with the gateways stopped."""

from __future__ import annotations

import argparse
import os
import sys
import time

from meshroute_middleware.app.settings import default_state_file
from meshroute_middleware.state.limits import RETENTION_DAYS, LimitsStoreError
from meshroute_middleware.state.redis_limits import RedisLimits, import_rows
from meshroute_middleware.state.sqlite_limits import rows_to_move

__all__ = ["add_arguments", "run"]

SOURCES = ("state-file",)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`limits migrate --from state-file --to redis://…`."""
    sub = parser.add_subparsers(dest="limits_command", metavar="ACTION", required=True)
    move = sub.add_parser(
        "migrate", help="move limits, budgets and the usage ledger into a Redis store",
        description="copy the state file's provider key windows and months, clients' "
        "limits and budgets and the usage ledger into a Redis limits store; rows the store "
        "holds already are left as they are. Stop the gateways first.")
    move.add_argument("--from", dest="source", required=True, choices=SOURCES,
                      help="where the rows are now")
    move.add_argument("--to", dest="target", required=True, metavar="redis://HOST:PORT/DB",
                      help="the Redis store the gateways will use (--limits-store)")
    move.add_argument("--state-file", metavar="PATH",
                      help="the state file (default: the one `meshroute serve` uses)")
    move.add_argument("--usage-retention-days", type=int, default=RETENTION_DAYS,
                      metavar="DAYS", help="ledger rows older than this are not moved "
                      f"(default {RETENTION_DAYS}; as the gateways' setting)")


def run(args: argparse.Namespace) -> int:
    """Move the rows; one line of what was moved, or one line and exit 2."""
    target: str = args.target
    path: str = args.state_file or default_state_file(os.environ)
    if not target.startswith(("redis://", "rediss://")):
        return _fail(f"--to must be redis://HOST:PORT/DB, got {target!r}")
    if args.usage_retention_days < 1:
        return _fail("--usage-retention-days must be >= 1")
    if not os.path.exists(path):
        return _fail(f"state file {path} does not exist")
    try:
        RedisLimits.check(target)
        rows = rows_to_move(path)
        written, present, expired = import_rows(target, rows, time.time(),
                                                args.usage_retention_days)
    except LimitsStoreError as exc:
        return _fail(str(exc))
    sections = sorted({name[0] for name, _ in rows})
    print(f"meshroute limits migrate: {written} rows moved from {path} to {target} "
          f"({', '.join(sections) or 'nothing to move'}); {present} already in the store "
          f"(left as they were), {expired} past the ledger's retention")
    return 0


def _fail(message: str) -> int:
    print(f"meshroute limits migrate: {message}", file=sys.stderr)
    return 2
