"""Run history: the runs of an instance and the supersteps of each run, as a pure fold.

``RunHistory().apply(event)`` folds one event of one instance (in stream order) and returns the
view; ``fold_history(events)`` folds a list. No I/O, no clock: times come from the events.

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
from typing import Any

from kernel import (
    RUN_END_TYPES,
    SUPERSTEP_MARKER_TYPES,
    EventBase,
    ExecutorFailed,
    ExecutorInvoked,
    Fold,
    OutputYielded,
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
from projections._runrecords import (
    HistoryRows,
    MemoryHistoryRows,
    RunRecord,
    RunStatus,
    SuperstepRecord,
    in_memory,
)
from projections._tracker import SuperstepTracker

__all__ = [
    "HistoryRows",
    "MemoryHistoryRows",
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
}


class RunHistory(Fold):
    """The runs of one instance and their supersteps (see the module docstring).

    ``rows`` is where the records live (a new ``MemoryHistoryRows`` by default); ``tracker``
    continues a saved fold (``tracker_json()``). ``runs()``, ``supersteps()`` and friends read
    memory rows and return copies (changing them changes no view).
    """

    __slots__ = ("_rows", "_tracker")

    def __init__(
        self, rows: HistoryRows | None = None, *, tracker: dict[str, Any] | None = None
    ) -> None:
        self._rows: HistoryRows = MemoryHistoryRows() if rows is None else rows
        self._tracker = SuperstepTracker()
        if tracker is not None:
            self._tracker = SuperstepTracker.from_json(tracker["tracker"])

    # -- folding ------------------------------------------------------------------------------

    @folds("run_started")
    def _run_started(self, event: RunStarted) -> None:
        rows = self._rows
        if rows.run(event.run_id) is None:
            rows.add_run(
                RunRecord(event.run_id, event.workflow_name, event.timestamp, event.position)
            )

    @folds("superstep_started")
    def _superstep_started(self, event: SuperstepStarted) -> None:
        self._tracker.track(event)
        rows = self._rows
        run = rows.run(event.run_id)
        if run is None or run.status != "running" or rows.step(event.superstep_id) is not None:
            return
        rows.add_step(
            SuperstepRecord(
                event.superstep_id, event.run_id, event.index, event.timestamp, event.position
            )
        )
        run.supersteps += 1
        run.superstep_ids.append(event.superstep_id)

    @folds("executor_invoked")
    def _invoked(self, event: ExecutorInvoked) -> None:
        step = self._rows.step(event.superstep_id)
        if step is not None:
            step.executors += (event.executor_id,)

    @folds("executor_failed")
    def _failed(self, event: ExecutorFailed) -> None:
        step = self._rows.step(event.superstep_id)
        if step is not None:
            step.failed_executors += (event.executor_id,)

    @folds("state_staged")
    def _staged(self, event: StateStaged) -> None:
        self._tracker.track(event)
        step = self._rows.step(event.superstep_id)
        if step is not None and event.key not in step.keys:
            step.keys += (event.key,)

    @folds("output_yielded")
    def _output(self, event: OutputYielded) -> None:
        step = self._rows.step(event.superstep_id)
        if step is None or step.status != "open":
            return
        run = self._rows.run(step.run_id)
        if run is not None and run.status == "running":
            step.outputs += (event.value,)

    @folds(*SUPERSTEP_MARKER_TYPES)
    def _marked(self, event: SuperstepEvent) -> None:
        kind = self._tracker.track(event).kind
        if kind != "committed" and kind != "aborted":
            return
        step = self._rows.step(event.superstep_id)
        if step is None:
            return
        step.position = event.position
        step.ended_at = event.timestamp
        run = self._rows.run(step.run_id)
        assert run is not None
        if kind == "committed":
            step.status = "committed"
            run.committed += 1
            run.outputs.extend(step.outputs)
        else:
            assert isinstance(event, SuperstepAborted)
            step.status = "aborted"
            step.reason = event.reason
            step.error = event.error
            run.aborted += 1

    @folds(*RUN_END_TYPES)
    def _run_ended(self, event: RunEvent) -> None:
        if self._tracker.track(event).kind != "run_ended":
            return
        run = self._rows.run(event.run_id)
        if run is None:
            return
        run.ended_at = event.timestamp
        if isinstance(event, RunAbandoned):
            run.status = event.reason
            run.closed_by = event.closed_by
        else:
            run.status = _END_STATUS[event.type]
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

    # -- persistence --------------------------------------------------------------------------

    def tracker_json(self) -> dict[str, Any]:
        """What the fold needs besides its records, as a small JSON tree (see ``from_rows``)."""
        return {"tracker": self._tracker.to_json()}

    def to_json(self) -> dict[str, Any]:
        """The view as a JSON tree (one document; the materialized view keeps rows instead)."""
        rows = self._memory()
        return {
            "runs": [run.to_row() for run in rows.runs.values()],
            "steps": [step.to_row() for step in rows.steps.values()],
            **self.tracker_json(),
        }

    @classmethod
    def from_json(cls, tree: dict[str, Any]) -> RunHistory:
        """Rebuild the view from ``to_json()``."""
        return cls.from_rows(tree["runs"], tree["steps"], tree)

    @classmethod
    def from_rows(
        cls,
        runs: Iterable[dict[str, Any]],
        steps: Iterable[dict[str, Any]],
        tracker: dict[str, Any],
    ) -> RunHistory:
        """Rebuild the view from its rows (``to_row``, any order) and ``tracker_json()``: a run's
        ``superstep_ids`` and ``outputs`` follow from its supersteps."""
        rows = MemoryHistoryRows()
        for run in sorted((RunRecord.from_row(r) for r in runs), key=_start):
            rows.add_run(run)
        ordered = sorted((SuperstepRecord.from_row(s) for s in steps), key=_start)
        for step in ordered:
            rows.add_step(step)
            rows.runs[step.run_id].superstep_ids.append(step.superstep_id)
        committed = [s for s in ordered if s.status == "committed"]
        committed.sort(key=lambda s: s.position or 0)
        for step in committed:
            rows.runs[step.run_id].outputs.extend(step.outputs)
        return cls(rows, tracker=tracker)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RunHistory):
            return NotImplemented
        return self.runs() == other.runs() and self.supersteps() == other.supersteps()

    def __repr__(self) -> str:
        rows = self._rows
        if isinstance(rows, MemoryHistoryRows):
            return f"RunHistory(runs={len(rows.runs)}, supersteps={len(rows.steps)})"
        return f"RunHistory(rows={type(rows).__name__})"


def _start(record: RunRecord | SuperstepRecord) -> int:
    return record.start_position


def fold_history(events: Iterable[EventBase], view: RunHistory | None = None) -> RunHistory:
    """Fold one instance's ``events`` (in stream order) into a ``RunHistory``."""
    return (RunHistory() if view is None else view).apply_all(events)
