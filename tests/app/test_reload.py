"""Reload in process (app/reload.py): chains, provider models and aliases change with the
config read again; what the gateway learned stays; a config with an error changes nothing."""

from __future__ import annotations

from typing import Any, cast

import anyio
import httpx
import pytest

from meshroute_middleware.app.reload import Reloader
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.core.providers.config import parse_providers_config

from ..providers.fake_provider import FakeProvider
from ..providers.gateway import ENV, gateway, providers_doc


@pytest.fixture
def fakes() -> Any:
    fast, slow = FakeProvider("fast"), FakeProvider("slow", models=("small-model",))
    with fast.serve(), slow.serve():
        yield fast, slow


def _chain(url: str, model: str = "auto") -> list[str]:
    view = httpx.get(f"{url}/v1/routing/chain", params={"model": model}, timeout=10).json()
    return [r["route"] for r in view["chain"]]


def test_a_reload_changes_chains_and_aliases_and_keeps_what_was_learned(
        fakes: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = fakes
    with gateway(providers_doc(fast, slow)) as gw:
        assert gw.chat().status_code == 200
        learned = dict(gw.gateway.providers.stats) if gw.gateway.providers else {}
        assert _chain(gw.url) == ["fastco/big-model", "slowco/small-model"]
        doc = providers_doc(fast, slow, chain=("slowco/small-model",))
        doc["aliases"] = {"gpt-*": "fastco/big-model"}
        fresh = ServeSettings(providers=parse_providers_config(doc))
        reloader = Reloader(gw.gateway, lambda: fresh, ENV)
        assert anyio.run(reloader.reload) is True
        assert _chain(gw.url) == ["slowco/small-model"]
        assert gw.chat("gpt-4o").headers["x-meshroute-route"].startswith("fastco/big-model")
        assert gw.gateway.providers is not None
        assert set(learned) <= set(gw.gateway.providers.stats)  # the statistics stayed


def test_a_reload_with_an_error_changes_nothing(
        fakes: tuple[FakeProvider, FakeProvider], caplog: pytest.LogCaptureFixture) -> None:
    fast, slow = fakes
    with gateway(providers_doc(fast, slow)) as gw:
        broken = providers_doc(fast, slow, chain=("fastco/big-model", "typo-model"))
        bad = ServeSettings(providers=parse_providers_config(broken))
        assert anyio.run(Reloader(gw.gateway, lambda: bad, ENV).reload) is False
        no_tables = Reloader(gw.gateway, lambda: ServeSettings(), ENV)
        assert anyio.run(no_tables.reload) is False  # removing the tables: a restart
        assert _chain(gw.url) == ["fastco/big-model", "slowco/small-model"]
        assert gw.chat().status_code == 200
    refused = [r.getMessage() for r in caplog.records if "reload refused" in r.getMessage()]
    assert len(refused) == 2 and "'typo-model'" in refused[0], refused
    assert "needs a restart" in refused[1]


def test_signals_during_a_reload_fold_into_one_more_after_it() -> None:
    """SIGHUP while a reload runs (its file may have changed after it was read): one more
    reload after it, however many came; none is lost, none runs beside another."""
    reloader = Reloader(cast(Any, None), ServeSettings, ENV)
    started: list[int] = []
    release = anyio.Event()

    async def reload() -> bool:
        started.append(len(started))
        await release.wait()
        return True

    reloader.reload = reload  # type: ignore[method-assign]

    async def scenario() -> None:
        reloader.soon()
        await anyio.sleep(0)
        assert started == [0]
        reloader.soon()  # two signals during the first reload
        reloader.soon()
        await anyio.sleep(0)
        assert started == [0]  # not beside it
        release.set()
        running = reloader._running
        assert running is not None
        await running
        assert started == [0, 1]  # one more, after it

    anyio.run(scenario)
