"""The in-memory adapter: eventsourcing's POPO recorder, for tests and throwaway runs."""

from __future__ import annotations

import threading
from typing import Any

from eventsourcing.popo import POPOApplicationRecorder

from kernel._errors import StoreConfigError
from kernel._store import EventStore

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
