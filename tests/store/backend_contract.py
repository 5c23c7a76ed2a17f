"""The store port's contract: what every ``RowBackend`` does, whatever database it keeps rows in.

``RowBackendContract`` is an abstract test case; a backend's test module subclasses it and
implements ``create_backend()`` (``test_backends.py`` does so for memory, SQLite and PostgreSQL).
A fourth backend is its module plus one such subclass. The store-level suite (``test_contract``)
runs ``EventStore`` over each backend; this one talks to the port alone, with rows as opaque as
the port sees them.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta

import pytest

from kernel import ConcurrencyConflictError, EventBase, StoreError
from kernel._codec._hashing import ChainedRow
from kernel._codec._mapper import RowMapper
from kernel._store._backend import RowBackend, StreamRow
from kernel.testing import LogBuilder, ticking_clock

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
MAPPER = RowMapper()


def events(instance_id: str, count: int, *, after: int = 0) -> list[EventBase]:
    """``count`` small events of ``instance_id`` at positions ``after + 1``, ..."""
    log = LogBuilder(instance_id, clock=ticking_clock(T0 + timedelta(seconds=after)), version=after)
    for _ in range(count):
        log.write("k", 1, executor_id="writer", superstep="ss-1", run="run-1")
    return log.events()


def row(instance_id: str, count: int, *, after: int = 0) -> ChainedRow:
    """The batch row of ``count`` events of ``instance_id`` after position ``after``."""
    return MAPPER.to_row(events(instance_id, count, after=after))


def plain(rows: Sequence[StreamRow]) -> list[tuple[int, str, bytes]]:
    """Stream rows as plain tuples (a driver may return its own row objects)."""
    return [(int(last), str(topic), bytes(state)) for last, topic, state in rows]


class RowBackendContract(ABC):
    """Every test here runs against a fresh, empty backend (``self.backend``)."""

    backend: RowBackend

    @abstractmethod
    def create_backend(self) -> RowBackend:
        """A new backend over an empty store, made with the fixtures ``setup_backend`` kept."""

    @pytest.fixture(autouse=True)
    def setup_backend(self, request: pytest.FixtureRequest) -> Iterator[None]:
        self.request = request
        self.backend = self.create_backend()
        yield
        self.backend.close()

    def append(self, instance_id: str, count: int, *, after: int = 0) -> int:
        """Insert a row of ``count`` events at ``after``; its row id (the test fails on a
        conflict)."""
        (outcome,) = self.backend.insert_rows(
            [(instance_id, after, row(instance_id, count, after=after))]
        )
        assert isinstance(outcome, int), outcome
        return outcome

    # -- rows ---------------------------------------------------------------------------------

    def test_an_empty_store_has_no_rows(self) -> None:
        b = self.backend
        assert b.select_stream("a") == []
        assert b.stream_version("a") == 0
        assert b.select_rows(limit=10) == []
        assert (b.last_row_id(), b.newest_row_id()) == (0, 0)
        assert b.instances() == []
        assert b.select_heads() == {}

    def test_inserted_rows_come_back_as_they_were_given(self) -> None:
        given = row("a", 3)
        (row_id,) = self.backend.insert_rows([("a", 0, given)])
        assert isinstance(row_id, int)
        assert row_id > 0
        ((last, topic, state),) = self.backend.select_stream("a")
        assert (last, topic, bytes(state)) == (3, given.topic, given.state)
        assert self.backend.stream_version("a") == 3
        ((found_id, instance, last, topic, state),) = self.backend.select_rows(limit=10)
        assert (found_id, instance, last, topic, bytes(state)) == (
            row_id,
            "a",
            3,
            given.topic,
            given.state,
        )

    def test_row_ids_grow_with_every_insert(self) -> None:
        ids = [self.append("a", 1), self.append("b", 2), self.append("a", 1, after=1)]
        assert ids == sorted(ids)
        assert len(set(ids)) == 3
        assert self.backend.last_row_id() == ids[-1]
        assert self.backend.newest_row_id() >= ids[-1]
        assert self.backend.instances() == ["a", "b"]

    def test_a_row_whose_stream_moved_is_a_conflict_and_the_others_are_written(self) -> None:
        self.append("a", 2)
        outcomes = self.backend.insert_rows(
            [("a", 0, row("a", 1)), ("b", 0, row("b", 1)), ("a", 2, row("a", 1, after=2))]
        )
        conflict, written_b, written_a = outcomes
        assert isinstance(conflict, ConcurrencyConflictError)
        assert conflict.expected_version == 0
        assert conflict.actual_version in (2, 3)  # read after the transaction, or in it
        assert isinstance(written_b, int)
        assert isinstance(written_a, int)
        assert [r[0] for r in self.backend.select_stream("a")] == [2, 3]

    def test_a_stream_read_holds_the_rows_of_a_window(self) -> None:
        for after in range(0, 12, 3):  # rows ending at 3, 6, 9, 12
            self.append("a", 3, after=after)
        lasts = lambda **kw: [r[0] for r in self.backend.select_stream("a", **kw)]  # noqa: E731
        assert lasts() == [3, 6, 9, 12]
        assert lasts(after=3) == [6, 9, 12]
        assert lasts(after=4) == [6, 9, 12]  # the row holding 5 and 6
        assert lasts(after=4, upto=7) == [6, 9]  # up to the first row that reaches 7
        assert lasts(upto=6) == [3, 6]
        assert lasts(after=3, limit=2) == [6, 9]
        windows = [(0, 2), (4, 7), (11, 12)]
        found = self.backend.select_windows("a", windows)
        assert [plain(rows) for rows in found] == [
            plain(self.backend.select_stream("a", after=a, upto=u)) for a, u in windows
        ]

    def test_the_global_log_pages_by_row_id(self) -> None:
        ids = [self.append(name, 1) for name in "abcde"]
        rows = lambda **kw: [r[0] for r in self.backend.select_rows(**kw)]  # noqa: E731
        assert rows(limit=100) == ids
        assert rows(after=ids[1], limit=2) == ids[2:4]
        assert rows(after=ids[0], limit=100, upto=ids[2]) == ids[1:3]
        assert self.backend.row_id("c", 1) == ids[2]
        assert self.backend.row_id("c", 2) is None
        assert self.backend.last_positions() == dict.fromkeys("abcde", 1)

    def test_plain_rows_are_not_sealed(self) -> None:
        self.append("a", 1)
        assert self.backend.first_sealed_row() is None

    def test_each_insert_records_its_chain_head(self) -> None:
        first = row("a", 2)
        self.backend.insert_rows([("a", 0, first), ("b", 0, row("b", 1))])
        second = MAPPER.to_row(events("a", 1, after=2), first.head)
        self.backend.insert_rows([("a", 2, second)])
        assert self.backend.select_heads("a") == {"a": (3, second.head)}
        assert set(self.backend.select_heads()) == {"a", "b"}
        assert self.backend.select_heads("nobody") == {}

    # -- meta values and leases -----------------------------------------------------------------

    def test_a_meta_value_is_set_once_unless_replaced(self) -> None:
        b = self.backend
        assert b.read_meta("colour") is None
        b.write_meta("colour", "red")
        b.write_meta("colour", "blue")
        assert b.read_meta("colour") == "red"
        b.write_meta("colour", "blue", replace=True)
        assert b.read_meta("colour") == "blue"

    def test_a_lease_is_taken_renewed_replaced_and_released(self) -> None:
        b = self.backend
        assert b.read_lease("a") is None
        assert b.acquire_lease("a", "h1", expires=100, replace=None)
        assert not b.acquire_lease("a", "h2", expires=200, replace=None)
        assert not b.acquire_lease("a", "h2", expires=200, replace=("h1", 99))  # not exactly it
        assert b.renew_lease("a", "h1", expires=150)
        assert not b.renew_lease("a", "h2", expires=150)
        assert b.acquire_lease("a", "h2", expires=300, replace=("h1", 150))
        assert b.read_lease("a") == ("h2", 300)
        b.release_lease("a", "h1")  # not h1's: nothing changes
        assert b.read_lease("a") == ("h2", 300)
        b.release_lease("a", "h2")
        assert b.read_lease("a") is None
        assert not b.leases_missing()

    # -- maintenance, followers, errors ----------------------------------------------------------

    def test_a_rewrite_is_a_compare_and_set_on_the_state(self) -> None:
        self.append("a", 1)
        self.append("b", 1)
        ((_, old_topic, old_state),) = self.backend.select_stream("a")
        done = self.backend.rewrite_rows(
            [
                (old_topic, b'"new a"', "a", 1, bytes(old_state)),
                (old_topic, b'"new b"', "b", 1, b"not what it holds"),
            ]
        )
        assert done == [True, False]
        assert bytes(self.backend.select_stream("a")[0][2]) == b'"new a"'
        assert bytes(self.backend.select_stream("b")[0][2]) != b'"new b"'
        self.backend.compact()

    def test_a_follower_wait_ends_when_the_log_moved_or_when_stopped(self) -> None:
        """Both calls return at once: a backend that waited out its timeout instead would hold
        the test past pytest's own timeout (120 s) and fail it; no clock is read here."""
        stop = threading.Event()
        self.backend.wait_for_appends(newer=lambda: True, timeout=3600, stop=stop)
        stop.set()
        self.backend.wait_for_appends(newer=lambda: False, timeout=3600, stop=stop)

    def test_foreign_errors_are_classified_by_the_backend_table(self) -> None:
        foreign, ours = self.backend.errors[0]
        assert issubclass(ours, StoreError)
        found = self.backend.classify_error(foreign("boom"))
        assert found is not None
        assert issubclass(found[0], StoreError)
        assert self.backend.classify_error(ValueError("ours to raise")) is None
        assert self.backend.classify_error(StoreError("already ours")) is None
        translated = self.backend.translate_error(foreign("boom"), "do a thing")
        assert isinstance(translated, StoreError)
        assert "cannot do a thing" in str(translated)
