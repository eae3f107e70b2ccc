"""The command's one log format, for meshroute's own lines and uvicorn's alike; the one
place that configures logging."""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any

import orjson

from meshroute_middleware.chat.keyring import Secret, scrub

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# uvicorn's own start-up lines: the command logs what it serves itself (app/run.py), and a
# failure as one line of its own
_UVICORN_CHATTER = frozenset({
    "Started server process [%d]", "Waiting for application startup.",
    "Application startup complete.", "Application startup failed. Exiting.",
    "Finished server process [%d]"})


class _Uvicorn(logging.Filter):
    """uvicorn's lines under the name `uvicorn` (its "uvicorn.error" logger logs them all),
    without the start-up chatter."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "uvicorn.error":
            if record.msg in _UVICORN_CHATTER:
                return False
            record.name = "uvicorn"
        return True


class _ScrubKeys(logging.Filter):
    """A last line of defence: no provider key in a log line, whatever logged it."""

    def __init__(self, secrets: tuple[Secret, ...]) -> None:
        super().__init__()
        self.secrets = secrets

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = scrub(message, self.secrets)
        if clean != message:
            record.msg, record.args = clean, ()
        return True


class JsonFormatter(logging.Formatter):
    """`--log-format json`: each line one JSON object, `ts` (UTC, ISO 8601), `level`,
    `logger`, `message`, and an access line's fields (app/access.py) at the top level."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        fields = getattr(record, "access", None)
        if isinstance(fields, dict):
            line.update(fields)
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


def configure_logging(level: str, secrets: tuple[Secret, ...] = (),
                      fmt: str = "text") -> None:
    """Every log line to stderr in FORMAT (or as JSON, `fmt` "json") at `level`; uvicorn's
    loggers propagate here (it is run with log_config=None)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(FORMAT))
    handler.addFilter(_Uvicorn())
    if secrets:
        handler.addFilter(_ScrubKeys(secrets))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
