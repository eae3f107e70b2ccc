"""The node and tracker mDNS TXT records and the service type names."""

from __future__ import annotations

import re

import pytest

from meshroute_middleware.core import InvalidNodeError, NodeRecord
from meshroute_middleware.core.contracts.txt import (
    MAX_SERVICE_NAME_CHARS,
    NODE_SERVICE,
    TRACKER_SERVICE,
    TrackerTxt,
    TxtError,
    decode_node,
    decode_tracker,
    encode_node,
    encode_tracker,
    service_name,
)

# RFC 6335 §5.1: 1-15 characters, letters, digits and hyphens, at least one letter, no hyphen
# at either end and no two in a row.
RFC6335 = re.compile(r"^(?=.*[A-Za-z])[A-Za-z0-9](?:-?[A-Za-z0-9])*$")
NODE = NodeRecord("gpu-1", "m", 0, 21, 40, "http://127.0.0.1:8001", 42.5, 2, 0.9)


@pytest.mark.parametrize("service_type", [NODE_SERVICE, TRACKER_SERVICE])
def test_service_names_are_rfc_6335_compliant(service_type: str) -> None:
    name = service_name(service_type)
    assert len(name) <= MAX_SERVICE_NAME_CHARS == 15
    assert RFC6335.match(name), name
    assert service_type == f"_{name}._tcp.local."


def test_node_record_round_trips_signed_and_unsigned() -> None:
    for secret in (None, "s3cret"):
        props = encode_node(NODE, secret)
        as_bytes = {k.encode(): v.encode() for k, v in props.items()}
        assert decode_node(as_bytes, secret=secret, now=5.0) == NodeRecord(
            "gpu-1", "m", 0, 21, 40, "http://127.0.0.1:8001", 42.5, 2, 0.9, 5.0)


def test_tracker_record_round_trips() -> None:
    props = encode_tracker("t-1", 8080, 7000, "s")
    assert decode_tracker(props, secret="s") == TrackerTxt("t-1", 7000, 8080)
    assert decode_tracker({"v": "1", "id": "t", "gp": "7000"}) == TrackerTxt("t", 7000, None)


def _tracker(**changes: str) -> dict[str, str]:
    return {**encode_tracker("t", 8080, 7000), **changes}


@pytest.mark.parametrize(("props", "secret", "reason"), [
    (_tracker(v="2"), None, "version"),
    (_tracker(gp="99999"), None, "port"),
    (_tracker(gp="٧٠٠٠"), None, "port"),  # non-ASCII digits: str.isdigit says yes
    (_tracker(hp="http"), None, "port"),
    (_tracker(id=""), None, "'id'"),
    (_tracker(id="t" * 129), None, "'id'"),
    (_tracker(id="t\x00"), None, "'id'"),
    (_tracker(x="y" * 300), None, "255"),
    ({**_tracker(), **{f"k{i}": "1" for i in range(30)}}, None, "entries"),
    (_tracker(), "s", "signature"),
    ({**encode_tracker("t", 8080, 7000, "s"), "gp": "7001"}, "s", "signature"),
    ({**encode_tracker("t", 8080, 7000, "other")}, "s", "signature"),
    # non-ASCII text where the signature goes (hypothesis found a TypeError here)
    ({**encode_tracker("t", 8080, 7000, "s"), "sig": "é" * 64}, "s", "signature"),
])
def test_hostile_tracker_records_are_refused(props: dict[str, str], secret: str | None,
                                             reason: str) -> None:
    with pytest.raises(TxtError, match=reason):
        decode_tracker(props, secret=secret)


def test_node_errors_stay_invalid_node_errors() -> None:
    with pytest.raises(InvalidNodeError, match="version"):
        decode_node({**encode_node(NODE), "v": "9"})
    with pytest.raises(InvalidNodeError, match="255"):
        encode_node(NodeRecord("n", "m", 0, 0, 1, "http://h/" + "p" * 300))


def test_caps_round_trip_and_an_old_record_without_them_gets_the_defaults() -> None:
    from dataclasses import replace

    from meshroute_middleware.core.capabilities import DEFAULT_CAPS
    seeing = replace(NODE, caps=frozenset({"vision", "tools"}))
    props = encode_node(seeing, "s")
    assert props["caps"] == "vision,tools"
    assert decode_node(props, secret="s").caps == {"vision", "tools"}
    plain = encode_node(replace(NODE, caps=frozenset()))
    assert plain["caps"] == "" and decode_node(plain).caps == frozenset()
    old = {k: v for k, v in encode_node(NODE).items() if k != "caps"}
    assert decode_node(old).caps == DEFAULT_CAPS


@pytest.mark.parametrize("caps", ["vision,root", "vision,\x1b[2J", "x" * 200,
                                  "vision,vision,vision,vision,vision,vision", "tools;rm"])
def test_hostile_caps_in_a_txt_record_are_refused(caps: str) -> None:
    with pytest.raises(InvalidNodeError, match="caps"):
        decode_node({**encode_node(NODE), "caps": caps})
