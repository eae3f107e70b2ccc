"""Settings: defaults < TOML file < environment < CLI, ADR-0021 aliases, errors naming sources."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import pytest

from meshroute_middleware.app.settings import (
    ServeSettings,
    SettingsError,
    add_arguments,
    load_settings,
)
from meshroute_middleware.core import RouterConfig


def cli(*argv: str) -> dict[str, Any]:
    """Parse flags as `meshroute serve` does: unset flags stay absent."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return vars(parser.parse_args(list(argv)))


def toml(tmp_path: Path, text: str) -> str:
    path = tmp_path / "meshroute.toml"
    path.write_text(text)
    return str(path)


def test_defaults_are_adr0021s() -> None:
    settings = load_settings({}, {})
    assert settings == ServeSettings()
    r = settings.router
    assert (r.explore_share, r.weight_alpha, r.half_life_s, r.min_sample_tokens) == (
        0.3, 1.0, 600.0, 8)


def test_precedence_file_then_env_then_cli(tmp_path: Path) -> None:
    path = toml(tmp_path, "port = 9000\nseed = 1\n[router]\nexplore_share = 0.1\n"
                          "half_life_s = 100.0\nweight_alpha = 3.0\n")
    env = {"MESHROUTE_CONFIG": path, "MESHNET_ROUTE_EXPLORE_SHARE": "0.2",
           "MESHROUTE_PORT": "9001", "MESHNET_ROUTE_WEIGHT_ALPHA": "2.0"}
    s = load_settings(cli("--route-explore-share", "0.25"), env)
    assert s.router.explore_share == 0.25  # CLI beats env beats file
    assert (s.port, s.router.weight_alpha) == (9001, 2.0)  # env beats file
    assert (s.seed, s.router.half_life_s) == (1, 100.0)  # file beats defaults
    assert s.router.min_sample_tokens == 8  # default
    assert load_settings(cli("--config", path), {}).port == 9000  # --config like MESHROUTE_CONFIG


@pytest.mark.parametrize(("source", "value", "field", "expected"), [
    ("MESHNET_ROUTE_EXPLORE_SHARE", "0.05", "explore_share", 0.05),
    ("MESHNET_ROUTE_WEIGHT_ALPHA", "1.5", "weight_alpha", 1.5),
    ("MESHNET_ROUTE_STATS_HALF_LIFE", "120", "half_life_s", 120.0),
    ("MESHNET_ROUTE_MIN_SAMPLE_TOKENS", "16", "min_sample_tokens", 16),
    ("--route-explore-share", "0.05", "explore_share", 0.05),
    ("--route-weight-alpha", "1.5", "weight_alpha", 1.5),
    ("--route-stats-half-life", "120", "half_life_s", 120.0),
    ("--min-sample-tokens", "16", "min_sample_tokens", 16),
    ("--explore-share", "0.05", "explore_share", 0.05),
    ("MESHROUTE_EXPLORE_SHARE", "0.05", "explore_share", 0.05),
])
def test_adr0021_names_and_ours(source: str, value: str, field: str, expected: Any) -> None:
    settings = (load_settings(cli(source, value), {}) if source.startswith("--")
                else load_settings({}, {source: value}))
    assert getattr(settings.router, field) == expected


def test_our_env_name_wins_over_the_adr_alias() -> None:
    env = {"MESHROUTE_EXPLORE_SHARE": "0.1", "MESHNET_ROUTE_EXPLORE_SHARE": "0.9"}
    assert load_settings({}, env).router.explore_share == 0.1


def test_repeatable_and_boolean_options() -> None:
    s = load_settings(cli("--gossip-peer", "127.0.0.1:1", "--gossip-peer", "127.0.0.1:2",
                          "--no-mdns"), {"MESHROUTE_MDNS": "yes"})
    assert (s.gossip_peers, s.mdns) == (("127.0.0.1:1", "127.0.0.1:2"), False)
    env = {"MESHROUTE_GOSSIP_PEERS": "127.0.0.1:1, 127.0.0.1:3", "MESHROUTE_MDNS": "off"}
    s = load_settings({}, env)
    assert (s.gossip_peers, s.mdns) == (("127.0.0.1:1", "127.0.0.1:3"), False)


@pytest.mark.parametrize(("environ", "source"), [
    ({"MESHNET_ROUTE_EXPLORE_SHARE": "lots"}, "MESHNET_ROUTE_EXPLORE_SHARE"),
    ({"MESHROUTE_PORT": "80.5"}, "MESHROUTE_PORT"),
    ({"MESHNET_ROUTE_MIN_SAMPLE_TOKENS": "eight"}, "MESHNET_ROUTE_MIN_SAMPLE_TOKENS"),
    ({"MESHROUTE_MDNS": "maybe"}, "MESHROUTE_MDNS"),
])
def test_malformed_env_values_name_their_variable(environ: dict[str, str], source: str) -> None:
    with pytest.raises(SettingsError, match=source):
        load_settings({}, environ)


def test_malformed_cli_and_file_values_name_their_source(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="--route-explore-share"):
        load_settings({"explore_share": "lots"}, {})
    out_of_range = [({"explore_share": 1.5}, {}, "--route-explore-share"),
                    ({}, {"MESHNET_ROUTE_EXPLORE_SHARE": "-0.1"}, "MESHNET_ROUTE_EXPLORE_SHARE"),
                    ({}, {"MESHROUTE_PORT": "70000"}, "MESHROUTE_PORT"),
                    ({"max_body_bytes": 0}, {}, "--max-body-bytes")]
    for cli, env, source in out_of_range:
        with pytest.raises(SettingsError, match=re.escape(source) + ": "):
            load_settings(cli, env)
    in_file = toml(tmp_path, "[router]\nweight_alpha = -1\n")
    with pytest.raises(SettingsError, match=re.escape(f"{in_file}: weight_alpha")):
        load_settings({"config": in_file}, {})
    bad_type = toml(tmp_path, "[router]\nmin_sample_tokens = 8.5\n")
    expected = re.escape(f"{bad_type}: min_sample_tokens must be int")
    with pytest.raises(SettingsError, match=expected):
        load_settings({"config": bad_type}, {})
    unknown = toml(tmp_path, "explore_shar = 0.1\n")
    with pytest.raises(SettingsError, match=r"unknown option.*explore_shar"):
        load_settings({"config": unknown}, {})
    with pytest.raises(SettingsError, match="cannot read config file"):
        load_settings({}, {"MESHROUTE_CONFIG": str(tmp_path / "missing.toml")})
    broken = toml(tmp_path, "port = = 1\n")
    with pytest.raises(SettingsError, match=re.escape(broken)):
        load_settings({"config": broken}, {})


@pytest.mark.parametrize(("field", "value"), [
    ("explore_share", "1.5"), ("half_life_s", "0"), ("weight_alpha", "-1"),
    ("min_sample_tokens", "-1"),
])
def test_out_of_range_values_are_settings_errors(field: str, value: str) -> None:
    with pytest.raises(SettingsError, match=field):
        load_settings({field: value}, {})
    with pytest.raises(ValueError, match=field):
        RouterConfig(**{field: float(value)})


def test_the_limits_store_from_toml_env_and_flag(tmp_path: Path) -> None:
    config = tmp_path / "m.toml"
    config.write_text('[limits]\nstore = "redis://127.0.0.1:6390/0"\n')
    assert load_settings({"config": str(config)}).limits_store == "redis://127.0.0.1:6390/0"
    env = {"MESHROUTE_LIMITS_STORE": "state-file"}
    assert load_settings({"config": str(config)}, env).limits_store == "state-file"
    assert load_settings({"limits_store": "local"}, env).limits_store == "local"
    with pytest.raises(SettingsError, match="MESHROUTE_LIMITS_STORE"):
        load_settings({}, {"MESHROUTE_LIMITS_STORE": "memcached://x"})
    config.write_text('[limits]\nbackend = "redis"\n')
    with pytest.raises(SettingsError, match=r"\[limits\]"):
        load_settings({"config": str(config)})


def test_the_ledgers_retention_from_toml_env_and_flag_reaches_the_redis_store(
        tmp_path: Path) -> None:
    from meshroute_middleware.app.limits import client_store
    from meshroute_middleware.state.fallback import FallbackLimits
    from meshroute_middleware.state.redis_limits import RedisLimits

    assert load_settings({}).usage_retention_days == 400
    config = tmp_path / "m.toml"
    config.write_text('[limits]\nstore = "redis://127.0.0.1:6390/0"\nusage_retention_days = 90\n')
    settings = load_settings({"config": str(config)})
    assert settings.usage_retention_days == 90
    env = {"MESHROUTE_USAGE_RETENTION_DAYS": "30"}
    assert load_settings({"config": str(config)}, env).usage_retention_days == 30
    assert load_settings({"usage_retention_days": "7"}, env).usage_retention_days == 7
    with pytest.raises(SettingsError, match="usage_retention_days"):
        load_settings({"usage_retention_days": "0"}, {})
    store = client_store(settings)  # building it opens no connection
    assert isinstance(store, FallbackLimits) and isinstance(store.store, RedisLimits)
    assert store.store.retention_days == 90
