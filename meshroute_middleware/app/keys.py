"""`meshroute keys new NAME`: a fresh client key (issue 24) and the `[[clients]]` lines to
paste into the gateway's config, with only the key's sha256 in them."""

from __future__ import annotations

import argparse
import secrets
import sys

from meshroute_middleware.core.clients import CLIENT_NAME, MAX_CLIENT_NAME, key_digest

__all__ = ["KEY_PREFIX", "add_arguments", "new_key", "run"]

KEY_PREFIX = "mr-"  # says what a key is when it turns up in a shell history or a ticket
KEY_BYTES = 32  # 256 random bits (secrets.token_urlsafe: 43 characters)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`keys new NAME`."""
    sub = parser.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    new = sub.add_parser("new", help="print a fresh client key and its [[clients]] lines",
                         description="print a fresh client key and the [[clients]] lines "
                         "(with its sha256) to paste into the gateway's config")
    new.add_argument("name", metavar="NAME", help="the client's name: [a-z0-9-]+")


def new_key() -> str:
    """A fresh random client key."""
    return KEY_PREFIX + secrets.token_urlsafe(KEY_BYTES)


def clients_lines(name: str, key: str) -> str:
    """What `keys new` prints: the key (as a comment: shown once) and its table, TOML that
    pastes as it is."""
    return "\n".join((
        f"# client key of {name!r}: give it to the client; it is shown only this once",
        f"#   {key}",
        "[[clients]]",
        f'name = "{name}"',
        f'key = "sha256:{key_digest(key).hex()}"',
        '# models = ["auto", "fastco/*"]  # optional allow-list (globs); default: every model',
    ))


def run(args: argparse.Namespace) -> int:
    """Print a new key for NAME, or one line and exit 2 for a bad NAME."""
    name: str = args.name
    if not CLIENT_NAME.fullmatch(name) or len(name) > MAX_CLIENT_NAME:
        print(f"meshroute keys: a client name must match [a-z0-9-]+ (at most "
              f"{MAX_CLIENT_NAME} characters), got {name!r}", file=sys.stderr)
        return 2
    print(clients_lines(name, new_key()))
    return 0
