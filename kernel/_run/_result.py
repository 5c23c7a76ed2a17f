"""``RunResult``: what a run returns when it completes or stops waiting for input."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from kernel._base._errors import ExecutionError
from kernel._define._stream import WorkflowEvent, WorkflowRunState
from kernel._log._requests import PendingRequest
from kernel._run._emit import framework_event

__all__ = ["RunResult"]


_FINAL_STATES = {
    "completed": WorkflowRunState.IDLE,
    "awaiting_input": WorkflowRunState.IDLE_WITH_PENDING_REQUESTS,
}


@dataclass
class RunResult:
    """The outcome of a run that completed, or stopped waiting for responses to its requests.

    For a run that continues another, ``outputs`` and ``supersteps`` count from the start of the
    run it continues (its whole lineage), so a resumed run reports what an uninterrupted run of
    the same workflow would.

    Like AF's ``WorkflowRunResult``, it is also the sequence of the run's events: iterating it,
    ``len`` and indexing give the events a streaming consumer of this run got (without
    ``started`` and the ``status`` events, which ``status_timeline()`` gives; ``run(...,
    include_status_events=True)`` keeps them in). They are read back from the log the first
    time they are asked for (``replay``), so a run nobody asks costs nothing more.
    """

    run_id: str
    status: Literal["completed", "awaiting_input"]
    supersteps: int
    outputs: list[Any] = field(default_factory=list)
    pending_requests: list[PendingRequest] = field(default_factory=list)
    intermediate_outputs: list[Any] = field(default_factory=list)
    include_status_events: bool = field(default=False, repr=False, compare=False)
    _source: Callable[[], list[WorkflowEvent]] | None = field(
        default=None, repr=False, compare=False
    )
    _events: list[WorkflowEvent] | None = field(default=None, repr=False, compare=False)

    def events(self) -> list[WorkflowEvent]:
        """Every event of the run's stream, ``started`` and ``status`` events included."""
        if self._events is None:
            if self._source is None:
                raise ExecutionError(
                    f"the events of run {self.run_id} are not at hand: this RunResult was not "
                    "returned by a run; read them with replay(store, run_id)"
                )
            self._events = self._source()
        return list(self._events)

    def _shown(self) -> list[WorkflowEvent]:
        keep = self.include_status_events
        return [e for e in self.events() if e.type != "started" and (keep or e.type != "status")]

    def __iter__(self) -> Iterator[WorkflowEvent]:
        return iter(self._shown())

    def __len__(self) -> int:
        return len(self._shown())

    def __getitem__(self, index: int) -> WorkflowEvent:
        return self._shown()[index]

    def __bool__(self) -> bool:
        return True

    def get_outputs(self) -> list[Any]:
        """The workflow outputs yielded in committed supersteps, in order (of the whole
        lineage)."""
        return list(self.outputs)

    def get_intermediate_outputs(self) -> list[Any]:
        """The intermediate outputs (``intermediate_output_from=``) of committed supersteps, in
        order (of the whole lineage)."""
        return list(self.intermediate_outputs)

    def get_final_state(self) -> WorkflowRunState:
        """``IDLE`` for a completed run, ``IDLE_WITH_PENDING_REQUESTS`` for one waiting for
        responses: the state of the run's last ``status`` event."""
        return _FINAL_STATES[self.status]

    def status_timeline(self) -> list[WorkflowEvent]:
        """The run's ``status`` events, in order."""
        return [e for e in self.events() if e.type == "status"]

    def get_request_info_events(self) -> list[WorkflowEvent]:
        """The requests still waiting for a response, as ``request_info`` events."""
        return [
            framework_event(
                "request_info",
                self.run_id,
                executor_id=request.executor_id,
                superstep_id=request.superstep_id,
                data=request.data,
                request_id=request.request_id,
                response_type=request.response_type or None,
            )
            for request in self.pending_requests
        ]
