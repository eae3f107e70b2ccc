"""Where hedging is configured (issue 34): `--hedge-after` (MESHROUTE_HEDGE_AFTER), the
config file's `[routing] hedge` (its default) and a `hedge` key per mesh model
(`[mesh.MODEL]`) or chain (`[profiles.NAME]`, as `auto:NAME`); a bad value names where it
was written."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshroute_middleware.app.settings import SettingsError, load_settings
from meshroute_middleware.core.hedging import HedgeAfter

CONFIG = """
[routing]
chain = ["m"]
hedge = "p95"

[profiles.quick]
chain = ["m"]
hedge = "150ms"

[mesh.m]
hedge = "off"

[mesh.big]
hedge = "p99"
"""


def test_the_file_flag_and_tables_make_one_plan(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(CONFIG)
    env = {"XDG_STATE_HOME": str(tmp_path)}
    plan = load_settings({"config": str(path)}, env).hedge_plan()
    assert plan.default == HedgeAfter(quantile=0.95)  # [routing] hedge
    assert plan.for_name("auto:quick") == HedgeAfter(fixed_s=0.15)
    assert plan.for_name("m") is None  # hedge = "off" for this model
    assert plan.for_name("big") == HedgeAfter(quantile=0.99)
    assert plan.for_name("other") == HedgeAfter(quantile=0.95)
    assert plan.max_share == 0.05
    flagged = load_settings({"config": str(path), "hedge_after": "250ms",
                             "hedge_max_share": 0.1}, env).hedge_plan()
    assert flagged.default == HedgeAfter(fixed_s=0.25) and flagged.max_share == 0.1
    assert load_settings({}, {"MESHROUTE_HEDGE_AFTER": "p90"}).hedge_plan().default \
        == HedgeAfter(quantile=0.9)
    assert not load_settings({}, {}).hedge_plan().enabled  # off unless asked for


@pytest.mark.parametrize(("text", "where"), [
    ('[routing]\nhedge = "soon"\n', "hedge"),
    ('[mesh.m]\nhedge = "p200"\n', "[mesh.m]"),
    ('[profiles.x]\nchain = ["m"]\nhedge = 5\n', "[profiles.x]"),
])
def test_a_bad_hedge_names_where_it_was_written(tmp_path: Path, text: str, where: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(SettingsError, match=r"hedge") as caught:
        load_settings({"config": str(path)}, {"XDG_STATE_HOME": str(tmp_path)})
    assert where in str(caught.value) and str(path) in str(caught.value)


def test_a_bad_flag_is_refused() -> None:
    with pytest.raises(SettingsError, match="--hedge-after"):
        load_settings({"hedge_after": "whenever"}, {})
    with pytest.raises(SettingsError, match="hedge_max_share"):
        load_settings({"hedge_max_share": 2.0}, {})
