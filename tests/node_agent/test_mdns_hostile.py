"""Issue 22, item 1 — one mDNS packet stopped discovery, health checks and gossip. A raw mDNS
response naming the instance `a\\x01b._meshroute._tcp.local.` made zeroconf's
`AsyncServiceInfo` raise BadTypeInNameException, which ended the background services' task
group: a node announced afterwards was never discovered, one killed afterwards never evicted.
The packets here are real: sent on loopback inside the test's network namespace
(scripts/isolated)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import httpx
import pytest
from zeroconf import DNSAddress, DNSOutgoing, DNSPointer, DNSService, DNSText, Zeroconf, const

from meshroute_middleware.core import NodeRecord
from meshroute_middleware.core.contracts.txt import NODE_SERVICE, TRACKER_SERVICE
from meshroute_middleware.core.contracts.txt import encode_node as encode_record

from .conftest import LOOPBACK, PATIENCE_S, start_node


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return int(probe.getsockname()[1])


def send_response(instance: str, service: str, txt: bytes = b"\x05a=b=c",
                  repeat: int = 3) -> None:
    """A raw mDNS response (PTR, SRV, TXT, A) for `instance`, multicast on loopback."""
    out = DNSOutgoing(const._FLAGS_QR_RESPONSE | const._FLAGS_AA)
    unique = const._CLASS_IN | const._CLASS_UNIQUE
    out.add_answer_at_time(DNSPointer(service, const._TYPE_PTR, const._CLASS_IN, 4500,
                                      instance), 0)
    out.add_answer_at_time(DNSService(instance, const._TYPE_SRV, unique, 120, 0, 0, 9,
                                      "hostile.local."), 0)
    out.add_answer_at_time(DNSText(instance, const._TYPE_TXT, unique, 4500, txt), 0)
    out.add_answer_at_time(DNSAddress("hostile.local.", const._TYPE_A, unique, 120,
                                      socket.inet_aton(LOOPBACK)), 0)
    zc = Zeroconf(interfaces=[LOOPBACK])
    try:
        for _ in range(repeat):
            zc.send(out)
            time.sleep(0.2)
    finally:
        zc.close()


def metric(url: str, name: str, **labels: str) -> float:
    """The sum of the /metrics samples of `name` whose labels include `labels`."""
    total = 0.0
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        match = re.match(r"^([a-z_]+)(?:\{(.*)\})? (\S+)$", line)
        if match is None or match.group(1) != name:
            continue
        have = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(2) or ""))
        if labels.items() <= have.items():
            total += float(match.group(3))
    return total


def node_ids(url: str) -> set[str]:
    return {n["node_id"] for n in httpx.get(url + "/v1/nodes", timeout=5).json()["nodes"]}


def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.1)


class Gateway(NamedTuple):
    url: str
    log: Path
    gossip_port: int
    secret: tuple[str, ...]  # the mesh secret flags its nodes need too


@pytest.fixture(params=[(), ("--mesh-secret", "s3cret")], ids=["unsigned", "mesh-secret"])
def gateway(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Gateway]:
    """`meshroute serve` with mDNS on loopback, gossip on, health probes every 0.5 s; with
    and without a mesh secret (the name is read before any signature)."""
    port, gossip_port, log = _free_port(), _free_port(), tmp_path / "serve.log"
    secret: tuple[str, ...] = request.param
    command = [sys.executable, "-m", "meshroute_middleware.app.cli", "serve", "--host",
               LOOPBACK, "--port", str(port), "--mdns-interfaces", LOOPBACK,
               "--health-interval", "0.5", "--gossip-listen", f"{LOOPBACK}:{gossip_port}",
               *secret]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "MESHROUTE_GOSSIP_SECRET": "hostile"}
    with log.open("ab") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://{LOOPBACK}:{port}"
    try:
        def up() -> bool:
            assert proc.poll() is None, log.read_text()
            try:
                return httpx.get(url + "/healthz", timeout=1).status_code == 200
            except httpx.TransportError:
                return False
        until(up, "meshroute serve answers /healthz")
        yield Gateway(url, log, gossip_port, secret)
    finally:
        proc.kill()
        proc.wait(10)


@pytest.mark.parametrize("service", [NODE_SERVICE, TRACKER_SERVICE])
def test_a_control_character_in_an_instance_name_is_refused_and_discovery_goes_on(
        gateway: Gateway, service: str) -> None:
    url, log = gateway.url, gateway.log
    source = "mdns" if service == NODE_SERVICE else "mdns-tracker"
    send_response("a\x01b." + service, service)
    until(lambda: metric(url, "meshroute_rejected_total", source=source, reason="bad_name")
          >= 1, "the bad name is counted")

    node = start_node("after-the-packet", "--seconds-per-layer", "0.0002", *gateway.secret)
    try:
        until(lambda: "after-the-packet" in node_ids(url), "a later node is discovered")
        node.send_signal(signal.SIGKILL)  # no goodbye: only health checks can evict it
        node.wait(10)
        until(lambda: "after-the-packet" not in node_ids(url), "the dead node is evicted")
    finally:
        if node.poll() is None:
            node.kill()
            node.wait(10)
    health = httpx.get(url + "/healthz", timeout=5)
    assert health.status_code == 200 and "degraded" not in health.json()
    socket.create_connection((LOOPBACK, gateway.gossip_port), timeout=5).close()  # still open
    assert metric(url, "meshroute_service_failures_total") == 0  # nothing had to restart
    text = log.read_text()
    assert "\x01" not in text  # the name reached the log escaped
    assert text.count("refused mDNS record a\\x01b") == 1  # logged once, however often sent


def test_an_escape_sequence_in_an_announced_url_is_refused_and_never_logged_raw(
        gateway: Gateway) -> None:
    """Item 10: an unsigned TXT record whose URL holds ESC put terminal escapes into the
    `node … join via mDNS (…)` log line; such a URL is refused, and logged escaped."""
    url, log = gateway.url, gateway.log
    good = NodeRecord("esc", "m", 0, 0, 1, "http://127.0.0.1:9")
    props = encode_record(replace(good, url="http://127.0.0.1:9/\x1b[2J\x1b[31mpwned"),
                          secret=gateway.secret[1] if gateway.secret else None)
    txt = b"".join(bytes([len(p)]) + p for p in
                   (f"{k}={v}".encode() for k, v in props.items()))
    send_response("esc." + NODE_SERVICE, NODE_SERVICE, txt)
    until(lambda: metric(url, "meshroute_rejected_total", source="mdns", reason="bad_record")
          >= 1, "the record is refused")
    assert "esc" not in node_ids(url)
    assert "\x1b" not in log.read_text()


@pytest.mark.parametrize("caps", ["vision,\x1b[31mroot", "telepathy", "vision," * 40])
def test_hostile_caps_in_a_txt_record_are_refused_counted_and_logged_escaped(
        gateway: Gateway, caps: str) -> None:
    """Issue 25: `caps` is read like every TXT field: bounded, known names only."""
    url, log = gateway.url, gateway.log
    good = NodeRecord("capsy", "m", 0, 0, 1, "http://127.0.0.1:9")
    props = {**encode_record(good), "caps": caps}
    if gateway.secret:  # signed as the mesh's members sign: the content is what is refused
        from meshroute_middleware.core.contracts.txt import sign
        props = {k: v for k, v in props.items() if k != "sig"}
        props["sig"] = sign(props, gateway.secret[1])
    txt = b"".join(bytes([len(p)]) + p for p in
                   (f"{k}={v}".encode()[:255] for k, v in props.items()))
    before = metric(url, "meshroute_rejected_total", source="mdns", reason="bad_record")
    send_response("capsy." + NODE_SERVICE, NODE_SERVICE, txt)
    until(lambda: metric(url, "meshroute_rejected_total", source="mdns", reason="bad_record")
          > before, "the record is refused and counted")
    assert "capsy" not in node_ids(url)
    text = log.read_text()
    assert "\x1b" not in text and "capsy" in text
