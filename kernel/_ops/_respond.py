"""Answering and forking from the log alone, without the workflow's executors (the CLI's case).

``record_response`` records a response to a pending request as the runner records one: a run
that ``continues`` the instance's last run from its latest checkpoint, its ``ResponseReceived``,
and, since nothing executes here, a ``RunAwaitingInput`` end. The next ``resume()`` (or
``run(checkpoint_id=...)``) of the workflow continues that run and delivers the response, as it
delivers again the responses of a continuation that crashed before it committed.

``fork_at`` is ``Workflow.fork`` for a reader that has no workflow: the same ``InstanceForked``,
written by the same ``record_fork``.

Which requests are pending follows the lineage the continuation would follow (``continued_run``
and the run chain of ``Ledger.standing``): requests made by committed supersteps, less the ones
answered by a later run of the chain. No message is routed, so no graph is needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kernel._base._clock import Clock, IdFactory, system_clock, uuid_ids
from kernel._base._errors import (
    ConcurrencyConflictError,
    ExecutionError,
    ResponseError,
    ResumeError,
)
from kernel._codec._values import ValueCodec
from kernel._log._events import (
    EventBase,
    InstanceForked,
    ResponseReceived,
    RunAwaitingInput,
    RunStarted,
)
from kernel._ops._fork import record_fork
from kernel._ops._replay import find_run
from kernel._run._ledger import Ledger, continued_run, pending_wire
from kernel._run._runner import Continuation
from kernel._store._eventstore import EventStore
from kernel._store._owner import process_owner

__all__ = ["RecordedResponse", "fork_at", "record_response"]

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "bool": (bool,),
    "int": (int,),
    "float": (int, float),
    "str": (str,),
    "list": (list,),
    "dict": (dict,),
}
"""The response types a value given as JSON can be checked against (by their logged names)."""


@dataclass(frozen=True, slots=True)
class RecordedResponse:
    """Where ``record_response`` recorded a response: the new run (``run_id``) of
    ``instance_id`` at stream positions ``first_position..last_position``."""

    instance_id: str
    run_id: str
    request_id: str
    first_position: int
    last_position: int


def _ledger(events: list[EventBase], instance_id: str) -> Ledger:
    return Ledger(instance_id).apply_all(events)


def record_response(
    store: EventStore,
    run_id: str,
    request_id: str,
    value: Any,
    *,
    instance_id: str | None = None,
    clock: Clock = system_clock,
    id_factory: IdFactory = uuid_ids,
) -> RecordedResponse:
    """Record ``value`` as the response to request ``request_id`` of run ``run_id`` (the
    instance's last run, ended), for the workflow to continue with at its next ``resume()``.
    A fork that has not run yet holds copies of the requests its origin's run left waiting: to
    answer the fork's copy, pass ``instance_id`` (the fork) and the origin's run as ``run_id``,
    as ``run(responses=...)`` on the fork's workflow would; the origin is untouched.

    Checked before anything is appended: ``ResumeError`` when the run is not the instance's last
    or is still open; ``ResponseError`` for a request that is not pending (unknown, or answered
    already) or a value that is not of the request's response type. Only requests for JSON types
    (``bool``, ``int``, ``float``, ``str``, ``list``, ``dict``, or any) can be answered here;
    one for a class of the workflow is answered with ``run(responses=...)``. Raises
    ``ExecutionError`` when another process appended to the instance meanwhile (nothing is
    appended then; try again).
    """
    instance = instance_id if instance_id is not None else find_run(store, run_id)
    events = store.read(instance)
    ledger = _ledger(events, instance)
    line = ledger.last_run()
    forked = ledger.forked
    if line is None and forked is not None and forked.origin_run == run_id:
        # a fork that has not run goes on with its origin's run, as run(responses=...) on the
        # fork's workflow does: its copies of the origin's requests are answered here
        start = _origin_start(store, forked)
        supersteps = 0
    elif line is None or line.run_id != run_id:
        if ledger.runs.get(run_id) is None:
            origin = (
                f" (it is a fork that has not run: answer the requests it inherited with the "
                f"origin's run {forked.origin_run})"
                if line is None and forked is not None and forked.origin_run is not None
                else ""
            )
            raise ResumeError(f"instance {instance!r} has no run {run_id!r}{origin}")
        assert line is not None
        raise ResumeError(
            f"run {run_id} of {instance!r} cannot be answered: run {line.run_id} started after "
            "it, and only an instance's last run goes on"
        )
    elif line.end is None:
        raise ResumeError(
            f"run {run_id} of {instance!r} is still open: answer it once it has stopped "
            "(if its process died, 'steplog recover' closes it)"
        )
    else:
        start = line.started
        supersteps = getattr(line.end, "supersteps", 0)
    continued, checkpoint = continued_run(ledger, Continuation(), start.workflow_name)
    forked_requests = forked.requests if forked is not None else []
    pending = pending_wire(ledger, continued, checkpoint, forked_requests=forked_requests)
    request = pending.get(request_id)
    if request is None:
        answered = any(
            r.request_id == request_id for run in ledger.runs.values() for r in run.responses
        )
        if answered:
            raise ResponseError(
                f"request {request_id!r} of instance {instance!r} was already answered; a "
                "request takes one response"
            )
        raise ResponseError(
            f"instance {instance!r} has no pending request {request_id!r} (pending: "
            f"{', '.join(pending) or 'none'})"
        )
    wanted = request["response_type"]
    if wanted:
        kinds = _JSON_TYPES.get(wanted)
        if kinds is None:
            raise ResponseError(
                f"request {request_id!r} asks for a {wanted}, which a JSON value cannot be "
                "checked against: answer it with the workflow, run(responses={...})"
            )
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise ResponseError(
                f"the response to request {request_id!r} must be a {wanted}; got a "
                f"{type(value).__qualname__}"
            )
    wire = ValueCodec().encode(value, what=f"the response to request {request_id!r}")
    new_run = id_factory()
    version = events[-1].position
    now = clock()
    remaining = [rid for rid in pending if rid != request_id]
    batch: list[EventBase] = [
        RunStarted(
            position=version + 1,
            workflow_name=start.workflow_name,
            kwargs=dict(start.kwargs),
            owner=process_owner(),
            durability=start.durability,
            continues=continued,
            checkpoint=checkpoint,
            sensitive_keys=list(start.sensitive_keys),
            instance_id=instance,
            run_id=new_run,
            timestamp=now,
        ),
        ResponseReceived(
            instance_id=instance,
            run_id=new_run,
            timestamp=now,
            position=version + 2,
            request_id=request_id,
            value=wire,
        ),
        RunAwaitingInput(
            instance_id=instance,
            run_id=new_run,
            timestamp=now,
            position=version + 3,
            supersteps=supersteps,
            requests=remaining,
        ),
    ]
    try:
        store.append(instance, batch, expected_version=version)
    except ConcurrencyConflictError:
        raise ExecutionError(
            f"instance {instance!r} changed while the response was being recorded; nothing was "
            "appended: try again"
        ) from None
    return RecordedResponse(instance, new_run, request_id, version + 1, version + 3)


def _origin_start(store: EventStore, forked: InstanceForked) -> RunStarted:
    """The ``RunStarted`` of the origin's run a fork goes on with (its workflow, arguments and
    settings, which a continuation inherits). Raises ``ResumeError`` if the origin's log does
    not hold it."""
    for event in store.read(
        forked.origin_instance, upto=forked.origin_position, types=("run_started",)
    ):
        if isinstance(event, RunStarted) and event.run_id == forked.origin_run:
            return event
    raise ResumeError(
        f"instance {forked.instance_id!r} was forked from run {forked.origin_run} of "
        f"{forked.origin_instance!r}, whose log does not hold that run's start"
    )


def fork_at(
    store: EventStore,
    instance_id: str,
    at: Any,
    new_instance_id: str,
    *,
    clock: Clock = system_clock,
) -> InstanceForked:
    """Append the ``InstanceForked`` that starts ``new_instance_id`` from ``instance_id``'s
    committed state at ``at`` (as ``Workflow.fork`` takes it), without the workflow; return it.
    Raises ``ExecutionError`` if ``new_instance_id`` already has events, ``ResumeError`` for a
    point that names nothing."""
    return record_fork(store, instance_id, at, new_instance_id, clock=clock)
