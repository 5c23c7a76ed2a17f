"""The in-memory adapter: eventsourcing's POPO recorder, for tests and throwaway runs."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any

from eventsourcing.persistence import IntegrityError
from eventsourcing.popo import POPOApplicationRecorder

from kernel._base._errors import ConcurrencyConflictError, StoreConfigError
from kernel._codec._hashing import ChainedRow
from kernel._store._backend import Insert, LogRow, RowBackend, RowChange, StreamRow
from kernel._store._eventstore import EventStore

__all__ = ["MemoryBackend", "MemoryStore"]


class MemoryBackend(RowBackend):
    """Rows in eventsourcing's POPO recorder; heads, meta values and leases in dicts. Appends
    wake followers in this process at once."""

    where = "memory://"

    def __init__(self) -> None:
        self.recorder: POPOApplicationRecorder = POPOApplicationRecorder()
        self._insert_lock = threading.Lock()
        self._instances: set[str] = set()
        self._appended = threading.Condition()
        self._heads: dict[str, tuple[int, bytes]] = {}
        self._meta: dict[str, str] = {}
        self._leases: dict[str, tuple[str, int]] = {}  # instance id -> (holder, expires in µs)
        self._leases_lock = threading.Lock()

    # -- rows ---------------------------------------------------------------------------------

    def insert_rows(self, rows: Sequence[Insert]) -> list[int | ConcurrencyConflictError]:
        """One by one, each version checked under a lock (there is no commit to share)."""
        outcomes: list[int | ConcurrencyConflictError] = []
        for instance_id, expected, row in rows:
            try:
                outcomes.append(self._insert(instance_id, expected, row))
            except ConcurrencyConflictError as conflict:
                outcomes.append(conflict)
        return outcomes

    def _insert(self, instance_id: str, expected_version: int, row: Any) -> int:
        with self._insert_lock:
            actual = self.stream_version(instance_id)
            if actual != expected_version:
                raise ConcurrencyConflictError(instance_id, expected_version, actual)
            try:
                self.recorder.insert_events([row])
            except IntegrityError as error:
                raise ConcurrencyConflictError(
                    instance_id, expected_version, self.stream_version(instance_id)
                ) from error
            if isinstance(row, ChainedRow):
                self._heads[instance_id] = (row.originator_version, row.head)
            row_id = self.last_row_id()
        with self._appended:
            self._instances.add(instance_id)
            self._appended.notify_all()
        return row_id

    def select_stream(
        self,
        instance_id: str,
        *,
        after: int | None = None,
        upto: int | None = None,
        limit: int | None = None,
    ) -> list[StreamRow]:
        rows: list[StreamRow] = []
        for s in self.recorder.select_events(instance_id, gt=after):
            rows.append((s.originator_version, s.topic, s.state))
            if (upto is not None and s.originator_version >= upto) or (
                limit is not None and len(rows) >= limit
            ):
                break
        return rows

    def stream_version(self, instance_id: str) -> int:
        last = self.recorder.select_events(instance_id, desc=True, limit=1)
        return last[0].originator_version if last else 0

    def select_rows(self, *, after: int = 0, limit: int, upto: int | None = None) -> list[LogRow]:
        notes = self.recorder.select_notifications(
            start=after, limit=limit, stop=upto, inclusive_of_start=False
        )
        return [(n.id, str(n.originator_id), n.originator_version, n.topic, n.state) for n in notes]

    def last_row_id(self) -> int:
        return int(self.recorder.max_notification_id() or 0)

    def instances(self) -> list[str]:
        with self._appended:
            return sorted(self._instances)

    def select_heads(self, instance_id: str | None = None) -> dict[str, tuple[int, bytes]]:
        if instance_id is None:
            return dict(self._heads)
        found = self._heads.get(instance_id)
        return {} if found is None else {instance_id: found}

    def read_meta(self, key: str) -> str | None:
        return self._meta.get(key)

    def write_meta(self, key: str, value: str, *, replace: bool = False) -> None:
        if replace:
            self._meta[key] = value
        else:
            self._meta.setdefault(key, value)

    # -- leases -------------------------------------------------------------------------------

    def acquire_lease(
        self, instance_id: str, holder: str, *, expires: int, replace: tuple[str, int] | None
    ) -> bool:
        with self._leases_lock:
            stored = self._leases.get(instance_id)
            if stored is not None and stored[0] != holder and stored != replace:
                return False
            self._leases[instance_id] = (holder, expires)
            return True

    def renew_lease(self, instance_id: str, holder: str, *, expires: int) -> bool:
        with self._leases_lock:
            stored = self._leases.get(instance_id)
            if stored is None or stored[0] != holder:
                return False
            self._leases[instance_id] = (holder, expires)
            return True

    def release_lease(self, instance_id: str, holder: str) -> None:
        with self._leases_lock:
            stored = self._leases.get(instance_id)
            if stored is not None and stored[0] == holder:
                del self._leases[instance_id]

    def read_lease(self, instance_id: str) -> tuple[str, int] | None:
        with self._leases_lock:
            return self._leases.get(instance_id)

    # -- maintenance and followers ------------------------------------------------------------

    def rewrite_rows(self, changes: Sequence[RowChange]) -> list[bool]:
        recorder: Any = self.recorder  # the POPO recorder's own list and index: this adapter's
        written = []
        with recorder._database_lock:
            for topic, state, instance_id, last, old in changes:
                index = recorder._stored_events_index[instance_id].get(last)
                found = index is not None and recorder._stored_events[index].state == old
                if found:
                    stored = recorder._stored_events[index]
                    recorder._stored_events[index] = dataclasses.replace(
                        stored, topic=topic, state=state
                    )
                written.append(found)
        return written

    def wait_for_appends(
        self, *, newer: Callable[[], bool], timeout: float, stop: threading.Event
    ) -> None:
        with self._appended:
            if not newer() and not stop.is_set():
                self._appended.wait(timeout)


class MemoryStore(EventStore):
    """Events kept in this process only. ``memory://`` takes no options.

    A memory store is always new and empty, so ``create`` changes nothing: with ``create=False``
    it is not refused (nothing is created anywhere), and it holds no events.
    """

    def __init__(self, url: str = "memory://", *, create: bool = True, **options: Any) -> None:
        if options:
            raise StoreConfigError(f"memory:// takes no options, got {sorted(options)}")
        super().__init__(MemoryBackend(), url="memory://")
