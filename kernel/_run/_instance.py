"""The runner's seam: ``RunnerContext``, all a run needs from the workflow instance it runs on.

A ``Run`` (``_run._runner``) talks to its instance through this one interface and nothing else:
the instance's settings, fresh ids and the time, its committed state, the log's view of which run
is unfinished and whether its process is gone, and appending a batch of events.
``InstanceContext`` is the implementation a ``Workflow`` gives its runs; it owns the instance's
fold of the log (committed state and the open run), and keeps it up to date with every append.
Resuming, checkpointing or running a sub-workflow plugs in here: anything that implements
``RunnerContext`` can host a run.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from kernel._base._clock import Clock, IdFactory
from kernel._base._errors import DefinitionError
from kernel._codec._values import ValueCodec
from kernel._log._events import AbortReason, EventBase, InstanceForked
from kernel._log._fold import CommittedState, OpenRun
from kernel._run._hooks import RunHooks
from kernel._run._ledger import HistoryNeeded, Ledger
from kernel._run._snapshot import (
    DEFAULT_SNAPSHOT_EVERY,
    SnapshotUnusable,
    decode_snapshot,
    encode_snapshot,
    prune,
    snapshot_header,
)
from kernel._store._eventstore import EventStore
from kernel._store._group import Pending
from kernel._store._lease import LeaseKeeper
from kernel._store._owner import presumed_reason

if TYPE_CHECKING:
    from kernel._run._algo import Router

__all__ = [
    "Durability",
    "InstanceContext",
    "LeaseHold",
    "LeasePolicy",
    "RunnerContext",
    "read_ledger",
]

Durability = Literal["superstep", "write"]

_log = logging.getLogger("steplog.snapshot")


@dataclass(frozen=True, slots=True)
class LeasePolicy:
    """How runs hold their instance's lease: renewed every ``ttl / 3`` s, taken over after
    ``ttl`` s without renewal; a run waits up to ``wait`` s for a live holder to finish."""

    ttl: float = 30.0
    wait: float = 0.0

    def __post_init__(self) -> None:
        """Raises ``DefinitionError`` for a ``ttl`` that is not a positive finite number, or a
        ``wait`` that is not a finite number at least 0 (booleans are not numbers here)."""
        for what, value in (("ttl", self.ttl), ("wait", self.wait)):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise DefinitionError(f"the lease {what} must be a number, got {value!r}")
            if not math.isfinite(value) or value < 0 or (what == "ttl" and value == 0):
                raise DefinitionError(f"the lease {what} must be a positive number, got {value!r}")
            object.__setattr__(self, what, float(value))


class LeaseHold(Protocol):
    """One run's hold on its instance's lease (``kernel._store._lease.LeaseKeeper``)."""

    async def acquire(self) -> bool:
        """Take the lease; True if taken over from a dead or expired holder. Raises
        ``RunInProgressError`` while a live one has it."""
        ...

    def start_heartbeat(self, on_lost: Callable[[], None]) -> None:
        """Renew the lease until released; call ``on_lost`` if another holder takes it."""
        ...

    async def release(self) -> None:
        """Stop renewing and give the lease up. Never raises ``StoreError``."""
        ...

    def release_now(self) -> None:
        """``release``, without waiting for the renewals to stop."""
        ...


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
    sensitive_keys: tuple[str, ...]
    """The patterns of the state keys the workflow declared sensitive, recorded in
    ``RunStarted.sensitive_keys``."""
    clock: Clock
    """The time of the next event. The run refuses a naive datetime (``ExecutionError``)."""
    hooks: tuple[RunHooks, ...]
    """The hooks every run on the instance calls, in order (``RunHooks``)."""
    live_steps: frozenset[str] | None
    """None: a recorded step's call that the run's book has no record of runs. Otherwise the
    names of the only steps whose calls may run so (a rerun's scratch instance): any other such
    call is refused, recorded as its error, never executed."""

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

    def catch_up_ledger(self) -> tuple[OpenRun, Ledger]:
        """``catch_up``, and the instance's runs and checkpoints up to the same version: possibly
        pruned (rebuilt from a snapshot), so that a question about an older run or checkpoint
        raises ``HistoryNeeded``; ask ``full_ledger`` then."""
        ...

    def full_ledger(self) -> Ledger:
        """The instance's runs and checkpoints folded from the whole log, up to ``catch_up``'s
        version."""
        ...

    def take_snapshot(self, *, every: bool) -> None:
        """Keep a snapshot of the view beside the log (``kernel._run._snapshot``), when the view
        moved on since the last one (``every``: only once ``snapshot_every`` supersteps have
        committed since). Called by the run that holds the lease, after a commit or at its end;
        never raises (a snapshot is a cache: failing to keep one costs only time)."""
        ...

    def origin_ledger(self, forked: InstanceForked) -> Ledger:
        """The ledger of the instance this one was forked from, as of the fork's point."""
        ...

    def lease_keeper(self) -> LeaseHold:
        """A keeper for one run's hold on the instance's lease (``acquire`` before appending)."""
        ...

    def append(self, batch: Sequence[EventBase], *, expected_version: int) -> None:
        """Append ``batch`` atomically after ``expected_version`` and fold it into the view.

        Raises what the store raises (``ConcurrencyConflictError``, ``EncodingError``, ...);
        nothing of the batch is folded then, and the view stays what it was.
        """
        ...

    def append_commit(self, batch: Sequence[EventBase], *, expected_version: int) -> Pending | None:
        """``append`` for a batch that may share a commit with other runs' (a superstep's commit
        batch, a step's record).

        Either appends and folds at once, returning None (as ``append``), or queues the batch for
        the store's group commit and returns its ``Pending``, whose future resolves once the batch
        is in the log and folded (or fails with what the store raised). What the store can refuse
        without the database (``EncodingError``, ``InvalidBatchError``) is raised here, before
        anything is queued. The batch cannot be taken back once queued: cancelling the future
        changes nothing.
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
        lease: LeasePolicy | None = None,
        sensitive_keys: tuple[str, ...] = (),
        hooks: tuple[RunHooks, ...] = (),
        live_steps: frozenset[str] | None = None,
        snapshot_every: int = DEFAULT_SNAPSHOT_EVERY,
        use_snapshots: bool = True,
    ) -> None:
        self.store = store
        self.lease = lease or LeasePolicy()
        self.instance_id = instance_id
        self.workflow_name = workflow_name
        self.router = router
        self.max_supersteps = max_supersteps
        self.durability: Durability = durability
        self.codec = store.codec
        self.owner = owner
        self.sensitive_keys = sensitive_keys
        self.clock = clock
        self.hooks = hooks
        self.live_steps = live_steps
        self.new_id = id_factory
        self._committed = CommittedState()
        self._head = OpenRun()
        # The ledger, once a run asked for it: kept folded with every append, pruned at every
        # snapshot (so its size stays that of the last run's standing).
        self._ledger: Ledger | None = None
        self.snapshot_every = snapshot_every
        self.use_snapshots = use_snapshots
        self.snapshot_note = "no snapshot looked for yet"
        """What became of the last snapshot looked for: used (at which position), none, or
        ignored and why."""
        self._snapshot_position = 0  # of the snapshot last read or written
        self._since_snapshot = 0  # supersteps committed since then, by this view's appends

    def committed(self, key: str, default: Any) -> Any:
        return self._committed.values.get(key, default)

    def committed_values(self) -> dict[str, Any]:
        """Every committed wire value, after catching up with the log."""
        self.catch_up()
        return dict(self._committed.values)

    def catch_up(self) -> OpenRun:
        if self._head.version == 0 and self._ledger is None and self.use_snapshots:
            self._from_snapshot()
        events = self.store.read(self.instance_id, after=self._head.version)
        self._fold(events)
        return self._head

    def _from_snapshot(self) -> None:
        """Start the views from the instance's snapshot and the log's tail after it, if there
        is one that serves (see ``kernel._run._snapshot``); else leave them empty."""
        store = self.store
        if store.reads_broken_chains:
            self.snapshot_note = "not read: the store was opened with allow_broken_chain"
            return
        text = store.read_snapshot(self.instance_id)
        if text is None:
            self.snapshot_note = "none kept"
            return
        try:
            position, head = snapshot_header(text)
            tail = store.read_after_head(self.instance_id, position, head)
            if tail is None:
                raise SnapshotUnusable(
                    f"the log has no row ending at position {position} with its chain hash "
                    "(stale, or over another log)"
                )
            loaded = decode_snapshot(text, self.instance_id, self.router.graph, store.keyring)
        except SnapshotUnusable as why:
            self.snapshot_note = f"ignored: {why}"
            _log.warning("snapshot of instance %r ignored: %s", self.instance_id, why)
            return
        self._committed, self._head, self._ledger = loaded.committed, loaded.open_run, loaded.ledger
        self._snapshot_position = position
        self.snapshot_note = f"used, folded to position {position}"
        self._fold(tail)

    def presumed_reason(self, owner: str) -> AbortReason:
        return presumed_reason(owner)

    def lease_keeper(self) -> LeaseKeeper:
        lease = self.lease
        return LeaseKeeper(
            self.store, self.instance_id, owner=self.owner, ttl=lease.ttl, wait=lease.wait
        )

    def catch_up_ledger(self) -> tuple[OpenRun, Ledger]:
        if self._ledger is None and self._head.version == 0 and self.use_snapshots:
            self._from_snapshot()
        if self._ledger is None:
            if self._head.version == 0:  # a new view: the one read of the whole log serves all
                events = self.store.read(self.instance_id)
                self._ledger = Ledger(self.instance_id)
                self._fold(events)
            else:
                self._ledger = read_ledger(
                    self.store, self.instance_id, upto=self.catch_up().version
                )
        head = self.catch_up()
        ledger = self._ledger
        if not self.use_snapshots:
            # Only a snapshot prunes the kept ledger: without them it would hold every
            # checkpoint's items for as long as the instance object lives. Folded per question.
            self._ledger = None
        return head, ledger

    def full_ledger(self) -> Ledger:
        head = self.catch_up()
        return read_ledger(self.store, self.instance_id, upto=head.version)

    def take_snapshot(self, *, every: bool) -> None:
        ledger = self._ledger
        head = self._head
        position = head.version
        if not self.use_snapshots or ledger is None or position <= self._snapshot_position:
            return
        # Mid-run, every K supersteps; but a snapshot carries the open run's marker record, which
        # grows with the run: past 4,000 supersteps into a run, at least a quarter of its length
        # apart, so that the cost per superstep stays bounded however long the run.
        spacing = self.snapshot_every
        if head.index > 4 * DEFAULT_SNAPSHOT_EVERY:
            spacing = max(spacing, head.index // 4)
        if every and self._since_snapshot < spacing:
            return
        store = self.store
        try:
            pruned = prune(ledger, self.router, self.origin_ledger)
            text = encode_snapshot(
                self.instance_id,
                store.chain_hash_at(self.instance_id, position),
                self.router.graph,
                self._committed,
                head,
                pruned,
                store.keyring,
            )
            store.write_snapshot(self.instance_id, text)
        except HistoryNeeded:
            return
        except Exception as error:
            _log.warning("no snapshot of instance %r taken: %s", self.instance_id, error)
            return
        self._ledger = pruned
        self._snapshot_position = position
        self._since_snapshot = 0

    def origin_ledger(self, forked: InstanceForked) -> Ledger:
        return read_ledger(self.store, forked.origin_instance, upto=forked.origin_position)

    def append_commit(self, batch: Sequence[EventBase], *, expected_version: int) -> Pending | None:
        store = self.store
        if not store.shares_commits:
            self.append(batch, expected_version=expected_version)
            return None
        prepared = store.prepare(self.instance_id, batch, expected_version=expected_version)
        committer = store.group_committer()
        if committer.commit_alone(prepared) is not None:  # nothing could have shared its round
            self._fold(batch)
            return None
        return committer.enqueue(prepared, lambda: self._fold(batch))

    def append(self, batch: Sequence[EventBase], *, expected_version: int) -> None:
        # Folded only once appended: a refused batch leaves the view as it was, a true fold of the
        # log up to ``version``. (If a failure was ambiguous and the batch did land, the next
        # ``catch_up`` reads it, and an append at the same positions is a version conflict.)
        self.store.append(self.instance_id, batch, expected_version=expected_version)
        self._fold(batch)

    def _fold(self, events: Sequence[EventBase]) -> None:
        if not events:
            return
        self._committed.apply_all(events)
        ledger = self._ledger
        if ledger is not None:
            checkpoints = len(ledger.checkpoints)
            ledger.apply_all(events)
            self._since_snapshot += len(ledger.checkpoints) - checkpoints
        # The open-run view moves only on run and superstep boundaries; any other event just
        # advances its version, so of those the batch's last one (the stream's order) is enough.
        head = self._head
        moves = head.EVENT_TYPES
        last = events[-1]
        head.apply_all([event for event in events if event.type in moves or event is last])


def read_ledger(store: EventStore, instance_id: str, *, upto: int | None = None) -> Ledger:
    """Fold an instance's runs and checkpoints from ``store`` (only the event types the ledger
    folds are decoded), up to stream position ``upto``."""
    events = store.read(instance_id, upto=upto, types=Ledger.EVENT_TYPES)
    return Ledger(instance_id).apply_all(events)
