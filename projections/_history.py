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

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, TypeVar

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


R = TypeVar("R", bound=BaseModel)
E = TypeVar("E")

# A run's outputs and superstep ids follow from its supersteps: its row leaves them out.
_DERIVED = frozenset({"outputs", "superstep_ids"})


def _record_of(entry: Any, cls: type[R]) -> R:
    """The pydantic record of a slotted fold entry: its fields by name, sequences as lists."""
    fields: dict[str, Any] = {}
    for name in cls.model_fields:
        value = getattr(entry, name)
        fields[name] = list(value) if isinstance(value, tuple | list) else value
    return cls.model_construct(**fields)


def _entry_of(cls: type[E], record_cls: type[BaseModel], row: dict[str, Any]) -> E:
    """The fold entry of a row (a record's JSON plus its ordinal ``n``): the converse of
    ``to_row``. Tuple fields of the entry get tuples, list fields fresh lists."""
    record = record_cls.model_validate({k: v for k, v in row.items() if k != "n"})
    values: dict[str, Any] = {"n": row["n"]}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name != "n":
            value = getattr(record, f.name)
            values[f.name] = tuple(value) if f.default == () else value
    return cls(**values)


@dataclass(slots=True)
class _Step:
    """A superstep as the fold keeps it: plain slots and tuples, a ``SuperstepRecord`` on demand.

    ``n`` is its start ordinal in the instance (the order of ``supersteps()``).
    """

    superstep_id: str
    run_id: str
    index: int
    started_at: datetime
    n: int
    status: Literal["open", "committed", "aborted"] = "open"
    reason: str | None = None
    error: ErrorInfo | None = None
    ended_at: datetime | None = None
    position: int | None = None
    executors: tuple[str, ...] = ()
    failed_executors: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()
    outputs: tuple[Any, ...] = ()

    def record(self) -> SuperstepRecord:
        return _record_of(self, SuperstepRecord)

    def to_row(self) -> dict[str, Any]:
        return {**self.record().model_dump(mode="json"), "n": self.n}

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> _Step:
        return _entry_of(cls, SuperstepRecord, row)


@dataclass(slots=True)
class _Run:
    """A run as the fold keeps it. ``outputs`` and ``superstep_ids`` follow from its supersteps,
    so a row (``to_row``) leaves them out and a reader rebuilds them (``RunHistory.from_rows``)."""

    run_id: str
    workflow_name: str
    started_at: datetime
    n: int
    status: RunStatus = "running"
    ended_at: datetime | None = None
    supersteps: int = 0
    committed: int = 0
    aborted: int = 0
    error: ErrorInfo | None = None
    closed_by: str | None = None
    outputs: list[Any] = field(default_factory=list)
    superstep_ids: list[str] = field(default_factory=list)

    def record(self) -> RunRecord:
        return _record_of(self, RunRecord)

    def to_row(self) -> dict[str, Any]:
        return {**self.record().model_dump(mode="json", exclude=set(_DERIVED)), "n": self.n}

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> _Run:
        return _entry_of(cls, RunRecord, row)


class RunHistory:
    """The runs of one instance and their supersteps (see the module docstring).

    The fold keeps compact records; ``runs()``, ``supersteps()`` and friends build the pydantic
    ``RunRecord`` / ``SuperstepRecord`` objects when asked (changing them changes no view).
    """

    __slots__ = ("_run_count", "_runs", "_step_count", "_steps", "_tracker")

    def __init__(self) -> None:
        self._runs: dict[str, _Run] = {}
        self._steps: dict[str, _Step] = {}
        self._run_count = 0
        self._step_count = 0
        self._tracker = SuperstepTracker()

    # -- record access (a materialized view loads records from its rows here) ----------------

    def _get_run(self, run_id: str) -> _Run | None:
        return self._runs.get(run_id)

    def _get_step(self, superstep_id: str) -> _Step | None:
        return self._steps.get(superstep_id)

    # -- folding ------------------------------------------------------------------------------

    def apply(self, event: EventBase) -> RunHistory:
        """Fold one event in; return the view."""
        outcome = self._tracker.apply(event)
        if isinstance(event, RunStarted):
            if self._get_run(event.run_id) is None:
                self._runs[event.run_id] = _Run(
                    event.run_id, event.workflow_name, event.timestamp, self._run_count
                )
                self._run_count += 1
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
        run = self._get_run(event.run_id)
        if run is None or run.status != "running" or self._get_step(event.superstep_id) is not None:
            return
        self._steps[event.superstep_id] = _Step(
            event.superstep_id, event.run_id, event.index, event.timestamp, self._step_count
        )
        self._step_count += 1
        run.supersteps += 1
        run.superstep_ids.append(event.superstep_id)

    def _note(self, event: EventBase, kind: str) -> None:
        step = self._get_step(event.superstep_id)  # type: ignore[attr-defined]
        if step is None:
            return
        if isinstance(event, ExecutorInvoked):
            step.executors += (event.executor_id,)
        elif isinstance(event, ExecutorFailed):
            step.failed_executors += (event.executor_id,)
        elif isinstance(event, StateStaged):
            if event.key not in step.keys:
                step.keys += (event.key,)
        elif isinstance(event, OutputYielded) and step.status == "open" and kind == "other":
            run = self._get_run(step.run_id)
            if run is not None and run.status == "running":
                step.outputs += (event.value,)

    def _close(self, event: EventBase, kind: str) -> None:
        step = self._get_step(event.superstep_id)  # type: ignore[attr-defined]
        if step is None:
            return
        step.position = event.position
        step.ended_at = event.timestamp
        run = self._get_run(step.run_id)
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

    def _end_run(self, event: EventBase) -> None:
        run = self._get_run(event.run_id)  # type: ignore[attr-defined]
        if run is None:
            return
        run.ended_at = event.timestamp
        if isinstance(event, RunAbandoned):
            run.status = event.reason
            run.closed_by = event.closed_by
        else:
            run.status = _END_STATUS[event.type]
        if isinstance(event, RunFailed):
            run.error = event.error
        if isinstance(event, RunCompleted):
            run.error = None

    # -- reading ------------------------------------------------------------------------------

    def runs(self) -> list[RunRecord]:
        """Every run, in start order."""
        return [run.record() for run in self._runs.values()]

    def run(self, run_id: str) -> RunRecord | None:
        """One run, or None."""
        run = self._runs.get(run_id)
        return None if run is None else run.record()

    def supersteps(self, run_id: str | None = None) -> list[SuperstepRecord]:
        """The supersteps of ``run_id`` (of every run when None), in start order."""
        if run_id is None:
            return [step.record() for step in self._steps.values()]
        run = self._runs.get(run_id)
        return [] if run is None else [self._steps[s].record() for s in run.superstep_ids]

    def superstep(self, superstep_id: str) -> SuperstepRecord | None:
        """One superstep, or None."""
        step = self._steps.get(superstep_id)
        return None if step is None else step.record()

    # -- persistence --------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The view as a JSON tree (one document; the materialized view keeps rows instead)."""
        return {
            "runs": [run.model_dump(mode="json") for run in self.runs()],
            "steps": [step.model_dump(mode="json") for step in self.supersteps()],
            "tracker": self._tracker.to_json(),
        }

    @classmethod
    def from_json(cls, tree: dict[str, Any]) -> RunHistory:
        """Rebuild the view from ``to_json()``."""
        view = cls()
        for n, raw in enumerate(tree["runs"]):
            run = _entry_of(_Run, RunRecord, {**raw, "n": n})
            view._runs[run.run_id] = run
        for n, raw in enumerate(tree["steps"]):
            step = _entry_of(_Step, SuperstepRecord, {**raw, "n": n})
            view._steps[step.superstep_id] = step
        view._run_count = len(view._runs)
        view._step_count = len(view._steps)
        view._tracker = SuperstepTracker.from_json(tree["tracker"])
        return view

    def tracker_json(self) -> dict[str, Any]:
        """What the fold needs besides its records, as a small JSON tree (see ``from_rows``)."""
        return {
            "tracker": self._tracker.to_json(),
            "runs": self._run_count,
            "steps": self._step_count,
        }

    @classmethod
    def from_rows(
        cls,
        runs: Iterable[dict[str, Any]],
        steps: Iterable[dict[str, Any]],
        tracker: dict[str, Any],
    ) -> RunHistory:
        """Rebuild the view from its rows (``_Run.to_row``, ``_Step.to_row``) and
        ``tracker_json()``: a run's ``superstep_ids`` and ``outputs`` follow from its supersteps."""
        view = cls()
        for run in sorted((_Run.from_row(r) for r in runs), key=lambda r: r.n):
            view._runs[run.run_id] = run
        ordered = sorted((_Step.from_row(s) for s in steps), key=lambda s: s.n)
        for step in ordered:
            view._steps[step.superstep_id] = step
            view._runs[step.run_id].superstep_ids.append(step.superstep_id)
        committed = [s for s in ordered if s.status == "committed"]
        committed.sort(key=lambda s: s.position or 0)
        for step in committed:
            view._runs[step.run_id].outputs.extend(step.outputs)
        view._load_tracker(tracker)
        return view

    def _load_tracker(self, tree: dict[str, Any]) -> None:
        self._tracker = SuperstepTracker.from_json(tree["tracker"])
        self._run_count = int(tree["runs"])
        self._step_count = int(tree["steps"])

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
