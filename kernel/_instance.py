"""The runner's seam: ``RunnerContext``, all a run needs from the workflow instance it runs on.

A ``Run`` (``kernel._runner``) talks to its instance through this one interface and nothing else:
the instance's settings, fresh ids and the time, its committed state, the log's view of which run
is unfinished and whether its process is gone, and appending a batch of events.
``InstanceContext`` is the implementation a ``Workflow`` gives its runs; it owns the instance's
fold of the log (committed state and the open run), and keeps it up to date with every append.
Resuming, checkpointing or running a sub-workflow plugs in here: anything that implements
``RunnerContext`` can host a run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

from kernel._clock import Clock, IdFactory
from kernel._codec import ValueCodec
from kernel._events import AbortReason, EventBase
from kernel._fold import CommittedState, OpenRun
from kernel._owner import presumed_reason
from kernel._store import EventStore

if TYPE_CHECKING:
    from kernel._algo import Router

__all__ = ["Durability", "InstanceContext", "RunnerContext"]

Durability = Literal["superstep", "write"]


class RunnerContext(Protocol):
    """What a run needs from its workflow instance (Agent Framework calls this ``RunnerContext``).

    Attributes are read-only for the run. Methods never block on anything but the store.
    """

    instance_id: str
    """The instance's stream: every event of the run goes there."""
    workflow_name: str
    """Recorded in ``RunStarted``."""
    router: Router
    """Routes the messages handlers send, over the workflow's graph."""
    max_supersteps: int
    durability: Durability
    codec: ValueCodec
    """Encodes and decodes state values, messages and outputs."""
    owner: str
    """This process as ``host:pid``, recorded in ``RunStarted.owner``."""
    clock: Clock
    """The time of the next event. The run refuses a naive datetime (``ExecutionError``)."""

    def new_id(self) -> str:
        """A fresh id, for a run or a superstep."""
        ...

    def committed(self, key: str, default: Any) -> Any:
        """The committed wire value (a JSON tree) of state ``key``, or ``default``."""
        ...

    def catch_up(self) -> OpenRun:
        """Fold whatever was appended since the last look, by anyone; return the open run view
        (``version`` is the stream's version, ``run_id`` an unfinished run's, if any)."""
        ...

    def presumed_reason(self, owner: str) -> AbortReason:
        """Why an unfinished run of ``owner`` (its ``RunStarted.owner``) stopped: ``crashed`` if
        its process is provably gone, else ``abandoned``."""
        ...

    def append(self, batch: Sequence[EventBase], *, expected_version: int) -> None:
        """Append ``batch`` atomically after ``expected_version`` and fold it into the view.

        Raises what the store raises (``ConcurrencyConflictError``, ``EncodingError``, ...);
        nothing of the batch is folded then, and the view stays what it was.
        """
        ...


class InstanceContext:
    """The ``RunnerContext`` of a workflow instance in a store: owns the instance's folded view."""

    def __init__(
        self,
        store: EventStore,
        instance_id: str,
        *,
        workflow_name: str,
        router: Router,
        max_supersteps: int,
        durability: Durability,
        clock: Clock,
        id_factory: IdFactory,
        owner: str,
    ) -> None:
        self.store = store
        self.instance_id = instance_id
        self.workflow_name = workflow_name
        self.router = router
        self.max_supersteps = max_supersteps
        self.durability: Durability = durability
        self.codec = store.codec
        self.owner = owner
        self.clock = clock
        self.new_id = id_factory
        self._committed = CommittedState()
        self._head = OpenRun()

    def committed(self, key: str, default: Any) -> Any:
        return self._committed.values.get(key, default)

    def committed_values(self) -> dict[str, Any]:
        """Every committed wire value, after catching up with the log."""
        self.catch_up()
        return dict(self._committed.values)

    def catch_up(self) -> OpenRun:
        events = self.store.read(self.instance_id, after=self._head.version)
        self._fold(events)
        return self._head

    def presumed_reason(self, owner: str) -> AbortReason:
        return presumed_reason(owner)

    def append(self, batch: Sequence[EventBase], *, expected_version: int) -> None:
        # Folded only once appended: a refused batch leaves the view as it was, a true fold of the
        # log up to ``version``. (If a failure was ambiguous and the batch did land, the next
        # ``catch_up`` reads it, and an append at the same positions is a version conflict.)
        self.store.append(self.instance_id, batch, expected_version=expected_version)
        self._fold(batch)

    def _fold(self, events: Sequence[EventBase]) -> None:
        committed, head = self._committed, self._head
        for event in events:
            committed.apply(event)
            head.apply(event)
