"""The records of run history: ``RunRecord``, ``SuperstepRecord``, and where a fold keeps them.

Each is the one form of its record: the fold changes it in place, readers get copies
(``copy()``), and a materialized view stores its JSON row (``to_row`` / ``from_row``).
``HistoryRows`` is the sink a ``RunHistory`` keeps its records in; ``MemoryHistoryRows`` keeps
them in dictionaries, a materialized view passes one over its table.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal, Protocol

from kernel import ErrorInfo

__all__ = [
    "HistoryRows",
    "MemoryHistoryRows",
    "RunRecord",
    "RunStatus",
    "StepStatus",
    "SuperstepRecord",
]

RunStatus = Literal["running", "completed", "failed", "cancelled", "abandoned", "crashed"]
StepStatus = Literal["open", "committed", "aborted"]


def _time(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def _error(tree: dict[str, Any] | None) -> ErrorInfo | None:
    return None if tree is None else ErrorInfo.model_validate(tree)


@dataclass(slots=True)
class SuperstepRecord:
    """One superstep: ``status`` is ``open``, ``committed`` or ``aborted`` (``reason`` says why).

    ``executors`` are the executors invoked, in order; ``failed_executors`` those that failed;
    ``keys`` the keys written (staged, whether or not they counted), in first-write order;
    ``outputs`` the outputs yielded before the marker (delivered only if ``committed``).
    ``start_position`` is the stream position of its ``superstep_started``, ``position`` that of
    its marker (None while open).
    """

    superstep_id: str
    run_id: str
    index: int
    started_at: datetime
    start_position: int
    status: StepStatus = "open"
    reason: str | None = None
    error: ErrorInfo | None = None
    ended_at: datetime | None = None
    position: int | None = None
    executors: list[str] = field(default_factory=list)
    failed_executors: list[str] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    outputs: list[Any] = field(default_factory=list)

    def copy(self) -> SuperstepRecord:
        """An independent copy (its lists are new)."""
        return replace(
            self,
            executors=list(self.executors),
            failed_executors=list(self.failed_executors),
            keys=list(self.keys),
            outputs=list(self.outputs),
        )

    def to_row(self) -> dict[str, Any]:
        """The record as a JSON row."""
        return {
            "superstep_id": self.superstep_id,
            "run_id": self.run_id,
            "index": self.index,
            "started_at": self.started_at.isoformat(),
            "start_position": self.start_position,
            "status": self.status,
            "reason": self.reason,
            "error": None if self.error is None else self.error.model_dump(mode="json"),
            "ended_at": None if self.ended_at is None else self.ended_at.isoformat(),
            "position": self.position,
            "executors": self.executors,
            "failed_executors": self.failed_executors,
            "keys": self.keys,
            "outputs": self.outputs,
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> SuperstepRecord:
        """The record of a row written by ``to_row``."""
        return cls(
            superstep_id=row["superstep_id"],
            run_id=row["run_id"],
            index=int(row["index"]),
            started_at=datetime.fromisoformat(row["started_at"]),
            start_position=int(row["start_position"]),
            status=row["status"],
            reason=row["reason"],
            error=_error(row["error"]),
            ended_at=_time(row["ended_at"]),
            position=row["position"],
            executors=list(row["executors"]),
            failed_executors=list(row["failed_executors"]),
            keys=list(row["keys"]),
            outputs=list(row["outputs"]),
        )


@dataclass(slots=True)
class RunRecord:
    """One run: its ``status``, times, number of supersteps started, committed outputs, error.

    ``outputs`` are wire JSON trees of the outputs of committed supersteps, in order (decode them
    with ``ValueCodec().decode``). ``closed_by`` is the run that closed an abandoned or crashed run.
    ``start_position`` is the stream position of its ``run_started``. ``outputs`` and
    ``superstep_ids`` follow from the run's supersteps, so its row leaves them out.
    """

    run_id: str
    workflow_name: str
    started_at: datetime
    start_position: int
    status: RunStatus = "running"
    ended_at: datetime | None = None
    supersteps: int = 0
    committed: int = 0
    aborted: int = 0
    error: ErrorInfo | None = None
    closed_by: str | None = None
    outputs: list[Any] = field(default_factory=list)
    superstep_ids: list[str] = field(default_factory=list)

    def copy(self) -> RunRecord:
        """An independent copy (its lists are new)."""
        return replace(self, outputs=list(self.outputs), superstep_ids=list(self.superstep_ids))

    def to_row(self) -> dict[str, Any]:
        """The record as a JSON row, without the derived ``outputs`` and ``superstep_ids``."""
        return {
            "run_id": self.run_id,
            "workflow_name": self.workflow_name,
            "started_at": self.started_at.isoformat(),
            "start_position": self.start_position,
            "status": self.status,
            "ended_at": None if self.ended_at is None else self.ended_at.isoformat(),
            "supersteps": self.supersteps,
            "committed": self.committed,
            "aborted": self.aborted,
            "error": None if self.error is None else self.error.model_dump(mode="json"),
            "closed_by": self.closed_by,
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> RunRecord:
        """The record of a row written by ``to_row`` (``outputs`` and ``superstep_ids`` empty)."""
        return cls(
            run_id=row["run_id"],
            workflow_name=row["workflow_name"],
            started_at=datetime.fromisoformat(row["started_at"]),
            start_position=int(row["start_position"]),
            status=row["status"],
            ended_at=_time(row["ended_at"]),
            supersteps=int(row["supersteps"]),
            committed=int(row["committed"]),
            aborted=int(row["aborted"]),
            error=_error(row["error"]),
            closed_by=row["closed_by"],
        )


class HistoryRows(Protocol):
    """Where a ``RunHistory`` keeps its records: the fold finds, adds and changes them in place."""

    def run(self, run_id: str) -> RunRecord | None:
        """The record of ``run_id``, or None."""

    def step(self, superstep_id: str) -> SuperstepRecord | None:
        """The record of ``superstep_id``, or None."""

    def add_run(self, record: RunRecord) -> None:
        """Keep a new run record."""

    def add_step(self, record: SuperstepRecord) -> None:
        """Keep a new superstep record."""


class MemoryHistoryRows:
    """``HistoryRows`` in dictionaries, in start order: what ``RunHistory`` reads from."""

    __slots__ = ("runs", "steps")

    def __init__(self) -> None:
        self.runs: dict[str, RunRecord] = {}
        self.steps: dict[str, SuperstepRecord] = {}

    def run(self, run_id: str) -> RunRecord | None:
        return self.runs.get(run_id)

    def step(self, superstep_id: str) -> SuperstepRecord | None:
        return self.steps.get(superstep_id)

    def add_run(self, record: RunRecord) -> None:
        self.runs[record.run_id] = record

    def add_step(self, record: SuperstepRecord) -> None:
        self.steps[record.superstep_id] = record
