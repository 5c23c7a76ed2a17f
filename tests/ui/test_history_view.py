"""A fresh server reads an instance's run history from the history view and folds only the log's
tail after the view's position: its pages are the pages a full fold serves, whether the view is
caught up, behind by some supersteps, missing, or of another shape; rows that no longer match
their manifest are refused (issue 21)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from kernel import EventStore, LogIntegrityError
from projections import HistoryView, Projector, backend_for, forks_of
from projections.ui import create_app
from projections.ui._data import Reader
from tests.ui.conftest import DEMO, FORK, LOCAL, RECOVERY
from tests.ui.workflows import HOSTILE_INSTANCE, write_chain


def pages(store: EventStore, instances: list[str]) -> dict[str, str]:
    """Every page of ``instances`` a fresh server shows: the run list, each timeline (all runs,
    each run, each superstep selected), the state now and after each superstep, the graph (with
    each superstep's executors highlighted).

    The pages come from one new server, whose first page of an instance loads it (from the
    history view and its tail when there is a view): a load does not depend on the page that
    asks, so every page shows what a first load gives. (A server per page gave the same pages
    at ten to twenty times the cost: a new app compiles its templates on its first pages.)"""
    found: dict[str, str] = {}
    paths = ["/"]
    for instance in instances:
        paths += [f"/i/{instance}", f"/i/{instance}/state", f"/i/{instance}/graph"]
        history = Reader(store).history(instance)
        paths += [f"/i/{instance}?run={run.run_id}" for run in history.runs()]
        for step in history.supersteps():
            active = "&".join(f"active={e}" for e in step.executors)
            paths += [f"/i/{instance}?step={step.superstep_id}",
                      f"/i/{instance}/state?at=step:{step.superstep_id}",
                      f"/i/{instance}/graph?{active}"]  # fmt: skip
    with TestClient(create_app(store), base_url=LOCAL) as fresh:
        for path in paths:
            response = fresh.get(path)
            assert response.status_code == 200, path
            found[path] = response.text
    return found


def uses_view(store: EventStore, instance: str) -> bool:
    return Reader(store)._viewed(instance, forks_of(store, instance)) is not None


def check_every_view_state(store: EventStore, instances: list[str]) -> None:
    full = pages(store, instances)
    assert not any(uses_view(store, i) for i in instances)  # no view table: the full fold
    assert not backend_for(store).exists(HistoryView().table)  # and reading created none
    projector = Projector(store, [HistoryView()])
    last = store.last_position()
    # Behind by every number of events (so by whole supersteps, and inside one), then caught up.
    for upto in [*range(1, last, max(1, last // 12)), last]:
        projector.drop("history")
        projector.catch_up(upto=upto)
        assert projector.position("history") == upto
        folded = [i for i in instances if projector.history(i).runs()]
        assert all(uses_view(store, i) for i in folded)
        assert pages(store, instances) == full, upto
    assert all(uses_view(store, i) for i in instances)


def test_pages_with_the_history_view_equal_the_full_fold(store: EventStore) -> None:
    asyncio.run(write_chain(store, HOSTILE_INSTANCE, stop=3, fail_at=2))
    asyncio.run(write_chain(store, HOSTILE_INSTANCE, stop=3))
    asyncio.run(write_chain(store, "other", stop=2))
    check_every_view_state(store, [HOSTILE_INSTANCE, "other"])


def test_with_forks_and_recovery_the_view_gives_the_same_pages(demo_store: EventStore) -> None:
    check_every_view_state(demo_store, [DEMO, RECOVERY, FORK])


def test_a_view_of_another_shape_or_unreadable_rows_fall_back_to_the_full_fold(
    demo_store: EventStore,
) -> None:
    instances = [DEMO, RECOVERY]
    full = pages(demo_store, instances)

    class OldHistory(HistoryView):
        version = 1  # the table rows of an older shape lived in

    Projector(demo_store, [OldHistory()]).catch_up()
    assert not uses_view(demo_store, DEMO)
    assert pages(demo_store, instances) == full
    projector = Projector(demo_store, [HistoryView()])
    projector.catch_up()
    backend = backend_for(demo_store)
    with backend.transaction() as tx:
        tx.put(HistoryView().table, DEMO, "t", {"not": "a tracker"})
    # A row written around the projector no longer matches the instance's manifest: refused
    # (issue 21), never shown and never silently replaced.
    with pytest.raises(LogIntegrityError, match="history view of"):
        Reader(demo_store).history(DEMO)
    assert uses_view(demo_store, RECOVERY)


_USES_VIEW = """
import sys
from kernel import open_store
from projections import forks_of
from projections.ui._data import Reader
with open_store(sys.argv[1], create=False) as store:
    instance = sys.argv[2]
    print(Reader(store)._viewed(instance, forks_of(store, instance)) is not None)
"""


def test_reading_the_view_never_writes_even_on_a_read_only_store(store_path: Path) -> None:
    from kernel import open_store
    from tests.store.test_hostile_store import in_a_child_without_write_permission
    from tests.ui.test_pages import _READ_EVERY_PAGE

    url = f"sqlite:///{store_path}"
    with open_store(url, create=False) as store:
        Projector(store, [HistoryView()]).catch_up()
        assert uses_view(store, DEMO)
    for extra in ("-wal", "-shm"):
        Path(f"{store_path}{extra}").unlink(missing_ok=True)
    before = store_path.read_bytes()
    directory = store_path.parent
    files = sorted(p.name for p in directory.iterdir())
    store_path.chmod(0o444)
    directory.chmod(0o555)
    try:
        paths = ["/", f"/i/{DEMO}", f"/i/{RECOVERY}", f"/i/{FORK}"]
        done = in_a_child_without_write_permission(["-c", _READ_EVERY_PAGE, url, *paths])
        viewed = in_a_child_without_write_permission(["-c", _USES_VIEW, url, DEMO])
    finally:
        directory.chmod(0o755)
    assert done.returncode == 0, done.stderr
    assert viewed.returncode == 0, viewed.stderr
    assert viewed.stdout.split() == ["True"]  # the view was read, not skipped for an error
    assert [line.rsplit(" ", 1)[1] for line in done.stdout.splitlines()] == ["200"] * 4
    assert store_path.read_bytes() == before
    assert sorted(p.name for p in directory.iterdir()) == files
