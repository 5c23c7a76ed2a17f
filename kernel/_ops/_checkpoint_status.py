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
"""

from __future__ import annotations

from kernel._run._ledger import CheckpointStatus, Ledger
from kernel._store._eventstore import EventStore
from kernel._store._owner import presumed_reason

__all__ = ["checkpoint_statuses", "ledger_statuses"]

_WINDOW = 5000  # stream positions per read


def checkpoint_statuses(store: EventStore, instance_id: str) -> dict[str, CheckpointStatus | None]:
    """The status of each checkpoint (committed superstep) of ``instance_id``, by checkpoint id,
    oldest first, as the log alone says it (None: only ``Workflow.checkpoints()`` can say; see
    the module docstring). A fork that committed nothing has one: the origin's checkpoint it was
    forked at. The log is read a window at a time (the events are never all in memory at once).
    Raises what ``store.read`` raises."""
    ledger = Ledger(instance_id)
    end = store.version(instance_id)
    for after in range(0, end, _WINDOW):
        ledger.apply_all(
            store.read(instance_id, after=after, upto=after + _WINDOW, types=Ledger.EVENT_TYPES)
        )
    return ledger_statuses(ledger)


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
