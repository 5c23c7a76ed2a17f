"""A page of events is folded as one batch: its rows read in a few statements, written in a few
more at the commit, with the view's position. The rows are those of folding event by event, and a
crash anywhere in the batch leaves the view at its previous position with its previous rows."""

from __future__ import annotations

from typing import Any

import pytest

from kernel import open_store
from projections import VIEW_NAMES, Projector, default_views
from projections._views import _sqlbackends, _sqlite
from tests.projections.helpers import Crash, CrashingView, populate
from tests.projections.logs import fixed_plans


def _tables(projector: Projector) -> dict[str, Any]:
    return {name: projector.backend.rows(spec.table) for name, spec in projector.views.items()}


def test_a_batch_catch_up_gives_the_rows_of_a_one_by_one_catch_up(store):
    populate(store, fixed_plans(copies=4))
    one_by_one = Projector(store, VIEW_NAMES, page_size=1, snapshot_every=1)
    one_by_one.catch_up()
    expected = _tables(one_by_one)
    assert all(rows for _, rows in expected.values())
    for name in VIEW_NAMES:
        one_by_one.drop(name)
    batched = Projector(store, VIEW_NAMES, page_size=10_000, snapshot_every=1)
    assert batched.catch_up() > 0
    assert _tables(batched) == expected
    # And in batches of a few events, each page continuing the rows the previous ones wrote.
    for name in VIEW_NAMES:
        batched.drop(name)
    Projector(store, VIEW_NAMES, page_size=7, snapshot_every=1).catch_up()
    assert _tables(batched) == expected


class _Counting:
    """A cursor that counts the statements sent through it."""

    def __init__(self, cursor: Any, counts: list[str]) -> None:
        self._cursor = cursor
        self._counts = counts

    def execute(self, statement: str, params: Any = ()) -> Any:
        self._counts.append(" ".join(statement.split()))
        return self._cursor.execute(statement, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


def test_a_page_of_many_instances_costs_a_few_statements(durable_store_url, monkeypatch):
    statements: list[str] = []
    init = _sqlbackends._SQLTx.__init__

    def counting(self: Any, backend: Any, cursor: Any) -> None:
        init(self, backend, _Counting(cursor, statements))

    with open_store(durable_store_url) as store:
        logs = populate(store, fixed_plans(copies=10))  # 20 instances
        projector = Projector(store, VIEW_NAMES, page_size=10_000, snapshot_every=1)
        monkeypatch.setattr(_sqlbackends._SQLTx, "__init__", counting)
        projector.catch_up()
        for instance_id in logs:
            assert projector.state(instance_id) == Projector(store, ["state"]).state(instance_id)
    # Per view, whatever the number of instances: the claim (2 statements), one read of the rows
    # the page needs (and their manifests), the position, and the upserts (300 rows each; one
    # by one, every row read and every row written would have been a statement of its own).
    reads = [s for s in statements if s.startswith("SELECT v.instance_id, v.key, v.doc FROM")]
    upserts = [s for s in statements if s.startswith("INSERT INTO") and "(instance_id" in s]
    # The manifests (``projections._views._manifest``) need the former documents of the rows a page
    # wrote without reading them first (new rows, mostly): at most one more read per upsert.
    assert len(VIEW_NAMES) <= len(reads) <= len(VIEW_NAMES) + len(upserts), reads
    assert len(upserts) <= 2 * len(VIEW_NAMES), upserts
    assert len(statements) - len(reads) - len(upserts) == 3 * len(VIEW_NAMES), statements


@pytest.mark.parametrize("name", VIEW_NAMES)
def test_a_crash_mid_batch_leaves_the_previous_position_and_rows(store, name):
    populate(store, fixed_plans())
    spec = default_views([name], snapshot_every=1)[0]
    projector = Projector(store, [spec], page_size=10_000)
    projector.catch_up()
    before = projector.backend.rows(spec.table)
    populate(store, fixed_plans(copies=3))
    crashing = Projector(store, [CrashingView(spec, 25)], page_size=10_000)
    with pytest.raises(Crash):
        crashing.catch_up()
    assert projector.backend.rows(spec.table) == before
    projector.catch_up()  # goes on from the previous position: each event folded once
    assert projector.position(name) == store.last_position()
    assert projector.verify(name).ok


def test_a_failure_among_the_batch_writes_rolls_back_the_earlier_ones(
    durable_store_url, monkeypatch
):
    with open_store(durable_store_url) as store:
        populate(store, fixed_plans())
        projector = Projector(store, ["history"], page_size=10_000)
        projector.catch_up()
        table = projector.views["history"].table
        before = projector.backend.rows(table)
        assert before[0] == store.last_position()
        populate(store, fixed_plans(copies=3))
        monkeypatch.setattr(_sqlbackends, "_MANY_ROWS", 2)  # many upserts, a few rows each
        init = _sqlbackends._SQLTx.__init__
        upserts: list[str] = []

        class Failing(_Counting):
            def execute(self, statement: str, params: Any = ()) -> Any:
                if statement.startswith("INSERT INTO") and "ON CONFLICT (instance_id" in statement:
                    upserts.append(statement)
                    if len(upserts) == 3:
                        raise Crash("the server went away among the writes")
                return super().execute(statement, params)

        def failing(self: Any, backend: Any, cursor: Any) -> None:
            init(self, backend, Failing(cursor, []))

        monkeypatch.setattr(_sqlbackends._SQLTx, "__init__", failing)
        with pytest.raises(Crash):
            projector.catch_up()
        monkeypatch.undo()
        assert len(upserts) == 3  # two upserts had gone through before the failure
        assert projector.backend.rows(table) == before
        projector.catch_up()
        assert projector.position("history") == store.last_position()
        assert projector.verify("history").ok


def test_reading_a_page_s_rows_is_index_lookups_not_a_table_scan(tmp_path):
    with open_store(f"sqlite:///{tmp_path / 'plans.db'}") as store:
        populate(store, fixed_plans(copies=5))
        projector = Projector(store, ["history"])
        projector.catch_up()
        backend = projector.backend
        assert isinstance(backend, _sqlite.SQLiteViewBackend)
        table = projector.views["history"].table
        statement = backend.sql_read_rows(table, 3)
        with backend._cursor("explain", commit=False) as cursor:
            cursor.execute("ANALYZE")
            cursor.execute(f"EXPLAIN QUERY PLAN {statement}", ("a", "t", "b", "t", "c", "t"))
            plan = [row["detail"] for row in cursor.fetchall()]
    assert any(step.startswith("SEARCH v USING") for step in plan), plan
    assert not any(step.startswith("SCAN v") for step in plan), plan
