"""`--config FILE` hands the provider tables to the provider config parser; new options."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshroute_middleware.app.settings import SettingsError, load_settings

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "providers" / "meshroute.toml"


def test_the_example_config_loads_with_its_provider_tables(tmp_path: Path) -> None:
    settings = load_settings({"config": str(EXAMPLE)}, {"XDG_STATE_HOME": str(tmp_path)})
    cfg = settings.providers
    assert cfg is not None
    assert [p.name for p in cfg.providers] == ["fastco", "slowco"]
    assert cfg.routing.chain == ("fastco/big-model", "slowco/small-model", "qwen")
    assert cfg.profile("coding") is not None and cfg.mesh_tier("qwen") == "medium"
    # provider tables keep their quotas and cooldowns in the user's state directory
    assert settings.state_file == str(tmp_path / "meshroute" / "state.db")
    assert settings.admin_token is None


def test_no_provider_tables_no_provider_config(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("port = 9000\n")
    assert load_settings({"config": str(path)}, {}).providers is None


def test_a_bad_provider_table_names_the_file_and_the_key(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[routing]\nstrategy = "fastest-ever"\n')
    with pytest.raises(SettingsError, match=r"c\.toml.*strategy"):
        load_settings({"config": str(path)}, {})


def test_other_unknown_tables_are_still_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[routes]\nx = 1\n")
    with pytest.raises(SettingsError, match="unknown option"):
        load_settings({"config": str(path)}, {})


def test_state_file_and_admin_token_from_flags_env_and_file(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('state_file = "from-file.db"\n')
    assert load_settings({"config": str(path)}, {}).state_file == "from-file.db"
    env = {"MESHROUTE_STATE_FILE": ":memory:", "MESHROUTE_ADMIN_TOKEN": "adm"}
    settings = load_settings({"config": str(path)}, env)
    assert (settings.state_file, settings.admin_token) == (":memory:", "adm")
    flags = load_settings({"state_file": "flag.db", "admin_token": "flag"}, env)
    assert (flags.state_file, flags.admin_token) == ("flag.db", "flag")
