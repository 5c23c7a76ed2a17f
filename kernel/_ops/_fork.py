"""Forks: a new instance that starts from another's committed state at a point of its log.

``record_fork`` is the one writer of a fork's first event, ``InstanceForked``, for
``Workflow.fork``, ``fork_at`` (the CLI's, without the workflow) and sub-workflows alike. It
carries the origin's committed values at that point (the kernel's fold decides them, as for any
reader), the run a continuation of the origin would have gone on with there and its checkpoint
(``continued_run``), and the requests that run left unanswered, as the log recorded them
(``pending_wire``), so the fork can also be continued from it. The origin is read, never written.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from kernel._base._clock import Clock
from kernel._base._errors import ConcurrencyConflictError, ExecutionError, ResumeError
from kernel._base._ids import check_id
from kernel._log._events import (
    RUN_END_TYPES,
    SUPERSTEP_MARKER_TYPES,
    EventBase,
    InstanceForked,
    RunEvent,
    SuperstepEvent,
)
from kernel._log._fold import fold_committed
from kernel._run._ledger import Ledger, continued_run, pending_wire
from kernel._run._runner import Continuation
from kernel._store._eventstore import EventStore

__all__ = ["position_of", "record_fork"]


def record_fork(
    store: EventStore,
    origin: str,
    at: Any,
    instance_id: str,
    *,
    clock: Clock,
    workflow_name: str | None = None,
) -> InstanceForked:
    """Append the ``InstanceForked`` that starts ``instance_id`` from instance ``origin``'s
    committed state at ``at`` (a point, as ``position_of`` takes it); return it.

    ``workflow_name`` is the workflow forking (``Workflow.fork``): a run of another workflow at
    that point is not carried on, only the state. Without it (the log alone, as ``fork_at``),
    the run is carried on whichever workflow wrote it, and ``origin`` must have events.

    Raises ``ExecutionError`` for an ``instance_id`` that is not a valid id, is ``origin``, or
    already has events (or, without ``workflow_name``, when ``origin`` has none);
    ``ResumeError`` for a point that names nothing.
    """
    check_id(instance_id, "a fork's instance id", ExecutionError)
    if instance_id == origin:
        raise ExecutionError(f"cannot fork instance {instance_id!r} into itself")
    events = store.read(origin)
    if not events and workflow_name is None:
        raise ExecutionError(f"no instance {origin!r} in {store.url}")
    position = position_of(events, at, origin)
    prefix = events[:position]
    origin_run, checkpoint, requests = _continued_at(
        Ledger(origin).apply_all(prefix), workflow_name
    )
    event = InstanceForked(
        instance_id=instance_id,
        position=1,
        timestamp=clock(),
        origin_instance=origin,
        origin_position=position,
        checkpoint=checkpoint,
        origin_run=origin_run,
        values=dict(fold_committed(prefix).values),
        requests=requests,
    )
    try:
        store.append(instance_id, [event], expected_version=0)
    except ConcurrencyConflictError:
        raise ExecutionError(
            f"cannot fork into instance {instance_id!r}: it already has events; choose a new id"
        ) from None
    return event


def position_of(events: list[EventBase], at: Any, instance_id: str) -> int:
    """The stream position a point names in ``events`` (one instance's, in order)."""
    version = events[-1].position if events else 0
    point = at
    # projections' points, by shape (the kernel does not import projections)
    if hasattr(point, "position") and isinstance(point.position, int):
        point = point.position
    elif hasattr(point, "when") and isinstance(point.when, datetime):
        point = point.when
    elif hasattr(point, "superstep_id") and not hasattr(point, "run_id"):
        raise ResumeError(
            f"cannot fork at {at!r}: a fork starts from committed state, and inside a superstep "
            "is a state that may never have been committed; fork at the superstep "
            "(AtSuperstep, or its id) or at a position"
        )
    elif getattr(point, "superstep_id", None) is not None:
        point = point.superstep_id
    elif hasattr(point, "run_id") and hasattr(point, "index"):
        return _superstep_index(events, point.run_id, point.index, instance_id)
    if isinstance(point, bool):
        raise ResumeError(f"not a point of a log: {at!r}")
    if isinstance(point, int):
        if not 0 <= point <= version:
            raise ResumeError(
                f"position {point} is outside instance {instance_id!r}'s log (0..{version})"
            )
        return point
    if isinstance(point, datetime):
        found = 0
        for event in events:
            if event.timestamp > point:
                break
            found = event.position
        return found
    if isinstance(point, str):
        marker = next(
            (
                e.position
                for e in events
                if e.type in SUPERSTEP_MARKER_TYPES
                and isinstance(e, SuperstepEvent)
                and e.superstep_id == point
            ),
            None,
        )
        if marker is not None:
            return marker
        last = None
        for event in events:
            if isinstance(event, RunEvent) and event.run_id == point:
                last = event.position
                if event.type in RUN_END_TYPES:
                    break
        if last is not None:
            return last
        raise ResumeError(f"instance {instance_id!r} has no superstep or run {point!r} that closed")
    raise ResumeError(
        f"not a point of a log: {at!r} (use a position, a superstep or run id, or a datetime)"
    )


def _superstep_index(events: list[EventBase], run_id: str, index: int, instance_id: str) -> int:
    superstep_id = next(
        (
            e.superstep_id
            for e in events
            if e.type == "superstep_started"
            and isinstance(e, SuperstepEvent)
            and e.run_id == run_id
            and getattr(e, "index", None) == index
        ),
        None,
    )
    if superstep_id is None:
        raise ResumeError(f"instance {instance_id!r} has no superstep {index} in run {run_id!r}")
    return position_of(events, superstep_id, instance_id)


def _continued_at(
    ledger: Ledger, workflow_name: str | None
) -> tuple[str | None, str | None, list[dict[str, Any]]]:
    """The run a fork of ``ledger``'s log would go on with, its checkpoint there, and the
    requests it left unanswered (as stored), by the rule a continuation of the origin follows."""
    line = ledger.last_run()
    forked = ledger.forked
    if line is None:  # a fork that has not run: its fork goes on with what it inherited
        if forked is None:
            return None, None, []
        return forked.origin_run, forked.checkpoint, list(forked.requests)
    try:
        run_id, checkpoint = continued_run(
            ledger,
            Continuation(),
            line.started.workflow_name if workflow_name is None else workflow_name,
        )
    except ResumeError:
        return None, None, []  # another workflow's run: state only
    inherited = list(forked.requests) if forked is not None else []
    pending = pending_wire(ledger, run_id, checkpoint, forked_requests=inherited)
    return run_id, checkpoint, list(pending.values())
