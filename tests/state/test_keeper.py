"""The state file of a tracker, on a fake clock: mesh route statistics come back decayed for the
time the tracker was down, topology change times come back when the nodes are the same, failed
writes are counted and retried, and a process killed mid-write leaves a whole file."""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from meshroute_middleware.app.gateway import build_gateway
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.core import NodeRecord, Outcome, Router, RouterConfig
from meshroute_middleware.core.kinds import PROVEN, STALE
from meshroute_middleware.core.stats import StatEntry
from meshroute_middleware.state.keeper import SETTLE_S, WARN_EVERY_S, StateKeeper
from meshroute_middleware.state.store import RouteRows, StateStore, StateStoreError
from tests.conftest import FakeClock

from ..conftest import route_view, stat_keys

T0 = 1_796_040_000.0  # 2026-11-30 12:00 UTC
H = 60.0  # half-life of the routers here
SIG = "m|a[0-9]"
GOOD = Outcome(completion_tokens=100, seconds=2.0, ttfb_s=0.25)  # 50 tok/s
PEER = StatEntry(30.0, 4.0, T0 + 0.5, 0.4, 4.0, 0.0, 4)  # measured since the join


def node(url: str = "http://a.test") -> NodeRecord:
    return NodeRecord("a", "m", 0, 9, 10, url)


def tracker(clock: FakeClock, origin: str = "trk") -> Router:
    return Router(RouterConfig(policy="adr0021", half_life_s=H), clock=clock, origin=origin)


def learned(path: Path, clock: FakeClock, samples: int = 10) -> Router:
    """A tracker that measured SIG `samples` times and heard of a peer's entry, saved."""
    router = tracker(clock)
    router.upsert_node(node())
    router.stats.merge({("m", SIG): {"peer": PEER}}, clock())
    for _ in range(samples):
        clock.advance(1.0)
        router.record(router.choose("m"), GOOD)
    with StateStore(path).open() as store:
        assert StateKeeper(store, router).save_now(clock())
    return router


def restarted(path: Path, clock: FakeClock, url: str = "http://a.test") -> tuple[Router, int]:
    """A fresh tracker on the same state file: static nodes first, then the restore."""
    router = tracker(clock)
    router.upsert_node(node(url))
    with StateStore(path).open() as store:
        restored = StateKeeper(store, router).restore(clock())
    return router, restored


def test_statistics_come_back_decayed_for_the_time_the_tracker_was_down(tmp_path: Path) -> None:
    clock = FakeClock(T0)
    before = learned(tmp_path / "s.db", clock).routing_table("m")["models"]["m"]["candidates"][0]
    clock.advance(2 * H)  # down for two half-lives
    router, restored = restarted(tmp_path / "s.db", clock)
    assert restored == 2  # our own entry and the peer's
    assert set(router.stats.entries("m", SIG)) == {"trk", "peer"}
    model = router.topology.model("m")
    assert model is not None and model.changed_at == T0  # the nodes are back as they were
    view = route_view(router.stats, "m", SIG, clock(), model.changed_at)
    assert view.status == PROVEN and view.count == 14
    assert view.tps == pytest.approx(before["tps"], rel=1e-9)
    assert view.mass == pytest.approx(before["weight"] * 0.25, rel=1e-9)  # 0.5 ** (2H / H)
    router.record(router.choose("m"), GOOD)  # the own entry goes on from where it was
    assert router.stats.entries("m", SIG)["trk"].count == 11


def test_a_changed_node_leaves_the_restored_statistics_stale(tmp_path: Path) -> None:
    clock = FakeClock(T0)
    learned(tmp_path / "s.db", clock)
    clock.advance(30.0)
    router, _ = restarted(tmp_path / "s.db", clock, url="http://elsewhere.test")
    model = router.topology.model("m")
    assert model is not None and model.changed_at == clock()  # measured elsewhere: stale
    assert route_view(router.stats, "m", SIG, clock(), model.changed_at).status == STALE


@pytest.mark.parametrize(("after_s", "settled"), [(5.0, True), (SETTLE_S + 1, False)])
def test_nodes_that_return_after_the_start_settle_within_the_window(
        tmp_path: Path, after_s: float, settled: bool) -> None:
    clock = FakeClock(T0)
    learned(tmp_path / "s.db", clock)
    router = tracker(clock)
    with StateStore(tmp_path / "s.db").open() as store:
        keeper = StateKeeper(store, router)
        keeper.restore(clock())
        clock.advance(after_s)
        router.upsert_node(node())  # mDNS or POST /v1/nodes brings the node back
        keeper.collect(clock())
    model = router.topology.model("m")
    assert model is not None
    assert (model.changed_at == T0) is settled


def test_only_changed_rows_are_written_and_a_failed_write_is_retried(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock(T0)
    path = tmp_path / "s.db"
    router = tracker(clock)
    router.upsert_node(node())
    store = StateStore(path).open()
    keeper = StateKeeper(store, router)
    router.record(router.choose("m"), GOOD)
    assert keeper.save_now(clock()) and keeper.writes == 1
    assert keeper.collect(clock()) is None  # nothing changed since
    store._conn().execute("PRAGMA busy_timeout = 20")
    with sqlite3.connect(path) as other, caplog.at_level(logging.WARNING, "meshroute.state"):
        other.execute("BEGIN EXCLUSIVE")  # the file cannot be written for now
        for _ in range(3):
            clock.advance(1.0)
            router.record(router.choose("m"), GOOD)
            assert not keeper.save_now(clock())
        other.execute("ROLLBACK")
        assert keeper.write_errors == 3
        assert len(caplog.records) == 1  # one warning, not one per failed write
        assert str(path) in caplog.records[0].getMessage()
        clock.advance(WARN_EVERY_S)
        assert keeper.save_now(clock())  # retried: what the failed writes held is written
        assert "written again" in caplog.records[-1].getMessage()
    metrics = {m.name: m.samples[0].value for m in keeper.metric_families()}
    assert metrics == {"meshroute_state_writes": 2, "meshroute_state_write_errors": 3,
                       "meshroute_state_unsaved": 0,
                       "meshroute_state_current_timestamp_seconds": clock()}
    store.close()
    with StateStore(path).open() as again:
        assert again.load_routes().entries[("m", SIG)]["trk"].count == 4


def test_entries_past_the_prune_horizon_are_dropped_from_the_file(tmp_path: Path) -> None:
    clock = FakeClock(T0)
    router = learned(tmp_path / "s.db", clock)
    clock.advance(router.stats.prune_after_s + 1)
    assert router.stats.prune(clock()) == 2
    with StateStore(tmp_path / "s.db").open() as store:
        keeper = StateKeeper(store, router)
        keeper.restore(clock())  # nothing comes back: all of it is past the horizon
        assert stat_keys(router.stats) == []
        assert keeper.save_now(clock())
        assert store.load_routes().entries == {}


@pytest.mark.parametrize("corruption", [
    "mass = -1",
    "curve = '[[3, 1.0, 1e9]]'",  # a curve bin's mean log tps past log(MAX_TPS)
    "curve = 'not json'",
])
def test_a_malformed_row_is_refused_naming_the_file(tmp_path: Path, corruption: str) -> None:
    clock = FakeClock(T0)
    learned(tmp_path / "s.db", clock)
    with sqlite3.connect(tmp_path / "s.db") as db:
        db.execute(f"UPDATE route_stats SET {corruption} WHERE origin = 'peer'")
    with StateStore(tmp_path / "s.db").open() as store, pytest.raises(
            StateStoreError, match=f"state file {tmp_path / 's.db'}: route_stats row m/"):
        StateKeeper(store, tracker(clock)).restore(clock())


def test_a_gateway_restarted_on_its_state_file_is_the_same_origin(tmp_path: Path) -> None:
    clock = FakeClock(T0)
    nodes = tmp_path / "nodes.json"
    nodes.write_text('[{"node_id": "a", "model": "m", "start": 0, "end": 9, "layers": 10, '
                     '"url": "http://127.0.0.1:9"}]')
    settings = ServeSettings(mdns=False, nodes_file=str(nodes), state_file=str(tmp_path / "s.db"),
                             router=RouterConfig(half_life_s=H))
    first = build_gateway(settings, clock=clock)
    assert first.keeper is not None and first.store is not None
    sig = first.router.candidates("m")[0].signature
    first.router.record(first.router.choose("m"), GOOD)
    assert first.keeper.save_now(clock())
    first.store.close()
    clock.advance(H)
    second = build_gateway(settings, clock=clock)
    assert second.store is not None
    second.store.close()
    assert second.config.tracker_id == first.config.tracker_id
    own = second.router.stats.entries("m", sig)
    assert list(own) == [first.config.tracker_id] and own[first.config.tracker_id].count == 1
    assert route_view(second.router.stats, "m", sig, clock(), T0 - 1).mass == pytest.approx(0.5)


def test_without_a_state_file_nothing_is_opened(tmp_path: Path) -> None:
    gateway = build_gateway(ServeSettings(mdns=False))
    assert gateway.store is None and gateway.keeper is None


def test_a_process_killed_mid_write_leaves_the_last_whole_save(tmp_path: Path) -> None:
    """SIGKILL while a writer commits one generation after another (every entry of a
    generation carries its number): the file is never torn, it holds one whole generation."""
    path = tmp_path / "s.db"
    writer = textwrap.dedent(f"""
        import sys
        from meshroute_middleware.core.stats import StatEntry
        from meshroute_middleware.state.store import RouteRows, StateStore
        store = StateStore({str(path)!r}).open()
        for gen in range(1, 1_000_000):
            entries = {{("m", f"m|n{{i}}[0-9]", "trk"): StatEntry(float(gen), 1.0, float(gen),
                        0.1, 1.0, 0.0, gen, "x" * 200) for i in range(2000)}}
            store.save({{}}, float(gen), RouteRows(entries, {{}}, "trk"))
            print(gen, flush=True)
    """)
    for stop_after in (1, 2, 3):
        proc = subprocess.Popen([sys.executable, "-c", writer], stdout=subprocess.PIPE,
                                text=True)
        try:
            assert proc.stdout is not None
            for _ in range(stop_after):
                assert proc.stdout.readline().strip()
        finally:
            os.kill(proc.pid, signal.SIGKILL)  # mostly in the middle of the next save
            proc.wait(30)
        with sqlite3.connect(path) as db:
            assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        with StateStore(path).open() as store:
            entries = store.load_routes().entries
        gens = {e["trk"].count for e in entries.values()}
        assert len(entries) == 2000 and len(gens) == 1, gens  # one whole generation
        assert gens.pop() >= stop_after  # and no committed one lost


def test_a_second_restart_keeps_the_first_change_time(tmp_path: Path) -> None:
    clock = FakeClock(T0)
    path = tmp_path / "s.db"
    learned(path, clock)
    for _ in range(2):
        clock.advance(H)
        router = tracker(clock)
        router.upsert_node(node())
        with StateStore(path).open() as store:
            keeper = StateKeeper(store, router)
            keeper.restore(clock())
            router.record(router.choose("m"), GOOD)
            assert keeper.save_now(clock())
        model = router.topology.model("m")
        assert model is not None and model.changed_at == T0
    assert route_view(router.stats, "m", SIG, clock(), T0).count == 16  # 10 + 1 + 1 own, 4 peer's


def test_a_write_holds_only_the_routes_that_changed(tmp_path: Path) -> None:
    clock = FakeClock(T0)
    router = tracker(clock)
    for i in range(5):
        router.stats.record_sample("m", f"m|n{i}[0-9]", 10.0, 0.1, clock())
    with StateStore(tmp_path / "s.db").open() as store:
        keeper = StateKeeper(store, router)
        first = keeper.collect(clock())
        assert first is not None and len(first.routes.entries) == 5
        keeper.done(first, keeper.write(first), clock())
        assert keeper.collect(clock()) is None
        router.stats.merge({("m", "m|n3[0-9]"): {"peer": PEER}}, clock())
        router.stats.record_sample("m", "m|n1[0-9]", 10.0, 0.1, clock())
        later = keeper.collect(clock())
        assert later is not None
        assert sorted(later.routes.entries) == [("m", "m|n1[0-9]", "trk"),
                                                ("m", "m|n3[0-9]", "peer"),
                                                ("m", "m|n3[0-9]", "trk")]


def test_an_older_copy_never_overwrites_a_newer_entry(tmp_path: Path) -> None:
    """Workers share one file and each holds every origin: the newer entry stays."""
    newer, older = PEER._replace(t=T0 + 9, count=9), PEER._replace(t=T0 + 1, count=1)
    with StateStore(tmp_path / "s.db").open() as store:
        for entry in (newer, older):
            store.save({}, T0, RouteRows({("m", SIG, "peer"): entry}, {}, "trk"))
        assert store.load_routes().entries[("m", SIG)]["peer"] == newer


def test_thompson_gets_its_saturation_curves_back_as_priors(tmp_path: Path) -> None:
    """Each own entry carries the policy's curve summary; after a restart the restored
    entries' curves are the prior of the new policy (its knee and speed, not a uniform
    draw over the grid)."""
    clock = FakeClock(T0)
    router = Router(RouterConfig(policy="thompson", half_life_s=H), clock=clock, origin="trk")
    router.upsert_node(node())
    for _ in range(40):  # two requests at once, one ends
        clock.advance(1.0)
        first, second = router.choose("m"), router.choose("m")
        router.record(first, GOOD)
        router.record(second, GOOD)
    saved = router.stats.entries("m", SIG)["trk"].curve
    assert saved  # the own entry carries a curve summary
    with StateStore(tmp_path / "s.db").open() as store:
        assert StateKeeper(store, router).save_now(clock())
    clock.advance(H)
    again = Router(RouterConfig(policy="thompson", half_life_s=H), clock=clock, origin="trk")
    again.upsert_node(node())
    with StateStore(tmp_path / "s.db").open() as store:
        assert StateKeeper(store, again).restore(clock()) == 1
    back = again.stats.entries("m", SIG)["trk"].curve
    assert back == saved  # (bin, mass, mean) exactly as saved: JSON keeps every float
    (arm,) = again.arms("m", clock())
    assert arm.curve  # the merged view the policy fits as its prior


def test_a_file_from_before_curves_opens_and_gains_the_column(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:  # route_stats as the first state files made it
        db.execute("CREATE TABLE route_stats (model TEXT NOT NULL, signature TEXT NOT NULL, "
                   "origin TEXT NOT NULL, value REAL NOT NULL, mass REAL NOT NULL, "
                   "t REAL NOT NULL, ttfb_s REAL NOT NULL, ok REAL NOT NULL, "
                   "fail REAL NOT NULL, count INTEGER NOT NULL, last_error TEXT NOT NULL, "
                   "PRIMARY KEY (model, signature, origin))")
        db.execute("INSERT INTO route_stats VALUES ('m', ?, 'peer', 30, 4, ?, 0.4, 4, 0, 4, '')",
                   (SIG, T0))
    clock = FakeClock(T0)
    router = tracker(clock)
    router.upsert_node(node())
    with StateStore(path).open() as store:
        assert StateKeeper(store, router).restore(clock()) == 1
    assert router.stats.entries("m", SIG)["peer"] == StatEntry(30.0, 4.0, T0, 0.4, 4.0, 0.0, 4)
