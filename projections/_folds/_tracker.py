"""What each event did to an instance's supersteps, as decided by the kernel's committed-state fold.

History, blame and the ``steplog log`` column need more than committed values: which writes were
staged in time, which superstep a marker closed, which writes a commit made count.
``SuperstepTracker`` wraps the one fold (``kernel.CommittedState``) and reports, for each event, an
``Outcome``. Whether a write counts is read from the fold itself (what its ``apply_write`` and
``apply_marker`` answer), so there is no second copy of the commit rule here; the tracker adds
which marker closed each superstep of a run still going and which supersteps a run left
unmarked, and checks each marker against the fold. Requests for input (``InfoRequested``)
follow the same rule as writes: the tracker stages them in a ``kernel.SuperstepFold`` of their
own, so a request counts exactly when its superstep commits, decided by the kernel's marker rule.
What an executor inside a superstep sees is the kernel's ``CommittedState.overlay``.

Every rebuild of history or blame goes through ``track`` once per event, so the tracker keeps what
an event did as plain fields and builds the ``Outcome`` only when it is read: ``verdict(event)``
folds an event in and returns only its kind (what history needs), ``outcome`` the whole record.
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
_NOTHING: tuple[Any, ...] = ()


class _RequestFold(SuperstepFold):
    """The kernel's marker rule applied to requests: what each superstep requested is held until
    its first marker; ``decided`` is what the last commit made count."""

    __slots__ = ("decided",)

    def __init__(self) -> None:
        super().__init__()
        self.decided: tuple[InfoRequested, ...] = ()

    @folds("info_requested")
    def hold(self, request: InfoRequested) -> bool:
        """Fold ``request`` in, like ``apply``; whether it counts if its superstep commits."""
        return self._stage(request)

    def _decided(self, marker: SuperstepEvent, committed: bool, items: list[Any]) -> None:
        self.decided = tuple(items) if items else ()

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

    ``track(event)`` folds one event in and returns its ``Outcome`` (also in ``outcome``);
    ``verdict(event)`` folds it in and returns only the outcome's kind.
    """

    __slots__ = (
        "_ended",
        "_event",
        "_kind",
        "_open",
        "_requests",
        "_status",
        "_unmarked",
        "_writes",
        "state",
    )

    def __init__(self, state: CommittedState | None = None) -> None:
        self.state = CommittedState() if state is None else state
        # The requests' fold, made at the first request (see ``_request_fold``).
        self._requests: _RequestFold | None = None
        # What the last event did: the fields of its Outcome (see ``outcome``), kept as found.
        self._kind: OutcomeKind = "other"
        self._event: EventBase | None = None  # the write or request a staged/late one is
        self._writes: list[StateStaged] = []  # what a marker's superstep staged
        self._unmarked: tuple[str, ...] = _NOTHING
        # run id -> superstep id -> "committed" | "aborted", for the supersteps of runs that have
        # not ended that got an effective marker (once a run ends every later marker is inert, so
        # its entries are dropped: the tracker grows with the live runs, not with the history)
        self._status: dict[str, dict[str, str]] = {}
        # run id -> superstep ids started and not yet marked (a dict for its order and O(1) pops)
        self._open: dict[str, dict[str, None]] = {}
        self._ended: set[str] = set()

    def track(self, event: EventBase) -> Outcome:
        """Fold ``event`` into the committed state and report what it did."""
        self.verdict(event)
        return self.outcome

    def verdict(self, event: EventBase) -> OutcomeKind:
        """Fold ``event`` in like ``track`` and return only the kind of its ``Outcome`` (the rest
        is in ``outcome``): what a fold that needs no more than the kind calls."""
        self._kind = "other"
        method = self._DISPATCH.get(event.type)
        if method is not None:
            method(self, event)
        return self._kind

    @property
    def outcome(self) -> Outcome:
        """What the last event tracked did (built when read: equal, not identical, each time)."""
        kind = self._kind
        if kind == "other":
            return OTHER
        if kind == "ignored":
            return IGNORED
        if kind == "run_ended":
            return Outcome(kind, unmarked=self._unmarked)
        if kind == "committed":
            return Outcome(kind, tuple(self._writes), requests=self.decided_requests)
        if kind == "aborted":
            return Outcome(kind, tuple(self._writes))
        event = self._event  # staged or late: a write, or a request
        return Outcome(kind, (event,) if isinstance(event, StateStaged) else _NOTHING)

    @property
    def decided_requests(self) -> tuple[InfoRequested, ...]:
        """The requests the last ``committed`` marker made count (``outcome.requests``)."""
        requests = self._requests
        if requests is None or self._kind != "committed":
            return _NOTHING
        return requests.decided

    def _request_fold(self) -> _RequestFold:
        """The requests' fold. It is made at the first request, from the markers and ended runs
        the tracker keeps (the sets the kernel's fold keeps, as ``from_json`` restores it), so
        a log without requests never folds its markers a second time."""
        requests = self._requests
        if requests is None:
            requests = self._requests = _RequestFold.restore({}, self._status, self._ended)
        return requests

    @folds("state_staged")
    def _staged(self, event: StateStaged) -> None:
        self._kind = "staged" if self.state.apply_write(event) else "late"
        self._event = event

    def fold_write(self, event: StateStaged) -> None:
        """Fold a ``StateStaged`` in, like ``verdict``, for a caller that never reads its
        outcome (``outcome`` and ``verdict``'s answer are left as the last event's)."""
        self.state.apply_write(event)

    def fold_started(self, event: SuperstepStarted) -> None:
        """Fold a ``SuperstepStarted`` in, like ``verdict`` (whose answer would be ``other``),
        for a caller that never reads its outcome."""
        self._started(event)

    @folds("info_requested")
    def _requested(self, event: InfoRequested) -> None:
        self._kind = "staged" if self._request_fold().hold(event) else "late"
        self._event = event

    @folds("instance_forked")
    def _forked(self, event: EventBase) -> None:
        self.state.apply(event)

    @folds("superstep_started")
    def _started(self, event: SuperstepStarted) -> None:
        run_id = event.run_id
        if run_id not in self._ended:
            opened = self._open.get(run_id)
            if opened is None:
                self._open[run_id] = {event.superstep_id: None}
            else:
                opened[event.superstep_id] = None

    @folds(*RUN_END_TYPES)
    def _run_ended(self, event: RunEvent) -> None:
        run_id = event.run_id
        self.state.apply(event)
        if self._requests is not None:
            self._requests.apply(event)
        if run_id in self._ended:
            return
        self._ended.add(run_id)
        self._status.pop(run_id, None)
        self._kind = "run_ended"
        self._unmarked = tuple(self._open.pop(run_id, ()))

    @folds(*SUPERSTEP_MARKER_TYPES)
    def _marker(self, event: SuperstepEvent) -> None:
        committed = event.type == "superstep_committed"
        run_id, superstep_id = event.run_id, event.superstep_id
        writes = self.state.apply_marker(event)  # None: the fold found the marker inert
        requests = self._requests
        if requests is not None:
            requests.decided = ()
            requests.apply_marker(event)
        marked = self._status.get(run_id)
        effective = run_id not in self._ended and (marked is None or superstep_id not in marked)
        if effective != (writes is not None):
            raise LogIntegrityError(
                f"instance {event.instance_id!r} position {event.position}: the marker of "
                f"superstep {superstep_id!r} disagrees with the committed-state fold"
            )
        if writes is None:
            self._kind = "ignored"
            return
        if marked is None:
            marked = self._status[run_id] = {}
        marked[superstep_id] = "committed" if committed else "aborted"
        opened = self._open.get(run_id)
        if opened is not None:
            opened.pop(superstep_id, None)
        self._kind = "committed" if committed else "aborted"
        self._writes = writes

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
            "requests": {} if self._requests is None else self._requests.held_json(),
        }

    @classmethod
    def from_json(cls, tree: dict[str, Any]) -> SuperstepTracker:
        """Rebuild a tracker from ``to_json()``."""
        tracker = cls(CommittedState.from_snapshot(tree["state"]))
        tracker._status = {run_id: dict(marked) for run_id, marked in tree["status"].items()}
        tracker._open = {run_id: dict.fromkeys(ids) for run_id, ids in tree["open"].items()}
        tracker._ended = set(tree["ended"])
        held = tree.get("requests")
        if held:  # else made at the first request, from the same markers and ended runs
            tracker._requests = _RequestFold.restore(held, tracker._status, tracker._ended)
        return tracker
