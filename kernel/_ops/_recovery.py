"""``recover``: close the runs that dead processes left open, and say what was closed.

A process killed mid-run leaves its run open in the log: its open superstep has no marker. The
next run or continuation on the instance closes it before appending anything of its own;
``recover`` does the same without starting a run (``steplog recover``). A run is closed only when
its process is provably gone (its ``host:pid`` owner no longer exists on this host) or the
lease its process held on the instance has expired: a live run is never touched. The run's
``RunAbandoned`` names who closed it: ``closed_by`` is ``recover@`` and the lease holder
``recover`` took the instance as.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernel._base._clock import Clock, system_clock
from kernel._base._errors import ConcurrencyConflictError, ExecutionError, RunInProgressError
from kernel._log._events import EventBase, trusted_event
from kernel._log._fold import OpenRun
from kernel._run._runner import unfinished_closing
from kernel._store._eventstore import EventStore
from kernel._store._lease import LeaseKeeper
from kernel._store._owner import presumed_reason, process_owner

__all__ = ["RECOVER_CLOSER", "RecoveredRun", "recover"]

RECOVER_CLOSER = "recover@"
"""How ``RunAbandoned.closed_by`` begins when ``recover`` closed the run: then the lease holder
it closed it as (``host:pid/token``) follows. (Before this was recorded, ``recover`` left
``closed_by`` None; a later run names itself.)"""


@dataclass(frozen=True, slots=True)
class RecoveredRun:
    """A run ``recover`` closed: its open superstep (if any) aborted as ``crashed``."""

    instance_id: str
    run_id: str
    superstep_id: str | None
    owner: str


def recover(
    store: EventStore, instance_id: str | None = None, *, clock: Clock = system_clock
) -> list[RecoveredRun]:
    """Close the runs left open by dead processes, in ``instance_id`` or in every instance.

    Returns what was closed, in instance order. A run whose process may still be alive is left
    alone; so is an instance that another process appends to meanwhile (it closes the run
    itself, if need be).
    """
    closed: list[RecoveredRun] = []
    for name in [instance_id] if instance_id is not None else store.instances():
        head = OpenRun().apply_all(store.read(name, types=OpenRun.EVENT_TYPES))
        if head.run_id is None or not _dead(store, name, head.owner, clock):
            continue
        # The lease first, as a run would take it: no run can start while the run is closed.
        keeper = LeaseKeeper(store, name, owner=process_owner())
        try:
            keeper.try_acquire()
        except RunInProgressError:
            continue  # a live process holds the instance: it closes the run itself, if need be
        try:
            if _close(store, name, head, clock, f"{RECOVER_CLOSER}{keeper.holder}"):
                closed.append(RecoveredRun(name, head.run_id, head.superstep_id, head.owner))
        finally:
            keeper.release_now()
    return closed


def _close(store: EventStore, name: str, head: OpenRun, clock: Clock, closer: str) -> bool:
    """Append the closing of ``head``'s run, closed by ``closer``; False if the stream moved on
    meanwhile."""
    assert head.run_id is not None
    now = OpenRun().apply_all(store.read(name, types=OpenRun.EVENT_TYPES))
    if (now.run_id, now.superstep_id) != (head.run_id, head.superstep_id):
        return False  # closed, or moved on, by someone else before the lease was ours
    version = store.version(name)
    batch: list[EventBase] = []
    closing = unfinished_closing(head.run_id, head.superstep_id, "crashed", closer)
    for offset, (cls, fields) in enumerate(closing, start=1):
        fields.update(instance_id=name, position=version + offset, timestamp=clock())
        event = trusted_event(cls, fields)
        batch.append(event if event is not None else cls.model_validate(fields))
    try:
        store.append(name, batch, expected_version=version)
    except ConcurrencyConflictError:
        return False  # someone appended meanwhile: that process is alive, or closed it first
    return True


def _dead(store: EventStore, instance_id: str, owner: str, clock: Clock) -> bool:
    """Whether the process that owns an open run of ``instance_id`` is provably gone."""
    if presumed_reason(owner) == "crashed":
        return True
    read_lease = getattr(store, "read_lease", None)
    if read_lease is None:
        return False
    lease = read_lease(instance_id)
    if lease is None:
        return False  # no lease recorded: nothing proves the owner gone
    if not lease.holder.startswith(f"{owner}/"):
        return False
    now = clock()
    if now.tzinfo is None:
        raise ExecutionError(f"recover's clock returned a naive datetime: {now!r}")
    return bool(lease.expires <= now)
