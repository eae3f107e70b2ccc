"""The wire format, byte for byte: frames of every message type, signed and not, as the
encoder wrote them before gossip/wire.py was split by job (issue 36). A change to any byte a
peer reads fails here; a deliberate change bumps WIRE_VERSION (or REPORTS_VERSION) and these."""

from __future__ import annotations

import hashlib

import pytest

from gossip import state as st
from gossip.reports_wire import Reports
from gossip.wire import Ack, WireCodec
from meshroute_middleware.core.providers.peers import PeerState, Usage
from meshroute_middleware.core.providers.scoring import RouteStats
from meshroute_middleware.core.stats import StatEntry

NOW = 1_000_000.0
SECRET = b"correct horse battery staple"
KEY = ("m", "m|a[0-9]", "t1")
ENTRY = StatEntry(42.5, 2.25, NOW - 3, 0.125, 3.0, 0.5, 7, "timeout",
                  ((0, 1.5, 3.25), (4, 0.75, 2.5)))
DIGEST = st.Digest({KEY: (NOW - 3, 123456)}, {"m": NOW - 100}, {"m": 2**32 - 1})
REPORT = PeerState(NOW - 1, {"openai/gpt": RouteStats(3.0, 1.0, 55.5, 320.0, 0.25, NOW - 9)},
                   {("openai/gpt", 1): (NOW + 60, NOW - 2)}, {("openai", 2): (401, NOW - 5)},
                   {("openai/gpt", 0): NOW - 7}, {("openai", 1): Usage(3, 900, 20000, 40, 12000)})
BODIES: dict[str, st.Digest | st.Delta | Ack | PeerState | Reports] = {
    "digest": DIGEST,
    "delta": st.Delta({KEY: ENTRY._replace(curve=None)}, {"m": NOW - 100}, DIGEST, {"m": 7}),
    "delta with curves": st.Delta({KEY: ENTRY}, {"m": NOW - 100}, None, {"m": 7}),
    "empty delta": st.Delta(),
    "ack": Ack(5),
    "providers": REPORT,
    "provider reports": Reports({"t1": REPORT, "t2": PeerState(NOW - 4)}),
}
# sha256 of each frame (nonce 77, reply_to 9, sent at NOW), unsigned and signed with SECRET
GOLDEN: dict[tuple[str, bool], str] = {
    ("digest", False):
        "51f7ed5ef53df618bac987e79540f5df0ba53ab29bbcecaa1b153466eb150184",
    ("digest", True):
        "8bd6423d944388af37bee2068b53d9247c1e889a5dc9f63253a9ecc096f60cb1",
    ("delta", False):
        "cf650497531ac0144b0f1b09712b48287149e4a4609c8d07bdf6ba3304f92c5b",
    ("delta", True):
        "ad038f018b829173dd6a1a3835378358de1cf9953dd8b2fb980119efc039141f",
    ("delta with curves", False):
        "2a72cda88d196c8de3cec9ec52f063804db2c597c86cc076f1983d5ff7870601",
    ("delta with curves", True):
        "3720ef1fe420056fa6ba59d7ada57a2eeacaae4c02169dba994061ae4d41c1cc",
    ("empty delta", False):
        "090c366f8b432a7d77e666dab508f2f37159cfb0fd83ed11d971cefba7a7e620",
    ("empty delta", True):
        "046ed39958da6e23843dde899c90feb3a31053121502b24e22ddfd824e425c14",
    ("ack", False):
        "17eeb71dffc4221b18cb1177885a03cef1ddbec5724b61952c5cd18b9a986e66",
    ("ack", True):
        "b7fd5fbfb66e1ccaf4da0a72c4ddb8e2f27acebddf7a248c6a47aea4039ddf1d",
    ("providers", False):
        "eb4e7ee2b8427dcc4d890773af96db0571e8f4dab58367a5f274d7ee315b8c57",
    ("providers", True):
        "b3e76f2ff54af25d7610ebad5e4f969d11560a782f595b639e31ab7bdc1d06c0",
    ("provider reports", False):
        "bec84b1dde2cc16d6b86c6cd72ce015cdabac85683d5ae071bf6dbf102d66930",
    ("provider reports", True):
        "6997fc1752a1cb54eb74c8c30ccc25f16d3e90ac793090118d90d615f13f10f4",
}


@pytest.mark.parametrize("name,signed", sorted(GOLDEN))
def test_frames_are_byte_for_byte_what_they_were(name: str, signed: bool) -> None:
    frame = WireCodec("t1", SECRET if signed else None).encode(BODIES[name], NOW, nonce=77,
                                                               reply_to=9)
    assert hashlib.sha256(frame).hexdigest() == GOLDEN[(name, signed)]


def test_every_body_has_its_golden_frames() -> None:
    assert set(GOLDEN) == {(name, signed) for name in BODIES for signed in (False, True)}


@pytest.mark.parametrize("name", sorted(BODIES))
def test_golden_frames_decode_to_their_bodies(name: str) -> None:
    frame = WireCodec("t1", SECRET).encode(BODIES[name], NOW, nonce=77, reply_to=9)
    assert WireCodec("t2", SECRET).decode(frame, NOW).body == BODIES[name]
