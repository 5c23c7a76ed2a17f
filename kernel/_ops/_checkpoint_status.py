"""What the log alone says of an instance's checkpoints, without the workflow (the CLI's case).

``Workflow.checkpoints()`` gives each checkpoint's ``status`` from where the instance's last run
stands, which it rebuilds with the workflow's graph (a message to a fan-in waits in its buffer)
and value types. ``checkpoint_statuses`` gives the statuses the log says by itself, and None
where only that rebuild could tell; what it gives is what ``Workflow.checkpoints()`` gives:

* every checkpoint but the latest is ``superseded``;
* the latest is ``running`` while the last run is open (and its process not provably gone);
* ``completed`` if the last run committed it and then completed (the runner completes a run
  only when nothing is left to deliver and no request waits);
* ``awaiting_input`` if the last run committed it and then ended waiting for input;
* ``resumable`` if the last run committed it and then started a superstep that did not commit
  (the runner starts one only with messages to deliver).

Otherwise (a last run that committed nothing, such as a recorded response's; a fork never
run; a run that failed between supersteps) the status is None. Reading never writes.

``logged_checkpoints`` gives the checkpoints themselves with those statuses, from the same one
read and fold of the log (what ``steplog checkpoints`` prints): the list is
``Workflow.checkpoints()``'s, with a fork's origin checkpoint as its ``InstanceForked`` names it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from kernel._run._ledger import CheckpointStatus, Ledger
from kernel._store._eventstore import EventStore
from kernel._store._owner import presumed_reason

__all__ = ["LoggedCheckpoint", "checkpoint_statuses", "ledger_statuses", "logged_checkpoints"]

_WINDOW = 5000  # stream positions per read


def checkpoint_statuses(store: EventStore, instance_id: str) -> dict[str, CheckpointStatus | None]:
    """The status of each checkpoint (committed superstep) of ``instance_id``, by checkpoint id,
    oldest first, as the log alone says it (None: only ``Workflow.checkpoints()`` can say; see
    the module docstring). A fork that committed nothing has one: the origin's checkpoint it was
    forked at. The log is read a window at a time (the events are never all in memory at once).
    Raises what ``store.read`` raises."""
    return ledger_statuses(_ledger(store, instance_id))


@dataclass(frozen=True, slots=True)
class LoggedCheckpoint:
    """A checkpoint as the log alone says it (``logged_checkpoints``).

    ``checkpoint_id`` is the committed superstep's id, ``run_id`` its run, ``index`` its index in
    the run, ``timestamp`` and ``position`` its commit marker's. For a fork that has committed
    nothing, the origin's checkpoint it was forked at: ``instance_id`` is the origin, ``run_id``
    the origin's run, ``index`` None (it is in the origin's log), ``position`` the origin's
    position and ``timestamp`` the fork's. ``status`` is ``checkpoint_statuses``'s (None where
    only ``Workflow.checkpoints()`` can say); ``latest`` marks the last, where a run goes on."""

    checkpoint_id: str
    instance_id: str
    run_id: str | None
    index: int | None
    timestamp: datetime
    position: int
    status: CheckpointStatus | None
    latest: bool = False


def logged_checkpoints(store: EventStore, instance_id: str) -> list[LoggedCheckpoint]:
    """The checkpoints of ``instance_id``, oldest first, each with its status as the log alone
    says it: ``Workflow.checkpoints()``'s list and ``checkpoint_statuses``' statuses, from one
    read and one fold of the log (a window at a time). Raises what ``store.read`` raises."""
    ledger = _ledger(store, instance_id)
    statuses = ledger_statuses(ledger)
    found = [
        LoggedCheckpoint(
            step.superstep_id,
            instance_id,
            step.run_id,
            step.index,
            step.timestamp,
            step.position,
            statuses.get(step.superstep_id),
        )
        for step in ledger.checkpoints
    ]
    forked = ledger.forked
    if not found and forked is not None and forked.checkpoint is not None:
        found.append(
            LoggedCheckpoint(
                forked.checkpoint,
                forked.origin_instance,
                forked.origin_run,
                None,
                forked.timestamp,
                forked.origin_position,
                statuses.get(forked.checkpoint),
            )
        )
    if found:
        found[-1] = replace(found[-1], latest=True)
    return found


def _ledger(store: EventStore, instance_id: str) -> Ledger:
    """The instance's ``Ledger``, folded from ``store`` a window at a time."""
    ledger = Ledger(instance_id)
    end = store.version(instance_id)
    for after in range(0, end, _WINDOW):
        ledger.apply_all(
            store.read(instance_id, after=after, upto=after + _WINDOW, types=Ledger.EVENT_TYPES)
        )
    return ledger


def ledger_statuses(ledger: Ledger) -> dict[str, CheckpointStatus | None]:
    """``checkpoint_statuses`` of an instance's folded ``Ledger``."""
    found: dict[str, CheckpointStatus | None] = {
        step.superstep_id: "superseded" for step in ledger.checkpoints
    }
    latest = ledger.latest
    if latest is None:
        return found
    found.pop(latest, None)
    found[latest] = _latest(ledger, latest)
    return found


def _latest(ledger: Ledger, latest: str) -> CheckpointStatus | None:
    line = ledger.last_run()
    if line is None:
        return None
    if line.end is None and presumed_reason(line.started.owner) != "crashed":
        return "running"  # open, and its process may be alive
    if not line.steps or line.steps[-1].superstep_id != latest:
        return None
    if ledger.tried_after(line):
        return "resumable"
    end = None if line.end is None else line.end.type
    if end == "run_completed":
        return "completed"
    if end == "run_awaiting_input":
        return "awaiting_input"
    return None
