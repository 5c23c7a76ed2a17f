"""Run history: the runs of an instance and the supersteps of each run, as a pure fold.

``RunHistory().apply(event)`` folds one event of one instance (in stream order) and returns the
view; ``fold_history(events)`` folds a list. No I/O, no clock: times come from the events.

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
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kernel._events import (
    ErrorInfo,
    EventBase,
    ExecutorFailed,
    ExecutorInvoked,
    OutputYielded,
    RunAbandoned,
    RunCompleted,
    RunFailed,
    RunStarted,
    StateStaged,
    SuperstepAborted,
    SuperstepStarted,
)
from projections._tracker import SuperstepTracker

__all__ = ["RunHistory", "RunRecord", "RunStatus", "SuperstepRecord", "fold_history"]

RunStatus = Literal["running", "completed", "failed", "cancelled", "abandoned", "crashed"]


class SuperstepRecord(BaseModel):
    """One superstep: ``status`` is ``open``, ``committed`` or ``aborted`` (``reason`` says why).

    ``executors`` are the executors invoked, in order; ``failed_executors`` those that failed;
    ``keys`` the keys written (staged, whether or not they counted), in first-write order;
    ``outputs`` the outputs yielded before the marker (delivered only if ``committed``).
    ``position`` is the stream position of the marker (None while open).
    """

    model_config = ConfigDict(extra="forbid")

    superstep_id: str
    run_id: str
    index: int
    status: Literal["open", "committed", "aborted"] = "open"
    reason: str | None = None
    error: ErrorInfo | None = None
    started_at: datetime
    ended_at: datetime | None = None
    position: int | None = None
    executors: list[str] = Field(default_factory=list)
    failed_executors: list[str] = Field(default_factory=list)
    keys: list[str] = Field(default_factory=list)
    outputs: list[Any] = Field(default_factory=list)


class RunRecord(BaseModel):
    """One run: its ``status``, times, number of supersteps started, committed outputs, error.

    ``outputs`` are wire JSON trees of the outputs of committed supersteps, in order (decode them
    with ``ValueCodec().decode``). ``closed_by`` is the run that closed an abandoned or crashed run.
    """

    model_config = ConfigDict(extra="forbid")

    run_id: str
    workflow_name: str
    status: RunStatus = "running"
    started_at: datetime
    ended_at: datetime | None = None
    supersteps: int = 0
    committed: int = 0
    aborted: int = 0
    outputs: list[Any] = Field(default_factory=list)
    error: ErrorInfo | None = None
    closed_by: str | None = None
    superstep_ids: list[str] = Field(default_factory=list)


_END_STATUS: dict[str, RunStatus] = {
    "run_completed": "completed",
    "run_failed": "failed",
    "run_cancelled": "cancelled",
}


class RunHistory:
    """The runs of one instance and their supersteps (see the module docstring)."""

    __slots__ = ("_runs", "_steps", "_tracker")

    def __init__(self) -> None:
        self._runs: dict[str, RunRecord] = {}
        self._steps: dict[str, SuperstepRecord] = {}
        self._tracker = SuperstepTracker()

    # -- folding ------------------------------------------------------------------------------

    def apply(self, event: EventBase) -> RunHistory:
        """Fold one event in; return the view."""
        outcome = self._tracker.apply(event)
        if isinstance(event, RunStarted):
            self._runs.setdefault(
                event.run_id,
                RunRecord(
                    run_id=event.run_id,
                    workflow_name=event.workflow_name,
                    started_at=event.timestamp,
                ),
            )
        elif isinstance(event, SuperstepStarted):
            self._start_superstep(event)
        elif isinstance(event, ExecutorInvoked | ExecutorFailed | StateStaged | OutputYielded):
            self._note(event, outcome.kind)
        elif outcome.kind in ("committed", "aborted"):
            self._close(event, outcome.kind)
        elif outcome.kind == "run_ended":
            self._end_run(event)
        return self

    def _start_superstep(self, event: SuperstepStarted) -> None:
        run = self._runs.get(event.run_id)
        if run is None or run.status != "running" or event.superstep_id in self._steps:
            return
        self._steps[event.superstep_id] = SuperstepRecord(
            superstep_id=event.superstep_id,
            run_id=event.run_id,
            index=event.index,
            started_at=event.timestamp,
        )
        run.supersteps += 1
        run.superstep_ids.append(event.superstep_id)

    def _note(self, event: EventBase, kind: str) -> None:
        step = self._steps.get(event.superstep_id)  # type: ignore[attr-defined]
        if step is None:
            return
        if isinstance(event, ExecutorInvoked):
            step.executors.append(event.executor_id)
        elif isinstance(event, ExecutorFailed):
            step.failed_executors.append(event.executor_id)
        elif isinstance(event, StateStaged):
            if event.key not in step.keys:
                step.keys.append(event.key)
        elif isinstance(event, OutputYielded) and step.status == "open" and kind == "other":
            run = self._runs.get(step.run_id)
            if run is not None and run.status == "running":
                step.outputs.append(event.value)

    def _close(self, event: EventBase, kind: str) -> None:
        step = self._steps.get(event.superstep_id)  # type: ignore[attr-defined]
        if step is None:
            return
        step.position = event.position
        step.ended_at = event.timestamp
        run = self._runs[step.run_id]
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

    def _end_run(self, event: EventBase) -> None:
        run = self._runs.get(event.run_id)  # type: ignore[attr-defined]
        if run is None:
            return
        run.ended_at = event.timestamp
        if isinstance(event, RunAbandoned):
            run.status = event.reason
            run.closed_by = event.closed_by
        else:
            run.status = _END_STATUS[event.type]  # type: ignore[attr-defined]
        if isinstance(event, RunFailed):
            run.error = event.error
        if isinstance(event, RunCompleted):
            run.error = None

    # -- reading ------------------------------------------------------------------------------

    def runs(self) -> list[RunRecord]:
        """Every run, in start order."""
        return list(self._runs.values())

    def run(self, run_id: str) -> RunRecord | None:
        """One run, or None."""
        return self._runs.get(run_id)

    def supersteps(self, run_id: str | None = None) -> list[SuperstepRecord]:
        """The supersteps of ``run_id`` (of every run when None), in start order."""
        if run_id is None:
            return list(self._steps.values())
        run = self._runs.get(run_id)
        return [] if run is None else [self._steps[s] for s in run.superstep_ids]

    def superstep(self, superstep_id: str) -> SuperstepRecord | None:
        """One superstep, or None."""
        return self._steps.get(superstep_id)

    # -- persistence --------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The view as a JSON tree (for materialized views)."""
        return {
            "runs": [run.model_dump(mode="json") for run in self._runs.values()],
            "steps": [step.model_dump(mode="json") for step in self._steps.values()],
            "tracker": self._tracker.to_json(),
        }

    @classmethod
    def from_json(cls, tree: dict[str, Any]) -> RunHistory:
        """Rebuild the view from ``to_json()``."""
        view = cls()
        for run in tree["runs"]:
            record = RunRecord.model_validate(run)
            view._runs[record.run_id] = record
        for step in tree["steps"]:
            srecord = SuperstepRecord.model_validate(step)
            view._steps[srecord.superstep_id] = srecord
        view._tracker = SuperstepTracker.from_json(tree["tracker"])
        return view

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RunHistory):
            return NotImplemented
        return self.runs() == other.runs() and self.supersteps() == other.supersteps()

    def __repr__(self) -> str:
        return f"RunHistory(runs={len(self._runs)}, supersteps={len(self._steps)})"


def fold_history(events: Iterable[EventBase], view: RunHistory | None = None) -> RunHistory:
    """Fold one instance's ``events`` (in stream order) into a ``RunHistory``."""
    view = RunHistory() if view is None else view
    for event in events:
        view.apply(event)
    return view
