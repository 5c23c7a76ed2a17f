"""Run history: the runs of an instance and the supersteps of each run, as a pure fold.

``RunHistory().apply(event)`` folds one event of one instance (in stream order) and returns the
view; ``fold_history(events)`` folds a list. No I/O, no clock: times come from the events.

Lineage is part of the history: a run that continues another (resumed, or given responses) names
it (``RunRecord.continues``, ``checkpoint``) and is listed in that run's ``continued_by``; requests
for input that count (their superstep committed, by the kernel's marker rule through
``SuperstepTracker``) stay in their run's ``pending_requests`` until a ``ResponseReceived``
answers them, or until a run that continues nothing starts a new line (after which the kernel
can no longer answer them); an instance forked from another says so (``forked_from``). The forks
*of* an instance are in other instances' logs, so a fold of one instance cannot see them: readers
over a store fill ``forks()`` (``Projector.history``, ``history_of``).

The fold keeps one record type per thing, ``RunRecord`` and ``SuperstepRecord``, in a
``HistoryRows`` sink: by default ``MemoryHistoryRows``; a materialized view passes one that loads
and writes the rows of a view table (``HistoryView``). ``to_row`` / ``from_row`` are a record's
JSON row.

Example::

    history = fold_history(store.read("order-42"))
    for run in history.runs():
        print(run.run_id, run.status, run.supersteps, run.error)
    for step in history.supersteps(run.run_id):
        print(step.index, step.status, step.reason, step.executors, step.keys)
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from kernel import (
    RUN_END_TYPES,
    SUPERSTEP_MARKER_TYPES,
    CommittedState,
    CustomEventAdded,
    ErrorInfo,
    EventBase,
    ExecutorFailed,
    ExecutorInvoked,
    Fold,
    InfoRequested,
    InstanceForked,
    MessageStaged,
    OutputYielded,
    ResponseReceived,
    RunAbandoned,
    RunEvent,
    RunFailed,
    RunStarted,
    StateStaged,
    SuperstepAborted,
    SuperstepEvent,
    SuperstepStarted,
    folds,
)
from projections._folds._runrecords import (
    DroppedMessage,
    ForkRecord,
    HistoryRows,
    MemoryHistoryRows,
    RequestRecord,
    RunRecord,
    RunStatus,
    SuperstepRecord,
    continued,
    given_up,
    in_memory,
    waiting_status,
)
from projections._folds._tracker import SuperstepTracker

__all__ = [
    "DroppedMessage",
    "ForkRecord",
    "HistoryRows",
    "MemoryHistoryRows",
    "RequestRecord",
    "RunHistory",
    "RunRecord",
    "RunStatus",
    "SuperstepRecord",
    "fold_history",
]

_END_STATUS: dict[str, RunStatus] = {
    "run_completed": "completed",
    "run_failed": "failed",
    "run_cancelled": "cancelled",
    "run_awaiting_input": "awaiting_input",
}


_ABANDONED_WHY = {
    "crashed": "its process died (or its lease ran out) before the run ended",
    "abandoned": "it stopped before it ended (its stream was dropped, or its task stopped)",
}


def _abandoned_error(event: RunAbandoned, closer: str) -> ErrorInfo:
    """What the log says of a run found unfinished and closed: why, the superstep it left open
    (aborted), who closed it and when. Its ``type`` is the run's status."""
    open_step = (
        f"; its open superstep {event.superstep_id} was aborted"
        if event.superstep_id is not None
        else ""
    )
    return ErrorInfo(
        type=event.reason,
        message=(
            f"{_ABANDONED_WHY[event.reason]}{open_step}; closed by {closer} at "
            f"{event.timestamp.isoformat()}"
        ),
    )


class RunHistory(Fold):
    """The runs of one instance and their supersteps (see the module docstring).

    ``rows`` is where the records live (a new ``MemoryHistoryRows`` by default); ``tracker``
    continues a saved fold (``tracker_json()``); ``forks`` are the instances forked from this
    one, as a reader over many instances found them. ``runs()``, ``supersteps()`` and friends
    read memory rows and return copies (changing them changes no view).
    """

    __slots__ = (
        "_forked_from",
        "_forks",
        "_inherited",
        "_last_run",
        "_requested_by",
        "_rows",
        "_run",
        "_step",
        "_tracker",
    )

    def __init__(
        self,
        rows: HistoryRows | None = None,
        *,
        tracker: dict[str, Any] | None = None,
        forks: Iterable[ForkRecord] = (),
    ) -> None:
        self._rows: HistoryRows = MemoryHistoryRows() if rows is None else rows
        self._tracker = SuperstepTracker()
        # request id -> the run that made it, for the requests that count and are unanswered
        self._requested_by: dict[str, str] = {}
        self._forked_from: ForkRecord | None = None
        # a fork's requests inherited from its origin's run (InstanceForked.requests), unanswered
        self._inherited: list[RequestRecord] = []
        self._forks = sorted(forks, key=_fork_order)
        self._last_run: str | None = None  # the run started last
        # The records the last events touched: a superstep's events come together, so most
        # events find their records here instead of asking ``rows`` (records are changed in
        # place, so a sink hands out the same record for an id for as long as the fold lives).
        self._run: RunRecord | None = None
        self._step: SuperstepRecord | None = None
        if tracker is not None:
            self._tracker = SuperstepTracker.from_json(tracker["tracker"])
            self._requested_by = dict(tracker.get("requested_by", {}))
            forked = tracker.get("forked_from")
            self._forked_from = None if forked is None else ForkRecord.from_row(forked)
            self._inherited = [RequestRecord.from_row(r) for r in tracker.get("inherited", [])]
            self._last_run = tracker.get("last_run")

    # -- folding ------------------------------------------------------------------------------

    @folds("instance_forked")
    def _forked(self, event: InstanceForked) -> None:
        self._tracker.verdict(event)
        self._forked_from = fork_record(event)
        self._inherited = [
            RequestRecord(
                str(request.get("request_id", "")),
                str(request.get("executor_id", "")),
                str(request.get("response_type", "")),
                request.get("data"),
                str(request.get("superstep_id", "")),
            )
            for request in event.requests
        ]

    @folds("run_started")
    def _run_started(self, event: RunStarted) -> None:
        rows = self._rows
        if rows.run(event.run_id) is not None:
            return
        run = RunRecord(
            event.run_id,
            event.workflow_name,
            event.timestamp,
            event.position,
            continues=event.continues,
            checkpoint=event.checkpoint,
        )
        rows.add_run(run)
        self._run = run
        if event.continues is not None:
            earlier = rows.run(event.continues)
            if earlier is not None:
                continued(earlier, event.run_id)
        else:
            self._drop_pending()
            last = None if self._last_run is None else rows.run(self._last_run)
            if last is not None:
                given_up(last)
        self._last_run = event.run_id

    def _drop_pending(self) -> None:
        """A run that continues nothing starts a new line: the requests earlier runs left
        unanswered can no longer be answered (the kernel answers only the last run's line), so
        they are no longer waiting. Their supersteps still list them."""
        rows = self._rows
        for request_id, run_id in self._requested_by.items():
            asker = rows.run(run_id)
            if asker is not None:
                asker.pending_requests = [
                    r for r in asker.pending_requests if r.request_id != request_id
                ]
        self._requested_by.clear()
        self._inherited.clear()

    @folds("response_received")
    def _responded(self, event: ResponseReceived) -> None:
        rows = self._rows
        run = rows.run(event.run_id)
        if run is None or run.status != "running":
            return
        if event.request_id not in run.responses:
            run.responses.append(event.request_id)
        self._inherited = [r for r in self._inherited if r.request_id != event.request_id]
        asker = self._requested_by.pop(event.request_id, None)
        requester = None if asker is None else rows.run(asker)
        if requester is not None:
            requester.pending_requests = [
                r for r in requester.pending_requests if r.request_id != event.request_id
            ]

    @folds("info_requested")
    def _requested(self, event: InfoRequested) -> None:
        self._tracker.verdict(event)
        step = self._step_of(event.superstep_id)
        if step is not None and event.request_id not in step.requests:
            step.requests += (event.request_id,)

    @folds("superstep_started")
    def _superstep_started(self, event: SuperstepStarted) -> None:
        self._tracker.fold_started(event)
        run = self._run
        if run is None or run.run_id != event.run_id:
            run = self._run_of(event.run_id)
        if run is None or run.status != "running":
            return
        rows = self._rows
        superstep_id = event.superstep_id
        if rows.step(superstep_id) is not None:
            return
        step = SuperstepRecord(
            superstep_id, event.run_id, event.index, event.timestamp, event.position
        )
        rows.add_step(step)
        self._step = step
        run.supersteps += 1
        run.superstep_ids.append(superstep_id)

    def _step_of(self, superstep_id: str) -> SuperstepRecord | None:
        """The record of ``superstep_id`` (the last one touched, or from ``rows``), or None."""
        step = self._step
        if step is not None and step.superstep_id == superstep_id:
            return step
        step = self._rows.step(superstep_id)
        if step is not None:
            self._step = step
        return step

    def _run_of(self, run_id: str) -> RunRecord | None:
        """The record of ``run_id`` (the last one touched, or from ``rows``), or None."""
        run = self._run
        if run is not None and run.run_id == run_id:
            return run
        run = self._rows.run(run_id)
        if run is not None:
            self._run = run
        return run

    @folds("executor_invoked")
    def _invoked(self, event: ExecutorInvoked) -> None:
        step = self._step
        if step is None or step.superstep_id != event.superstep_id:
            step = self._step_of(event.superstep_id)
        if step is not None:
            step.executors += (event.executor_id,)

    @folds("executor_failed")
    def _failed(self, event: ExecutorFailed) -> None:
        step = self._step_of(event.superstep_id)
        if step is not None:
            step.failed_executors += (event.executor_id,)

    @folds("state_staged")
    def _staged(self, event: StateStaged) -> None:
        self._tracker.fold_write(event)
        step = self._step
        if step is None or step.superstep_id != event.superstep_id:
            step = self._step_of(event.superstep_id)
        if step is not None and event.key not in step.keys:
            step.keys += (event.key,)

    @folds("output_yielded")
    def _output(self, event: OutputYielded) -> None:
        step = self._step_of(event.superstep_id)
        if step is None or step.status != "open":
            return
        run = self._run_of(step.run_id)
        if run is not None and run.status == "running":
            step.outputs += (event.value,)

    @folds("custom_event_added")
    def _custom(self, event: CustomEventAdded) -> None:
        step = self._step_of(event.superstep_id)
        if step is not None and step.status == "open":
            step.events += (event.event_type,)

    @folds("message_staged")
    def _message(self, event: MessageStaged) -> None:
        # Only a drop is history's business; whether it happened is its superstep's verdict.
        if event.dropped is None:
            return
        step = self._step_of(event.superstep_id)
        if step is None or step.status != "open":
            return
        run = self._run_of(step.run_id)
        if run is not None and run.status == "running":
            drop = DroppedMessage(
                event.source, event.target, event.dropped, event.message, event.position
            )
            step.dropped += (drop,)

    @folds(*SUPERSTEP_MARKER_TYPES)
    def _marked(self, event: SuperstepEvent) -> None:
        tracker = self._tracker
        kind = tracker.verdict(event)
        if kind != "committed" and kind != "aborted":
            return
        step = self._step
        if step is None or step.superstep_id != event.superstep_id:
            step = self._step_of(event.superstep_id)
            if step is None:
                return
        step.position = event.position
        step.ended_at = event.timestamp
        run = self._run
        if run is None or run.run_id != step.run_id:
            run = self._run_of(step.run_id)
        assert run is not None
        if kind == "committed":
            step.status = "committed"
            run.committed += 1
            if step.outputs:
                run.outputs.extend(step.outputs)
            if step.dropped:
                run.dropped.extend(step.dropped)
            for request in tracker.decided_requests:
                self._requested_by[request.request_id] = run.run_id
                run.pending_requests.append(
                    RequestRecord(
                        request.request_id,
                        request.executor_id,
                        request.response_type,
                        request.data,
                        request.superstep_id,
                    )
                )
        else:
            assert isinstance(event, SuperstepAborted)
            step.status = "aborted"
            step.reason = event.reason
            step.error = event.error
            run.aborted += 1

    @folds(*RUN_END_TYPES)
    def _run_ended(self, event: RunEvent) -> None:
        if self._tracker.verdict(event) != "run_ended":
            return
        run = self._run_of(event.run_id)
        if run is None:
            return
        run.ended_at = event.timestamp
        if isinstance(event, RunAbandoned):
            run.status = event.reason
            # only recover closed a run without naming itself (before it said so)
            run.closed_by = event.closed_by or "recover"
            run.error = _abandoned_error(event, run.closed_by)
        else:
            status = _END_STATUS[event.type]
            run.status = waiting_status(run) if status == "awaiting_input" else status
            run.error = event.error if isinstance(event, RunFailed) else None

    # -- reading ------------------------------------------------------------------------------

    def _memory(self) -> MemoryHistoryRows:
        return in_memory(self._rows, MemoryHistoryRows, "history")

    def runs(self) -> list[RunRecord]:
        """Every run, in start order."""
        return [run.copy() for run in self._memory().runs.values()]

    def run(self, run_id: str) -> RunRecord | None:
        """One run, or None."""
        run = self._memory().runs.get(run_id)
        return None if run is None else run.copy()

    def supersteps(self, run_id: str | None = None) -> list[SuperstepRecord]:
        """The supersteps of ``run_id`` (of every run when None), in start order."""
        rows = self._memory()
        if run_id is None:
            return [step.copy() for step in rows.steps.values()]
        run = rows.runs.get(run_id)
        return [] if run is None else [rows.steps[s].copy() for s in run.superstep_ids]

    def superstep(self, superstep_id: str) -> SuperstepRecord | None:
        """One superstep, or None."""
        step = self._memory().steps.get(superstep_id)
        return None if step is None else step.copy()

    @property
    def state(self) -> CommittedState:
        """The committed state the verdicts of this history were decided by: the kernel's fold,
        folded alongside (read it rather than folding the same events into a second one)."""
        return self._tracker.state

    @property
    def forked_from(self) -> ForkRecord | None:
        """Where this instance was forked from (its ``InstanceForked``), or None."""
        return self._forked_from

    def forks(self) -> list[ForkRecord]:
        """The instances forked from this one, oldest first, as the reader found them: empty
        for a fold of this instance's events alone (forks are in other instances' logs);
        ``Projector.history`` and ``history_of`` fill it."""
        return list(self._forks)

    def pending_requests(self) -> list[RequestRecord]:
        """Every request that counts and has no response yet: a fork's inherited from its
        origin's run first, then over all runs, in run order."""
        runs = self._memory().runs.values()
        return [*self._inherited, *(r for run in runs for r in run.pending_requests)]

    # -- persistence --------------------------------------------------------------------------

    def tracker_json(self) -> dict[str, Any]:
        """What the fold needs besides its records, as a small JSON tree (see ``from_rows``)."""
        forked = self._forked_from
        return {
            "tracker": self._tracker.to_json(),
            "requested_by": dict(self._requested_by),
            "forked_from": None if forked is None else forked.to_row(),
            "inherited": [request.to_row() for request in self._inherited],
            "last_run": self._last_run,
        }

    def to_json(self) -> dict[str, Any]:
        """The view as a JSON tree (one document; the materialized view keeps rows instead)."""
        rows = self._memory()
        return {
            "runs": [run.to_row() for run in rows.runs.values()],
            "steps": [step.to_row() for step in rows.steps.values()],
            "forks": [fork.to_row() for fork in self._forks],
            **self.tracker_json(),
        }

    @classmethod
    def from_json(cls, tree: dict[str, Any]) -> RunHistory:
        """Rebuild the view from ``to_json()``."""
        forks = [ForkRecord.from_row(row) for row in tree.get("forks", ())]
        return cls.from_rows(tree["runs"], tree["steps"], tree, forks=forks)

    @classmethod
    def from_rows(
        cls,
        runs: Iterable[dict[str, Any]],
        steps: Iterable[dict[str, Any]],
        tracker: dict[str, Any],
        *,
        forks: Iterable[ForkRecord] = (),
    ) -> RunHistory:
        """Rebuild the view from its rows (``to_row``, any order) and ``tracker_json()``: a run's
        ``superstep_ids`` and ``outputs`` follow from its supersteps, its ``continued_by`` from
        the runs that continue it."""
        rows = MemoryHistoryRows()
        for run in sorted((RunRecord.from_row(r) for r in runs), key=_start):
            rows.add_run(run)
            earlier = rows.runs.get(run.continues) if run.continues is not None else None
            if earlier is not None:
                continued(earlier, run.run_id)
        ordered = sorted((SuperstepRecord.from_row(s) for s in steps), key=_start)
        for step in ordered:
            rows.add_step(step)
            rows.runs[step.run_id].superstep_ids.append(step.superstep_id)
        committed = [s for s in ordered if s.status == "committed"]
        committed.sort(key=lambda s: s.position or 0)
        for step in committed:
            rows.runs[step.run_id].outputs.extend(step.outputs)
            rows.runs[step.run_id].dropped.extend(step.dropped)
        return cls(rows, tracker=tracker, forks=forks)

    def __eq__(self, other: object) -> bool:
        """Equal runs, supersteps and origin (``forks()`` depend on the reader, not the log)."""
        if not isinstance(other, RunHistory):
            return NotImplemented
        return (
            self.runs() == other.runs()
            and self.supersteps() == other.supersteps()
            and self.forked_from == other.forked_from
            and self.pending_requests() == other.pending_requests()
        )

    def __repr__(self) -> str:
        rows = self._rows
        if isinstance(rows, MemoryHistoryRows):
            return f"RunHistory(runs={len(rows.runs)}, supersteps={len(rows.steps)})"
        return f"RunHistory(rows={type(rows).__name__})"


def _start(record: RunRecord | SuperstepRecord) -> int:
    return record.start_position


def _fork_order(record: ForkRecord) -> tuple[datetime, str]:
    return record.forked_at, record.instance_id


def fork_record(event: InstanceForked) -> ForkRecord:
    """The ``ForkRecord`` of an ``InstanceForked`` event."""
    return ForkRecord(
        event.instance_id,
        event.origin_instance,
        event.origin_position,
        event.checkpoint,
        event.origin_run,
        event.timestamp,
    )


def fold_history(events: Iterable[EventBase], view: RunHistory | None = None) -> RunHistory:
    """Fold one instance's ``events`` (in stream order) into a ``RunHistory``."""
    return (RunHistory() if view is None else view).apply_all(events)
