"""Recorded steps as the readers show them: each ``StepRecorded`` of a run beside the verdict of
its superstep, and, for a call served from the log, the record it reused.

Nothing is decided here. The verdict is the run history's (``SuperstepRecord.status`` and
``reason``: the kernel's marker rule, through ``SuperstepTracker``); a step's record never makes
anything count. It is provenance, not state: no fold of state reads ``step_recorded``
(``CommittedState``, blame and time travel ignore it), so a step recorded in an aborted
superstep still happened (its result is what a retry is served) while nothing it returned is
state, at any point.

A served call's own record holds no result, only ``reused``: the stream position of the record
whose result it was served (in the same instance: a lineage never crosses a fork). The reader
finds that record (``origins``) and the step shows its result and its run: the run that first
recorded it.

Example::

    past = fold_history(store.read("mail"))
    records = [e for e in store.read("mail") if isinstance(e, StepRecorded)]
    for step in recorded_steps(records, {s.superstep_id: s for s in past.supersteps()}):
        print(step.record.name, step.verdict, step.result, step.origin_run)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kernel import StepRecorded
from projections._folds._runrecords import StepStatus, SuperstepRecord

__all__ = ["RecordedStep", "recorded_steps"]


@dataclass(frozen=True, slots=True)
class RecordedStep:
    """One recorded step call: its ``record`` (the ``StepRecorded`` event), the ``index`` of its
    superstep in the run (None when the run history does not know the superstep), that
    superstep's ``verdict`` (``committed``, ``aborted``, or ``open``: no marker in the history
    yet) and ``reason`` (why it aborted), and ``origin``: for a served call, the record it
    reused, when the log holds a step record at that position (None otherwise)."""

    record: StepRecorded
    index: int | None
    verdict: StepStatus
    reason: str | None
    origin: StepRecorded | None = None

    @property
    def served(self) -> bool:
        """Whether the call was served from the log instead of running."""
        return self.record.reused is not None

    @property
    def result(self) -> Any:
        """What the call returned, as a wire JSON tree: its own record's result, or for a served
        call the result it was served (its origin's; None when no step record is there)."""
        if self.record.reused is None:
            return self.record.result
        return None if self.origin is None else self.origin.result

    @property
    def arguments(self) -> Any:
        """What the call was called with, as a wire JSON object, when its step records its
        arguments (None otherwise): its own record's, or for a served call its origin's."""
        if self.record.reused is None:
            return self.record.arguments
        return None if self.origin is None else self.origin.arguments

    @property
    def origin_run(self) -> str | None:
        """For a served call, the run that first recorded it (None when not served, or when the
        position it names holds no step record)."""
        return None if self.origin is None else self.origin.run_id

    def to_row(self) -> dict[str, Any]:
        """The step as ``steplog steps --json`` and ``show --json`` print it."""
        record = self.record
        reused = record.reused
        return {
            "position": record.position,
            "timestamp": record.timestamp.isoformat(),
            "run_id": record.run_id,
            "superstep_id": record.superstep_id,
            "index": self.index,
            "verdict": self.verdict,
            "reason": self.reason,
            "executor_id": record.executor_id,
            "name": record.name,
            "call": record.call,
            "key": record.key,
            "step_key": record.step_key,
            "lineage": record.lineage,
            "digest": record.digest,
            "arguments": self.arguments,
            "result": self.result,
            "error": None if record.error is None else record.error.model_dump(mode="json"),
            "duration": record.duration,
            "usage": None if record.usage is None else dict(record.usage),
            "reused": None if reused is None else {"position": reused, "run_id": self.origin_run},
        }


def recorded_steps(
    records: Iterable[StepRecorded],
    supersteps: Mapping[str, SuperstepRecord],
    origins: Mapping[int, StepRecorded] = {},
) -> list[RecordedStep]:
    """``records`` (in stream order) with their supersteps' verdicts, from ``supersteps`` (the
    run history's records by superstep id), and each served call's origin from ``origins``
    (step records by stream position; ``records`` are looked in first). Raises
    ``LogIntegrityError`` (kind ``"reused"``) for a served call whose origin is not a recorded
    result of the same call (``StepRecorded.origin_in``: the rule ``replay`` and the runner keep).
    """
    records = list(records)
    found = {**origins, **{record.position: record for record in records}}
    steps = []
    for record in records:
        superstep = supersteps.get(record.superstep_id)
        origin = None if record.reused is None else record.origin_in(found)
        steps.append(
            RecordedStep(
                record,
                None if superstep is None else superstep.index,
                "open" if superstep is None else superstep.status,
                None if superstep is None else superstep.reason,
                origin,
            )
        )
    return steps
