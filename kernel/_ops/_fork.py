"""Forks: a new instance that starts from another's committed state at a point of its log.

The fork's first event, ``InstanceForked``, carries the origin's committed values at that point
(the kernel's fold decides them, as for any reader) and the origin's latest checkpoint there, so
the fork can also be continued from it. The origin is read, never written.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

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
from kernel._run._ledger import Ledger, continued_run
from kernel._run._runner import Continuation

if TYPE_CHECKING:
    from kernel._ops._workflow import Workflow

__all__ = ["fork_instance", "position_of"]


def fork_instance(origin: Workflow, at: Any, instance_id: str) -> Workflow:
    """Append ``InstanceForked`` as ``instance_id``'s first event; return the workflow on it."""
    check_id(instance_id, "a fork's instance id", ExecutionError)
    if instance_id == origin.instance_id:
        raise ExecutionError(f"cannot fork instance {instance_id!r} into itself")
    store = origin.store
    events = store.read(origin.instance_id)
    position = position_of(events, at, origin.instance_id)
    prefix = events[:position]
    state = fold_committed(prefix)
    origin_run, checkpoint, requests = _continued_at(origin, prefix)
    event = InstanceForked(
        instance_id=instance_id,
        position=1,
        timestamp=origin._clock(),
        origin_instance=origin.instance_id,
        origin_position=position,
        checkpoint=checkpoint,
        origin_run=origin_run,
        values=dict(state.values),
        requests=requests,
    )
    try:
        store.append(instance_id, [event], expected_version=0)
    except ConcurrencyConflictError:
        raise ExecutionError(
            f"cannot fork into instance {instance_id!r}: it already has events; choose a new id"
        ) from None
    return origin._sibling(instance_id)


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
    origin: Workflow, prefix: list[EventBase]
) -> tuple[str | None, str | None, list[dict[str, Any]]]:
    """The run a fork of ``prefix`` would go on with, its checkpoint there, and the requests it
    left unanswered (as stored), by the same rule a continuation of the origin follows."""
    ledger = Ledger(origin.instance_id).apply_all(prefix)
    try:
        run_id, checkpoint = continued_run(ledger, Continuation(), origin.name)
    except ResumeError:
        return None, None, []  # no run at that point (or another workflow's): state only
    instance = origin._instance
    standing = ledger.standing(
        run_id,
        checkpoint,
        router=instance.router,
        codec=origin.store.codec,
        origin=instance.origin_ledger,
    )
    encode = origin.store.codec.encode
    requests = [
        {
            "request_id": request.request_id,
            "executor_id": request.executor_id,
            "response_type": request.response_type,
            "data": encode(request.data, what=f"request {request.request_id!r}"),
            "run_id": request.run_id,
            "superstep_id": request.superstep_id,
        }
        for request in standing.position.requests.values()
    ]
    return run_id, checkpoint, requests
