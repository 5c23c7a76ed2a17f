"""The port's contract suite (``backend_contract``) against each backend steplog ships."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel._store._backend import RowBackend
from kernel._store._memory import MemoryBackend
from kernel._store._postgres import PostgresBackend
from kernel._store._sqlite import SQLiteBackend
from tests.store.backend_contract import RowBackendContract


class TestMemoryBackend(RowBackendContract):
    def create_backend(self) -> RowBackend:
        return MemoryBackend()


class TestSQLiteBackend(RowBackendContract):
    def create_backend(self) -> RowBackend:
        tmp_path: Path = self.request.getfixturevalue("tmp_path")
        return SQLiteBackend(tmp_path / "steplog.db")


@pytest.mark.postgres
class TestPostgresBackend(RowBackendContract):
    def create_backend(self) -> RowBackend:
        url: str = self.request.getfixturevalue("postgres_url")
        return PostgresBackend(url)
