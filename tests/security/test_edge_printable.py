"""Issue 22, item 10 — node URLs accepted control characters (ESC, backspace, NUL, DEL): an
unsigned mDNS URL put raw terminal escapes into a log line. Node URLs and ids are limited to
printable characters, and network-supplied strings are escaped wherever they are logged (the
mDNS packets themselves: tests/node_agent/test_mdns_hostile.py)."""

from __future__ import annotations

import logging

import pytest

from meshroute_middleware.core import InvalidNodeError, parse_node
from meshroute_middleware.core.logsafe import shown
from node_agent.discovery import Discovery

from ..node_agent.conftest import RecordingSink

CONTROL = ["\x1b[2J", "\x08", "\x00", "\x7f", "\n", "\r", "\t", "\x85", "\u200b"]


def record(**fields: object) -> dict[str, object]:
    return {"node_id": "gpu-a", "model": "m", "start": 0, "end": 0, "layers": 1,
            "url": "http://127.0.0.1:9000/v1", **fields}


@pytest.mark.parametrize("char", CONTROL)
@pytest.mark.parametrize("where", ["host", "path", "end"])
def test_a_url_with_a_control_character_is_refused(char: str, where: str) -> None:
    url = {"host": f"http://127.0.0.1{char}x:9000", "path": f"http://127.0.0.1:9000/a{char}b",
           "end": f"http://127.0.0.1:9000/v1{char}"}[where]
    with pytest.raises(InvalidNodeError):
        parse_node(record(url=url), now=0.0)


@pytest.mark.parametrize("char", CONTROL)
def test_an_id_with_a_control_character_is_refused(char: str) -> None:
    with pytest.raises(InvalidNodeError):
        parse_node(record(node_id=f"gpu-a{char}"), now=0.0)
    with pytest.raises(InvalidNodeError):
        parse_node(record(model=f"m{char}x"), now=0.0)


def test_printable_urls_and_ids_still_pass() -> None:
    for url in ("http://127.0.0.1:9000", "https://[::1]:8443/v1/x", "http://node-7.lan/a~b%20c"):
        assert parse_node(record(url=url), now=0.0).url == url.rstrip("/")
    assert parse_node(record(node_id="a.b_c:d@e/f+g-h"), now=0.0).node_id == "a.b_c:d@e/f+g-h"


def test_shown_escapes_control_characters_and_bounds_length() -> None:
    assert shown("a\x1b[31mb\x00\x7f\n") == "a\\x1b[31mb\\x00\\x7f\\n"
    assert shown("é ok") == "é ok"
    assert shown("x" * 500, 10) == "x" * 10 + "…"


def test_a_refused_mdns_record_is_logged_escaped(caplog: pytest.LogCaptureFixture) -> None:
    discovery = Discovery(RecordingSink())
    with caplog.at_level(logging.INFO, "meshroute.discovery"):
        discovery.announced("evil\x1b[2J._meshroute._tcp.local.", {
            b"v": b"1", b"id": b"esc\x1b[31m", b"u": b"http://127.0.0.1:9/\x1b[2J"})
    assert caplog.records, "the refusal is logged"
    for entry in caplog.records:
        assert entry.getMessage().isprintable(), entry.getMessage()
