"""Materialized views on every backend: catch-up, crashes, rebuild, verify, follow."""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest
from hypothesis import strategies as st

from kernel import open_store
from projections import Projector, default_views, fold_blame, fold_history, run_follower
from tests.projections.helpers import Crash, CrashingView, instance_plans, populate, run_property
from tests.projections.logs import fixed_plans
from tests.projections.reference import Reference

ALL = ["state", "history", "blame", "snapshots"]


def test_catch_up_matches_the_pure_folds(store):
    def check(data):
        plans_, page_size = data
        logs = populate(store, plans_)
        projector = Projector(store, ALL, page_size=page_size, snapshot_every=2)
        projector.catch_up()
        for name in ALL:
            assert projector.position(name) == store.last_position()
        for instance_id, events in logs.items():
            assert projector.state(instance_id) == Reference(events).state()
            assert projector.history(instance_id) == fold_history(events)
            assert projector.blame(instance_id) == fold_blame(events)

    run_property(store, st.tuples(instance_plans, st.integers(1, 9)), check)


def test_catch_up_killed_mid_page_then_restarted_equals_one_pass(store):
    def check(data):
        plans_, page_size, crash_after = data
        populate(store, plans_)
        for spec in default_views(ALL, snapshot_every=2):
            crashing = Projector(store, [CrashingView(spec, crash_after)], page_size=page_size)
            before = crashing.position(spec.name)
            try:
                crashing.catch_up()
            except Crash:
                pass
            else:
                assert before <= crashing.position(spec.name)
            restarted = Projector(store, [spec], page_size=page_size)
            restarted.catch_up()
            assert restarted.position(spec.name) == store.last_position()
            report = restarted.verify(spec.name)
            assert report.ok, report

    run_property(store, st.tuples(instance_plans, st.integers(1, 7), st.integers(0, 30)), check)


def test_rebuild_equals_the_live_view_and_verify_agrees(store):
    populate(store, fixed_plans())
    projector = Projector(store, ALL, page_size=5, snapshot_every=1)
    projector.catch_up()
    for name in ALL:
        table = projector.views[name].table
        live = projector.backend.rows(table)
        assert projector.verify(name).ok
        projector.rebuild(name)
        assert projector.backend.rows(table) == live


def test_an_interrupted_rebuild_leaves_the_old_view_intact(store):
    logs = populate(store, fixed_plans())
    projector = Projector(store, ["state"], page_size=3)
    projector.catch_up()
    table = projector.views["state"].table
    live = projector.backend.rows(table)
    crashing = Projector(store, [CrashingView(default_views(["state"])[0], 4)], page_size=3)
    if len(list(store.iter_all())) > 4:
        with pytest.raises(Crash):
            crashing.rebuild("state")
    assert projector.backend.rows(table) == live
    for instance_id, events in logs.items():
        assert projector.state(instance_id) == Reference(events).state()
    projector.rebuild("state", resume=True)
    assert projector.backend.rows(table) == live


def test_verify_reports_a_tampered_row(store):
    logs = populate(store, fixed_plans())
    projector = Projector(store, ["state"])
    projector.catch_up()
    instance_id = next(iter(logs))
    table = projector.views["state"].table
    with projector.backend.transaction() as tx:
        doc = tx.get(table, instance_id, "view")
        doc["values"]["tampered"] = 1
        tx.put(table, instance_id, "view", doc)
        tx.put(table, "ghost", "view", {"values": {}})
    report = projector.verify("state")
    assert not report.ok
    assert list(report.different) == [(instance_id, "view")]
    assert report.only_live == [("ghost", "view")]
    projector.rebuild("state")
    assert projector.verify("state").ok


def test_two_projectors_on_one_view_fold_every_event_once(store):
    logs = populate(store, fixed_plans(2))
    projectors = [Projector(store, ["history", "state"], page_size=2) for _ in range(2)]
    threads = [threading.Thread(target=p.catch_up) for p in projectors]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert projectors[0].verify("history").ok
    for instance_id, events in logs.items():
        assert projectors[1].history(instance_id) == fold_history(events)


def test_follow_keeps_up_with_new_appends(store):
    projector = Projector(store, ["state"], page_size=4)
    stop = threading.Event()
    follower = threading.Thread(
        target=projector.follow, args=(stop,), kwargs={"poll_interval": 0.02}
    )
    follower.start()
    try:
        logs = populate(store, fixed_plans())
        deadline = time.monotonic() + 10
        while projector.position("state") < store.last_position() and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        stop.set()
        follower.join(5)
    assert not follower.is_alive()
    for instance_id, events in logs.items():
        assert projector.state(instance_id) == Reference(events).state()


def _follow_in_process(url: str, stop: threading.Event) -> None:
    run_follower(url, ["state", "history"], stop, page_size=3, poll_interval=0.02)


def _write_in_process(url: str, copies: int) -> None:
    with open_store(url) as store:
        populate(store, fixed_plans(copies))


def test_a_follower_process_projects_what_writer_processes_append(durable_store_url):
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    follower = context.Process(target=_follow_in_process, args=(durable_store_url, stop))
    follower.start()
    writers = [
        context.Process(target=_write_in_process, args=(durable_store_url, n)) for n in (2, 3)
    ]
    try:
        for writer in writers:
            writer.start()
        with open_store(durable_store_url) as store:
            populate(store, fixed_plans())
            for writer in writers:
                writer.join(30)
                assert writer.exitcode == 0
            projector = Projector(store, ["state", "history"])
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and (
                projector.position("state") < store.last_position()
                or projector.position("history") < store.last_position()
            ):
                time.sleep(0.05)
            assert projector.position("state") == store.last_position()
            for instance_id in store.instances():
                events = store.read(instance_id)
                assert projector.state(instance_id) == Reference(events).state()
                assert projector.history(instance_id) == fold_history(events)
            assert projector.verify("history").ok
    finally:
        stop.set()
        follower.join(10)
        if follower.is_alive():
            follower.kill()
    assert follower.exitcode == 0


def _crash_in_process(url: str, after: int) -> None:
    import os

    from tests.projections.helpers import CrashingView as Wrapped

    class Dies(Wrapped):
        def apply(self, state, event):
            self.left -= 1
            if self.left < 0:
                os._exit(3)  # the process dies mid-page, inside the transaction
            return self.inner.apply(state, event)

    with open_store(url) as store:
        Projector(store, [Dies(default_views(["blame"])[0], after)], page_size=4).catch_up()


def test_a_projector_process_killed_mid_page_loses_nothing(durable_store_url):
    with open_store(durable_store_url) as store:
        logs = populate(store, fixed_plans(3))
        context = multiprocessing.get_context("spawn")
        dying = context.Process(target=_crash_in_process, args=(durable_store_url, 6))
        dying.start()
        dying.join(30)
        projector = Projector(store, ["blame"], page_size=4)
        if len(list(store.iter_all())) > 6:
            assert dying.exitcode == 3
            assert projector.position("blame") < store.last_position()
        projector.catch_up()
        for instance_id, events in logs.items():
            assert projector.blame(instance_id) == fold_blame(events)
        assert projector.verify("blame").ok


def test_follow_stops_on_a_damaged_view_table_naming_the_damage(tmp_path):
    """A corrupt page of a view table (SQLITE_CORRUPT) is damage, told by the kernel's rule
    (``StoreDamagedError.detects``): ``follow`` stops with ``StoreDamagedError`` rather than a
    bare ``ProjectionError``, and never waits it out."""
    from kernel import StoreDamagedError
    from tests.cli.test_hostile_cli import damage_table, logged

    path = tmp_path / "s.db"
    url = logged(path)
    with open_store(url) as store:
        Projector(store, ["state"]).catch_up()
        table = next(n for n in backend_tables(store) if n.startswith("steplog_view_state"))
    damage_table(path, table)
    logged(path)  # another run: the follower has events to fold into the damaged table
    retries = []
    stop = threading.Event()
    threading.Timer(20, stop.set).start()  # before the fix, follow retried until stopped
    with open_store(url) as store:
        projector = Projector(store, ["state"])
        with pytest.raises(StoreDamagedError, match="the database is damaged"):
            projector.state("orders-1")
        with pytest.raises(StoreDamagedError, match="the database is damaged"):
            projector.follow(stop, on_retry=lambda e, d: retries.append(e))
    stop.set()
    assert retries == []


def backend_tables(store):
    with store.datastore.transaction(commit=False) as cursor:
        cursor.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        return [row[0] for row in cursor.fetchall()]
