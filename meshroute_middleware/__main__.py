"""The `meshroute` command's entry point: the console script and `python -m meshroute_middleware`.

A Ctrl-C while the command's modules are still importing (a second or more on a busy machine)
ends it at once, quietly, with status 130, as a Ctrl-C later on does (app/cli.py). So this
module imports nothing heavy at its top: the import of the CLI below is the package's one
deferred import, and the reason this module exists.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType

INTERRUPTED = 130  # 128 + SIGINT: what a shell reports for a Ctrl-C


def _interrupted(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C during the imports: nothing has started and nothing needs cleaning up; exiting
    at once (no KeyboardInterrupt unwinding through half-imported modules) cannot print a
    traceback wherever it lands."""
    os._exit(INTERRUPTED)


def main(argv: Sequence[str] | None = None) -> int:
    """Import the CLI under a quiet Ctrl-C handler, then run it (it handles Ctrl-C itself)."""
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN:  # started with Ctrl-C ignored (nohup, `&`): keep it so
        from meshroute_middleware.app import cli
    else:
        signal.signal(signal.SIGINT, _interrupted)
        from meshroute_middleware.app import cli
        signal.signal(signal.SIGINT, previous)
    try:
        return cli.main(argv)
    except KeyboardInterrupt:  # between the handler's restoring and the CLI's own handling
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
