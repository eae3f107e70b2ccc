"""The addon's options come from the settings table, and `--set` values go through it."""

from __future__ import annotations

from typing import Any

import pytest

from meshroute_middleware.app.mitm import options
from meshroute_middleware.app.settings import OPTIONS, SettingsError


class Recorder:
    """Stands in for mitmproxy's loader / option manager: keeps what is registered."""

    def __init__(self) -> None:
        self.added: dict[str, tuple[Any, Any]] = {}

    def add_option(self, name: str, typespec: Any, default: Any, help: str) -> None:
        assert help
        self.added[name] = (typespec, default)
        setattr(self, name, default)


def test_every_flagged_settings_row_is_an_option_and_nothing_else() -> None:
    loader = Recorder()
    options.register(loader)
    expected = {"meshroute_" + o.name for o in OPTIONS
                if o.flags and o.name not in options.NOT_FOR_MITM}
    assert expected  # the table is not empty
    assert set(loader.added) == expected | {options.CONFIG, options.SIDE_PORT, options.CHAT_HOSTS}
    assert "meshroute_gossip_secret" not in loader.added  # secrets: env or file only


def test_set_values_over_environment_over_defaults() -> None:
    opts = Recorder()
    options.register(opts)
    opts.meshroute_explore_share = "0.05"
    opts.meshroute_gossip_peers = ["10.0.0.2:7946", "10.0.0.3:7946"]
    opts.meshroute_mdns = "false"
    env = {"MESHROUTE_POLICY": "adr0021", "MESHNET_ROUTE_EXPLORE_SHARE": "0.4"}
    settings = options.settings_from(opts, env)
    assert settings.router.policy == "adr0021"  # from the environment: unset by --set
    assert settings.router.explore_share == 0.05  # --set beats the ADR-0021 variable
    assert settings.gossip_peers == ("10.0.0.2:7946", "10.0.0.3:7946")
    assert settings.mdns is False
    assert settings.router.half_life_s == 600  # the table's default


def test_bad_values_are_refused_by_the_table() -> None:
    opts = Recorder()
    options.register(opts)
    opts.meshroute_explore_share = "1.5"
    with pytest.raises(SettingsError, match="explore_share"):
        options.settings_from(opts)


def test_real_mitmproxy_set_syntax() -> None:
    optmanager = pytest.importorskip("mitmproxy.optmanager")
    opts = optmanager.OptManager()
    options.register(opts)
    opts.set("meshroute_nodes_file=/tmp/n.json", "meshroute_explore_share=0.1",
             "meshroute_gossip_peers=a:1", "meshroute_gossip_peers=b:2", "meshroute_mdns=false",
             "meshroute_side_port=0", "meshroute_min_sample_tokens=3")
    settings = options.settings_from(opts)
    assert settings.nodes_file == "/tmp/n.json" and settings.router.explore_share == 0.1
    assert settings.gossip_peers == ("a:1", "b:2") and settings.mdns is False
    assert settings.router.min_sample_tokens == 3 and opts.meshroute_side_port == 0


def test_meshroute_flags_become_set_arguments_and_the_rest_goes_to_mitmdump() -> None:
    import argparse

    from meshroute_middleware.app.mitm import cli

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args, extra = parser.parse_known_args([
        "--nodes-file", "n.json", "--no-mdns", "--gossip-peer", "a:1", "--gossip-peer", "b:2",
        "--route-explore-share", "0.1", "--side-port", "0", "--listen-port", "8081",
        "--mode", "reverse:http://127.0.0.1:9"])
    argv = cli.mitmdump_argv(args, extra)
    assert argv[:2] == ["-s", str(cli.ADDON_SCRIPT)] and cli.ADDON_SCRIPT.is_file()
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    assert sets == ["meshroute_nodes_file=n.json", "meshroute_mdns=false",
                    "meshroute_gossip_peers=a:1", "meshroute_gossip_peers=b:2",
                    "meshroute_explore_share=0.1", "meshroute_side_port=0"]
    assert argv[-6:] == ["--listen-host", "127.0.0.1", "--listen-port", "8081", "--mode",
                         "reverse:http://127.0.0.1:9"]
    assert "--listen-host" not in cli.mitmdump_argv(args, ["--listen-host", "::1"])[:-2]


def test_chat_hosts_flag_becomes_a_list_option() -> None:
    import argparse

    from meshroute_middleware.app.mitm import cli

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args, extra = parser.parse_known_args(["--chat-hosts", "api.openai.com,.example.com",
                                           "--chat-hosts", "x.lan"])
    sets = [a for a in cli.mitmdump_argv(args, extra) if a.startswith("meshroute_chat")]
    assert sets == ["meshroute_chat_hosts=api.openai.com", "meshroute_chat_hosts=.example.com",
                    "meshroute_chat_hosts=x.lan"]
