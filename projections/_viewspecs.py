"""How a pure fold becomes a materialized view: load its per-instance state, fold, save.

A ``ViewSpec`` folds the events of one instance at a time. ``Projector`` calls ``load`` for each
instance a page touches, ``apply`` for each of its events, then ``save``, all inside the page's
transaction, so the spec itself never does I/O outside that transaction.

The document views (``state``, ``history``, ``blame``) keep one JSON document per instance under
the key ``"view"``: the kernel's committed state (``CommittedState.to_snapshot()``),
``RunHistory.to_json()`` and ``KeyBlame.to_json()``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from kernel._events import EventBase
from kernel._fold import CommittedState
from projections._backends import ViewTx
from projections._blame import KeyBlame
from projections._history import RunHistory

__all__ = ["BlameView", "DocumentView", "HistoryView", "StateView", "ViewSpec"]

DOC_KEY = "view"


class ViewSpec(ABC):
    """A materialized view: its ``name`` and how to fold events into its rows."""

    name: ClassVar[str]

    @property
    def table(self) -> str:
        """The view's table."""
        return f"steplog_view_{self.name}"

    @abstractmethod
    def load(self, tx: ViewTx, table: str, instance_id: str) -> Any:
        """The fold state of ``instance_id`` stored in ``table`` (a fresh one if none)."""

    @abstractmethod
    def apply(self, state: Any, event: EventBase) -> Any:
        """Fold one event in (pure); return the state."""

    @abstractmethod
    def save(self, tx: ViewTx, table: str, instance_id: str, state: Any) -> None:
        """Write the rows of ``instance_id``."""


class DocumentView(ViewSpec):
    """A view kept as one JSON document per instance."""

    @abstractmethod
    def new(self) -> Any:
        """An empty fold state."""

    @abstractmethod
    def from_json(self, doc: Any) -> Any:
        """A fold state from its document."""

    @abstractmethod
    def to_json(self, state: Any) -> Any:
        """The document of a fold state."""

    def load(self, tx: ViewTx, table: str, instance_id: str) -> Any:
        doc = tx.get(table, instance_id, DOC_KEY)
        return self.new() if doc is None else self.from_json(doc)

    def apply(self, state: Any, event: EventBase) -> Any:
        return state.apply(event)

    def save(self, tx: ViewTx, table: str, instance_id: str, state: Any) -> None:
        tx.put(table, instance_id, DOC_KEY, self.to_json(state))


class StateView(DocumentView):
    """Committed state per instance, by the kernel's own fold."""

    name = "state"

    def new(self) -> CommittedState:
        return CommittedState()

    def from_json(self, doc: Any) -> CommittedState:
        return CommittedState.from_snapshot(doc)

    def to_json(self, state: Any) -> Any:
        return state.to_snapshot()


class HistoryView(DocumentView):
    """Run history per instance (``RunHistory``)."""

    name = "history"

    def new(self) -> RunHistory:
        return RunHistory()

    def from_json(self, doc: Any) -> RunHistory:
        return RunHistory.from_json(doc)

    def to_json(self, state: Any) -> Any:
        return state.to_json()


class BlameView(DocumentView):
    """Key provenance per instance (``KeyBlame``)."""

    name = "blame"

    def new(self) -> KeyBlame:
        return KeyBlame()

    def from_json(self, doc: Any) -> KeyBlame:
        return KeyBlame.from_json(doc)

    def to_json(self, state: Any) -> Any:
        return state.to_json()
