"""Lineage across instances, read from a store: the forks of an instance, and its history with
them; the sub-workflows a parent's supersteps ran, and the parent superstep of a sub-workflow.

A fork's ``InstanceForked`` is the first event of the *fork's* stream, so a fold of one instance
sees where it came from (``RunHistory.forked_from``) but not what was forked from it. These
readers look across the store's instances for forks of a given origin; the ``history`` view keeps
the same records under the origin (``Projector.forks``, ``Projector.history``).

A sub-workflow (``kernel.WorkflowExecutor``) is an instance of its own, linked both ways: the
parent's ``SubworkflowRan`` names the child instance and run, the child's
``SubworkflowStarted`` names the parent instance, run and superstep. ``subworkflows_of`` walks
from a parent (or one of its supersteps) to its children, ``parent_of`` from a child back, each
link with the verdict the kernel's marker rule gives it in the parent's log: what a child
produced reached the parent only if that superstep committed. Blame, time travel and history
of a child are those of any instance.

Example::

    history = history_of(store, "order-42")
    print(history.forked_from, [fork.instance_id for fork in history.forks()])
    for link in subworkflows_of(store, "order-42"):
        print(link.parent_superstep, link.child_instance, link.verdict)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from kernel import (
    EventStore,
    InstanceForked,
    SubworkflowRan,
    SubworkflowStarted,
    SuperstepEvent,
    SuperstepFold,
    folds,
)
from projections._folds._history import RunHistory, fold_history, fork_record
from projections._folds._runrecords import ForkRecord

__all__ = [
    "LinkVerdict",
    "SubworkflowLink",
    "forks_of",
    "history_of",
    "parent_of",
    "subworkflows_of",
]

_FORKED = frozenset({"instance_forked"})
_STARTED = frozenset({"subworkflow_started"})

LinkVerdict = Literal["committed", "aborted", "open"]
"""What a parent's superstep made of the sub-workflow run it ran: ``committed`` (its outputs and
requests reached the parent), ``aborted`` (they never count: the superstep aborted, or its run
ended without a marker), ``open`` (the superstep has no marker yet)."""


@dataclass(frozen=True)
class SubworkflowLink:
    """One sub-workflow run, as the parent's log records it.

    ``position`` is the ``SubworkflowRan`` event's position in the parent's stream (0 when the
    parent's log does not record the run: its process died while the child ran); ``requests``
    the child's requests still waiting when its run ended; ``continues`` the child instance this
    one was forked from to take a response (None for a fresh child).
    """

    parent_instance: str
    parent_run: str
    parent_superstep: str
    executor_id: str
    child_instance: str
    child_run: str
    position: int
    verdict: LinkVerdict
    requests: tuple[str, ...] = ()
    continues: str | None = None


class _Links(SuperstepFold):
    """The parent's links, each with its verdict by the kernel's marker rule."""

    __slots__ = ("decided", "ended", "found", "late")

    def __init__(self) -> None:
        super().__init__()
        self.found: list[SubworkflowRan] = []
        self.late: set[int] = set()  # positions of links staged after their superstep's marker
        self.decided: dict[str, bool] = {}  # superstep id -> committed?
        self.ended: set[str] = set()

    @folds("subworkflow_ran")
    def _ran(self, event: SubworkflowRan) -> None:
        self.found.append(event)
        if not self._stage(event):
            self.late.add(event.position)

    def _decided(self, marker: SuperstepEvent, committed: bool, items: list[Any]) -> None:
        self.decided[marker.superstep_id] = committed

    def verdict(self, link: SubworkflowRan) -> LinkVerdict:
        if link.position in self.late:
            return "aborted"
        return self.verdict_of(link.run_id, link.superstep_id)

    def verdict_of(self, run_id: str, superstep_id: str) -> LinkVerdict:
        """What the marker rule says of superstep ``superstep_id`` of run ``run_id``."""
        committed = self.decided.get(superstep_id)
        if committed is not None:
            return "committed" if committed else "aborted"
        return "aborted" if run_id in self._ended_runs else "open"


def _links(store: EventStore, instance_id: str) -> _Links:
    return _Links().apply_all(store.read(instance_id, types=_Links.EVENT_TYPES))


def subworkflows_of(
    store: EventStore, instance_id: str, *, superstep_id: str | None = None
) -> list[SubworkflowLink]:
    """The sub-workflow runs that ``instance_id``'s supersteps ran (only ``superstep_id``'s, if
    given), in log order, each with its verdict. Reads the parent's log only."""
    fold = _links(store, instance_id)
    return [
        SubworkflowLink(
            instance_id,
            link.run_id,
            link.superstep_id,
            link.executor_id,
            link.child_instance,
            link.child_run,
            link.position,
            fold.verdict(link),
            tuple(link.requests),
            link.continues,
        )
        for link in fold.found
        if superstep_id is None or link.superstep_id == superstep_id
    ]


def parent_of(store: EventStore, instance_id: str) -> SubworkflowLink | None:
    """The parent superstep that ran sub-workflow instance ``instance_id`` (None if it is no
    sub-workflow), from the child's ``SubworkflowStarted`` and the parent's log."""
    started = next(
        (e for e in store.read(instance_id, types=_STARTED) if isinstance(e, SubworkflowStarted)),
        None,
    )
    if started is None:
        return None
    for link in subworkflows_of(
        store, started.parent_instance, superstep_id=started.parent_superstep
    ):
        if link.child_instance == instance_id and link.child_run == started.run_id:
            return link
    # The parent's log does not record the run it started (its process died while the child
    # ran, or the superstep is still open): the link's verdict is the superstep's own.
    verdict = _links(store, started.parent_instance).verdict_of(
        started.parent_run, started.parent_superstep
    )
    return SubworkflowLink(
        started.parent_instance,
        started.parent_run,
        started.parent_superstep,
        started.executor_id,
        instance_id,
        started.run_id,
        0,
        verdict,
    )


def forks_of(store: EventStore, origin_instance: str) -> list[ForkRecord]:
    """The instances of ``store`` forked from ``origin_instance``, oldest first.

    Reads the first event of every instance, and decodes only fork events.
    """
    found = []
    for name in store.instances():
        for event in store.read(name, upto=1, types=_FORKED):
            if isinstance(event, InstanceForked) and event.origin_instance == origin_instance:
                found.append(fork_record(event))
    return sorted(found, key=lambda fork: (fork.forked_at, fork.instance_id))


def history_of(store: EventStore, instance_id: str) -> RunHistory:
    """The run history of ``instance_id`` in ``store``, with its forks (``forks_of``): only the
    event types the history folds are decoded."""
    events = store.read(instance_id, types=RunHistory.EVENT_TYPES)
    return fold_history(events, RunHistory(forks=forks_of(store, instance_id)))
