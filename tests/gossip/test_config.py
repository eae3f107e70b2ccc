"""GossipConfig built from ServeSettings (`gossip_config`), the Prometheus families and the
package's export list."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

import gossip
from gossip.memory import MemoryNetwork
from gossip.metrics import metric_families
from gossip.service import GossipConfig, GossipService, InsecureGossipError
from meshroute_middleware.app.settings import ServeSettings, load_settings
from tests.conftest import FakeClock
from tests.gossip.helpers import make_router


def test_config_from_cli_and_env() -> None:
    settings = load_settings(
        {"gossip_listen": "127.0.0.1:7946", "gossip_peers": ["a:1", "[::1]:2"],
         "gossip_fanout": 2}, {"MESHROUTE_GOSSIP_SECRET": " s3cret\n",
                               "MESHROUTE_GOSSIP_INTERVAL": "0.5"})
    config = settings.gossip_config()
    assert config is not None
    assert config.listen == ("127.0.0.1", 7946)
    assert config.peers == (("a", 1), ("::1", 2))
    assert (config.interval_s, config.fanout, config.secret) == (0.5, 2, b"s3cret")


def test_secret_file_wins_and_is_checked(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("from-file\n")
    settings = replace(ServeSettings(), gossip_secret="inline", gossip_secret_file=str(path),
                       gossip_peers=("127.0.0.1:1",))
    assert _config(settings).secret == b"from-file"
    path.write_text("  \n")
    with pytest.raises(ValueError, match="empty"):
        settings.gossip_config()
    missing = replace(settings, gossip_secret_file=str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="cannot read"):
        missing.gossip_config()
    assert _config(replace(ServeSettings(), gossip_peers=("127.0.0.1:1",))).secret is None
    assert ServeSettings().gossip_config() is None  # no listener, no peer: no gossip


def test_the_defaults_are_gossips_own() -> None:
    config = _config(replace(ServeSettings(), gossip_peers=("127.0.0.1:1",)))
    assert (config.interval_s, config.fanout) == (GossipConfig().interval_s,
                                                   GossipConfig().fanout)


def _config(settings: ServeSettings) -> GossipConfig:
    config = settings.gossip_config()
    assert config is not None
    return config


def test_bad_peer_address_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        replace(ServeSettings(), gossip_peers=("nohost",)).gossip_config()


@pytest.mark.parametrize("listen", ["0.0.0.0:7946", "192.168.1.5:7946", "[::]:7946",
                                    "gossip.lan:7946"])
def test_a_reachable_listener_without_a_secret_is_refused(listen: str) -> None:
    settings = replace(ServeSettings(), gossip_listen=listen)
    with pytest.raises(InsecureGossipError, match="--insecure-gossip"):
        settings.gossip_config()
    assert _config(replace(settings, gossip_secret="s")).secret == b"s"
    allowed = _config(replace(settings, insecure_gossip=True))
    assert allowed.insecure and allowed.exposed


@pytest.mark.parametrize("listen", ["127.0.0.1:7946", "127.0.0.2:7946", "[::1]:7946",
                                    "localhost:7946", None])
def test_loopback_or_no_listener_needs_no_secret(listen: str | None) -> None:
    config = _config(replace(ServeSettings(), gossip_listen=listen,
                             gossip_peers=("127.0.0.1:1",)))
    assert config.secret is None and not config.exposed


def test_insecure_gossip_comes_from_flag_and_env() -> None:
    assert load_settings({"insecure_gossip": True}, {}).insecure_gossip
    assert load_settings({}, {"MESHROUTE_INSECURE_GOSSIP": "yes"}).insecure_gossip
    assert not load_settings({}, {}).insecure_gossip


@pytest.mark.anyio
async def test_an_allowed_insecure_listener_warns_at_start(
        clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    config = GossipConfig(("0.0.0.0", 1), interval_s=1e6, insecure=True)
    network = MemoryNetwork(0)
    async with GossipService(make_router("t0", clock), config,
                             transport=network.transport(("0.0.0.0", 1))):
        pass
    assert any("WITHOUT a shared secret" in r.getMessage() and r.levelname == "WARNING"
               for r in caplog.records)


def test_metric_families_follow_the_counters(clock: FakeClock) -> None:
    service = GossipService(make_router("t0", clock), GossipConfig(peers=(("p", 1),)))
    service.counters.rounds = 4
    service.counters.exchanges, service.counters.exchange_failures = 10, 3
    service.counters.reject("forged")
    service.counters.refuse_entries("future", 3)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in metric_families(service) for s in family.samples}
    assert samples[("meshroute_gossip_rounds_total", ())] == 4
    assert samples[("meshroute_gossip_exchanges_total", (("result", "ok"),))] == 7
    assert samples[("meshroute_gossip_exchanges_total", (("result", "failed"),))] == 3
    assert samples[("meshroute_gossip_rejected_total", (("reason", "forged"),))] == 1
    assert samples[("meshroute_gossip_entries_refused_total", (("reason", "future"),))] == 3
    assert samples[("meshroute_gossip_peers", ())] == 1


def test_exports_are_pinned() -> None:
    assert set(gossip.__all__) == {
        "Address", "ApplyResult", "Delta", "Digest", "GossipConfig", "GossipCounters",
        "GossipError", "GossipService", "Membership", "MemoryNetwork", "MemoryTransport",
        "MessageType", "TcpTransport", "Transport", "WireCodec", "apply_delta", "make_delta",
        "make_digest", "parse_address"}
    for name in gossip.__all__:
        assert hasattr(gossip, name), name
