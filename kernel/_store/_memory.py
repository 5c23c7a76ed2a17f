"""The in-memory adapter: eventsourcing's POPO recorder, for tests and throwaway runs."""

from __future__ import annotations

import threading
from typing import Any

from eventsourcing.popo import POPOApplicationRecorder

from kernel._base._errors import StoreConfigError
from kernel._store._eventstore import EventStore

__all__ = ["MemoryStore"]


class MemoryStore(EventStore):
    """Events kept in this process only. ``memory://`` takes no options.

    A memory store is always new and empty, so ``create`` changes nothing: with ``create=False``
    it is not refused (nothing is created anywhere), and it holds no events.
    """

    def __init__(self, url: str = "memory://", *, create: bool = True, **options: Any) -> None:
        if options:
            raise StoreConfigError(f"memory:// takes no options, got {sorted(options)}")
        super().__init__(POPOApplicationRecorder(), url="memory://")
        self._instances: set[str] = set()
        self._appended = threading.Condition()
        self._leases: dict[str, tuple[str, int]] = {}  # instance id -> (holder, expires in µs)
        self._leases_lock = threading.Lock()

    def _after_append(self, instance_id: str) -> None:
        with self._appended:
            self._instances.add(instance_id)
            self._appended.notify_all()

    def _wait_for_appends(self, position: int, timeout: float, stop: threading.Event) -> None:
        with self._appended:
            if self.last_position() <= position and not stop.is_set():
                self._appended.wait(timeout)

    def instances(self) -> list[str]:
        with self._translated("list instances"), self._appended:
            return sorted(self._instances)

    # -- leases -------------------------------------------------------------------------------

    def _acquire_lease(
        self, instance_id: str, holder: str, expires: int, replace: tuple[str, int] | None
    ) -> bool:
        with self._leases_lock:
            stored = self._leases.get(instance_id)
            if stored is not None and stored[0] != holder and stored != replace:
                return False
            self._leases[instance_id] = (holder, expires)
            return True

    def _renew_lease(self, instance_id: str, holder: str, expires: int) -> bool:
        with self._leases_lock:
            stored = self._leases.get(instance_id)
            if stored is None or stored[0] != holder:
                return False
            self._leases[instance_id] = (holder, expires)
            return True

    def _release_lease(self, instance_id: str, holder: str) -> None:
        with self._leases_lock:
            stored = self._leases.get(instance_id)
            if stored is not None and stored[0] == holder:
                del self._leases[instance_id]

    def _read_lease(self, instance_id: str) -> tuple[str, int] | None:
        with self._leases_lock:
            return self._leases.get(instance_id)
