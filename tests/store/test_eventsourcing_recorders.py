"""eventsourcing's own recorder test cases, run against steplog's recorder subclasses.

``SQLiteRecorder`` and ``PostgresRecorder`` replace eventsourcing's inserts (and, for SQLite, its
notification reads) with faster ones that write eventsourcing's table directly. Running
eventsourcing's ``ApplicationRecorderTestCase`` and ``NonInterleavingNotificationIDsBaseCase``
against them, on the recorders of real stores, keeps them on eventsourcing's contract: a future
eventsourcing release that changes it fails here, not in production.

The cases are ``unittest`` classes; pytest collects them, and the fixtures that give each test a
fresh SQLite file or PostgreSQL schema are attached with ``usefixtures``. The PostgreSQL ones go
through ``postgres_server_url``, so under ``CI=true`` they fail rather than skip without a server.
The base classes are reached through their module, so that pytest does not collect them.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest
from eventsourcing.persistence import ApplicationRecorder
from eventsourcing.tests import persistence as eventsourcing_cases

from kernel import EventStore, PostgresStore, SQLiteStore, open_store
from kernel._store._postgres import PostgresRecorder
from kernel._store._sqlite import SQLiteRecorder


@pytest.fixture
def sqlite_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    request.instance.url = f"sqlite:///{tmp_path / 'steplog.db'}"


@pytest.fixture
def postgres_store_url(request: pytest.FixtureRequest, postgres_url: str) -> None:
    request.instance.url = postgres_url


class OnAStore:
    """``create_recorder`` for eventsourcing's cases: the recorder of a store opened at ``url``
    (closed after the test). Stream ids are text, as steplog's instance ids are."""

    url: str
    store_class: type[SQLiteStore | PostgresStore]
    recorder_class: type[ApplicationRecorder]

    def new_originator_id(self) -> str:
        return str(uuid.uuid4())

    def create_recorder(self) -> ApplicationRecorder:
        store = open_store(self.url)
        assert isinstance(store, self.store_class)
        self.addCleanup(self._close, store, set(threading.enumerate()))  # type: ignore[attr-defined]
        assert type(store.recorder) is self.recorder_class
        return store.recorder

    @staticmethod
    def _close(store: EventStore, threads_before: set[threading.Thread]) -> None:
        """Close ``store`` once the threads a case started have ended: some cases only signal
        their reader threads to stop, and closing connections under a running query crashes."""
        for thread in set(threading.enumerate()) - threads_before:
            if not thread.daemon:  # the cases' readers; not the connection pools' workers
                thread.join(timeout=30)
        store.close()


@pytest.mark.usefixtures("sqlite_store_url")
class TestSQLiteRecorder(OnAStore, eventsourcing_cases.ApplicationRecorderTestCase):
    store_class = SQLiteStore
    recorder_class = SQLiteRecorder


@pytest.mark.usefixtures("sqlite_store_url")
class TestSQLiteNonInterleavingIds(
    OnAStore, eventsourcing_cases.NonInterleavingNotificationIDsBaseCase
):
    store_class = SQLiteStore
    recorder_class = SQLiteRecorder


@pytest.mark.postgres
@pytest.mark.usefixtures("postgres_store_url")
class TestPostgresRecorder(OnAStore, eventsourcing_cases.ApplicationRecorderTestCase):
    store_class = PostgresStore
    recorder_class = PostgresRecorder


@pytest.mark.postgres
@pytest.mark.usefixtures("postgres_store_url")
class TestPostgresNonInterleavingIds(
    OnAStore, eventsourcing_cases.NonInterleavingNotificationIDsBaseCase
):
    store_class = PostgresStore
    recorder_class = PostgresRecorder
