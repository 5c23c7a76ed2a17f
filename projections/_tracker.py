"""What each event did to an instance's supersteps, as decided by the kernel's committed-state fold.

History, blame and the ``steplog log`` column need more than committed values: which writes were
staged in time, which superstep a marker closed, which writes a commit made count.
``SuperstepTracker`` wraps the one fold (``kernel.CommittedState``) and reports, for each event, an
``Outcome``. Whether a write counts is read from the fold itself (``CommittedState.is_pending`` and
``staged``), so there is no second copy of the commit rule here; the tracker adds which marker
closed each superstep of a run still going and which supersteps a run left unmarked, and checks
each commit against the fold. Requests for input (``InfoRequested``) follow the same rule as
writes: the tracker stages them in a ``kernel.SuperstepFold`` of their own, so a request counts
exactly when its superstep commits, decided by the kernel's marker rule.
What an executor inside a superstep sees is the kernel's ``CommittedState.overlay``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from kernel import (
    RUN_END_TYPES,
    SUPERSTEP_MARKER_TYPES,
    CommittedState,
    EventBase,
    Fold,
    InfoRequested,
    LogIntegrityError,
    RunEvent,
    StateStaged,
    SuperstepEvent,
    SuperstepFold,
    SuperstepStarted,
    folds,
)

__all__ = ["Outcome", "SuperstepTracker"]

OutcomeKind = Literal["other", "staged", "late", "committed", "aborted", "ignored", "run_ended"]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one event did.

    ``kind`` is ``staged`` (a write that will count if its superstep commits), ``late`` (a write
    staged after its superstep's marker or its run's end: it never counts), ``committed`` /
    ``aborted`` (a marker that closed its superstep; ``writes`` are the writes it made count or made
    inert), ``ignored`` (a second marker, or one after its run ended), ``run_ended``
    (``unmarked`` lists the superstep ids of the run left without a marker), or ``other``.
    A request (``InfoRequested``) is ``staged`` or ``late`` like a write; a ``committed`` marker's
    ``requests`` are the requests its commit made count.
    """

    kind: OutcomeKind
    writes: tuple[StateStaged, ...] = ()
    unmarked: tuple[str, ...] = ()
    requests: tuple[InfoRequested, ...] = ()


OTHER = Outcome("other")
IGNORED = Outcome("ignored")


class _RequestFold(SuperstepFold):
    """The kernel's marker rule applied to requests: what each superstep requested is held until
    its first marker; ``decided`` is what the last commit made count."""

    __slots__ = ("decided",)

    def __init__(self) -> None:
        super().__init__()
        self.decided: tuple[InfoRequested, ...] = ()

    @folds("info_requested")
    def _requested(self, event: InfoRequested) -> None:
        self._stage(event)

    def _decided(self, marker: SuperstepEvent, committed: bool, items: list[Any]) -> None:
        self.decided = tuple(items)

    def counts_if_committed(self, request: InfoRequested) -> bool:
        """Whether ``request`` (folded in) will count if its superstep's next marker commits."""
        held = self._pending_of(request.superstep_id)
        return bool(held) and held[-1] is request

    def held_json(self) -> dict[str, list[Any]]:
        """The requests held for supersteps with no marker yet, as JSON (runs still going)."""
        return {
            superstep_id: [request.model_dump(mode="json") for request in held]
            for superstep_id in self._pending
            if (held := self._pending_of(superstep_id))
        }

    @classmethod
    def restore(
        cls, held: dict[str, list[Any]], status: dict[str, dict[str, str]], ended: set[str]
    ) -> _RequestFold:
        """The fold from ``held_json()`` and the tracker's own markers and ended runs (the same
        sets the kernel's fold keeps: first effective markers of live runs, runs ended)."""
        fold = cls()
        fold._pending = {
            superstep_id: [InfoRequested.model_validate(tree) for tree in trees]
            for superstep_id, trees in held.items()
        }
        fold._closed = {
            run_id: {sid: verdict == "committed" for sid, verdict in marked.items()}
            for run_id, marked in status.items()
        }
        fold._ended_runs = set(ended)
        return fold


class SuperstepTracker(Fold):
    """The committed-state fold plus the status of every superstep marker (JSON-serialisable).

    ``track(event)`` folds one event in and returns its ``Outcome`` (also left in ``outcome``).
    """

    __slots__ = ("_ended", "_open", "_requests", "_status", "outcome", "state")

    def __init__(self, state: CommittedState | None = None) -> None:
        self.state = CommittedState() if state is None else state
        self._requests = _RequestFold()
        self.outcome = OTHER
        # run id -> superstep id -> "committed" | "aborted", for the supersteps of runs that have
        # not ended that got an effective marker (once a run ends every later marker is inert, so
        # its entries are dropped: the tracker grows with the live runs, not with the history)
        self._status: dict[str, dict[str, str]] = {}
        # run id -> superstep ids started and not yet marked
        self._open: dict[str, list[str]] = {}
        self._ended: set[str] = set()

    def track(self, event: EventBase) -> Outcome:
        """Fold ``event`` into the committed state and report what it did."""
        self.outcome = OTHER
        self.apply(event)
        return self.outcome

    @folds("state_staged")
    def _staged(self, event: StateStaged) -> None:
        state = self.state
        state.apply(event)
        self.outcome = Outcome("staged" if state.is_pending(event) else "late", (event,))

    @folds("info_requested")
    def _requested(self, event: InfoRequested) -> None:
        requests = self._requests
        requests.apply(event)
        self.outcome = Outcome("staged" if requests.counts_if_committed(event) else "late")

    @folds("instance_forked")
    def _forked(self, event: EventBase) -> None:
        self.state.apply(event)

    @folds("superstep_started")
    def _started(self, event: SuperstepStarted) -> None:
        if event.run_id not in self._ended:
            self._open.setdefault(event.run_id, []).append(event.superstep_id)

    @folds(*RUN_END_TYPES)
    def _run_ended(self, event: RunEvent) -> None:
        run_id = event.run_id
        self.state.apply(event)
        self._requests.apply(event)
        if run_id in self._ended:
            return
        self._ended.add(run_id)
        self._status.pop(run_id, None)
        self.outcome = Outcome("run_ended", unmarked=tuple(self._open.pop(run_id, ())))

    @folds(*SUPERSTEP_MARKER_TYPES)
    def _marker(self, event: SuperstepEvent) -> None:
        committed = event.type == "superstep_committed"
        run_id, superstep_id = event.run_id, event.superstep_id
        state = self.state
        writes = state.staged(superstep_id)
        before = state.last_committed
        state.apply(event)
        requests = self._requests
        requests.decided = ()
        requests.apply(event)
        marked = self._status.get(run_id)
        effective = run_id not in self._ended and (marked is None or superstep_id not in marked)
        did_commit = state.last_committed == superstep_id and before != superstep_id
        if committed and effective != did_commit:
            raise LogIntegrityError(
                f"instance {event.instance_id!r} position {event.position}: the commit of "
                f"superstep {superstep_id!r} disagrees with the committed-state fold"
            )
        if not effective:
            self.outcome = IGNORED
            return
        self._status.setdefault(run_id, {})[superstep_id] = "committed" if committed else "aborted"
        opened = self._open.get(run_id)
        if opened is not None and superstep_id in opened:
            opened.remove(superstep_id)
        if committed:
            self.outcome = Outcome("committed", writes, requests=requests.decided)
        else:
            self.outcome = Outcome("aborted", writes)

    def status(self, run_id: str, superstep_id: str) -> str | None:
        """``committed`` or ``aborted`` for a marked superstep of a run that has not ended; None
        while the superstep has no effective marker, and once its run has ended."""
        return self._status.get(run_id, {}).get(superstep_id)

    def to_json(self) -> dict[str, Any]:
        """The tracker as a JSON tree."""
        return {
            "state": self.state.to_snapshot(),
            "status": {run_id: dict(marked) for run_id, marked in self._status.items()},
            "open": {run_id: list(ids) for run_id, ids in self._open.items()},
            "ended": sorted(self._ended),
            "requests": self._requests.held_json(),
        }

    @classmethod
    def from_json(cls, tree: dict[str, Any]) -> SuperstepTracker:
        """Rebuild a tracker from ``to_json()``."""
        tracker = cls(CommittedState.from_snapshot(tree["state"]))
        tracker._status = {run_id: dict(marked) for run_id, marked in tree["status"].items()}
        tracker._open = {run_id: list(ids) for run_id, ids in tree["open"].items()}
        tracker._ended = set(tree["ended"])
        tracker._requests = _RequestFold.restore(
            tree.get("requests", {}), tracker._status, tracker._ended
        )
        return tracker
