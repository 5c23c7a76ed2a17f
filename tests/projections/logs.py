"""Test-side log generator: random runs and supersteps that follow the kernel's rules.

``plans()`` is a hypothesis strategy for the shape of an instance's log; ``build_events`` turns a
plan into events, stamping them with a clock (so freezegun controls the timestamps), and returns
them in append batches (a superstep's events may be appended one by one, as in "write" durability).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import strategies as st

from kernel import (
    ErrorInfo,
    EventBase,
    EventStore,
    ExecutorCompleted,
    ExecutorFailed,
    ExecutorInvoked,
    MessageStaged,
    OutputYielded,
    RunAbandoned,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunStarted,
    StateStaged,
    SuperstepAborted,
    SuperstepCommitted,
    SuperstepStarted,
)

KEYS = ("a", "b", "plan")
EXECUTORS = ("e1", "e2", "e3")

values = st.one_of(
    st.integers(-3, 3),
    st.sampled_from(["x", "y"]),
    st.builds(lambda s: {"status": s}, st.sampled_from(["ok", "running", "failed"])),
    st.builds(lambda n: [n, {"k": n}], st.integers(0, 2)),
)
write = st.tuples(
    st.just("write"),
    st.sampled_from(EXECUTORS),
    st.sampled_from(KEYS),
    st.sampled_from(["set", "set", "delete"]),
    values,
)
action = st.one_of(
    write,
    write,
    st.tuples(st.just("invoke"), st.sampled_from(EXECUTORS)),
    st.tuples(st.just("output"), st.sampled_from(EXECUTORS), st.integers(0, 9)),
    st.tuples(st.just("message"), st.sampled_from(EXECUTORS)),
    st.tuples(st.just("completed"), st.sampled_from(EXECUTORS)),
)


@dataclass
class StepPlan:
    actions: list[tuple[Any, ...]]
    outcome: str  # commit | failed | cancelled | crash
    late: list[tuple[Any, ...]]
    batch: bool  # append the superstep in one batch, or write by write


@dataclass
class RunPlan:
    steps: list[StepPlan]
    crash_between: bool = False
    close_reason: str = "crashed"
    late_after_close: list[tuple[Any, ...]] = field(default_factory=list)
    # The kernel always aborts an open superstep when it closes a run; a damaged log may not.
    mark_on_close: bool = True


step_plans = st.builds(
    StepPlan,
    st.lists(action, max_size=5),
    st.sampled_from(["commit", "commit", "commit", "failed", "cancelled", "crash"]),
    st.lists(write, max_size=1),
    st.booleans(),
)
run_plans = st.builds(
    RunPlan,
    st.lists(step_plans, min_size=0, max_size=4),
    st.booleans(),
    st.sampled_from(["crashed", "abandoned"]),
    st.lists(write, max_size=1),
    st.sampled_from([True, True, True, True, False]),
)


def plans(max_runs: int = 4) -> st.SearchStrategy[list[RunPlan]]:
    """The shape of one instance's log: a few runs."""
    return st.lists(run_plans, min_size=1, max_size=max_runs)


def ticking_clock(start: datetime | None = None, step: float = 1.0) -> Callable[[], datetime]:
    """A clock that advances ``step`` seconds on every reading."""
    moment = [start or datetime(2025, 1, 1, tzinfo=UTC)]

    def now() -> datetime:
        moment[0] += timedelta(seconds=step)
        return moment[0]

    return now


def build_events(
    instance_id: str, plan: list[RunPlan], clock: Callable[[], datetime]
) -> list[list[EventBase]]:
    """The plan as events, grouped in append batches."""
    batches: list[list[EventBase]] = []
    batch: list[EventBase] = []
    position = 0
    counter = [0]

    def emit(cls: type[EventBase], **fields: Any) -> None:
        nonlocal position
        position += 1
        batch.append(cls(instance_id=instance_id, position=position, timestamp=clock(), **fields))

    def flush() -> None:
        nonlocal batch
        if batch:
            batches.append(batch)
            batch = []

    def do(run_id: str, sid: str, act: tuple[Any, ...], *, one_by_one: bool) -> None:
        kind = act[0]
        common = {"run_id": run_id, "superstep_id": sid}
        if kind == "write":
            _, executor, key, op, value = act
            emit(
                StateStaged,
                executor_id=executor,
                key=key,
                op=op,
                value=value if op == "set" else None,
                **common,
            )
        elif kind == "invoke":
            emit(ExecutorInvoked, executor_id=act[1], **common)
        elif kind == "output":
            emit(OutputYielded, executor_id=act[1], value=act[2], **common)
        elif kind == "message":
            emit(MessageStaged, source=act[1], targets=["e1"], message="m", **common)
        else:
            emit(ExecutorCompleted, executor_id=act[1], **common)
        if one_by_one:
            flush()

    to_close: tuple[str, str | None, str, list[tuple[Any, ...]], bool] | None = None
    for number, run in enumerate(plan, start=1):
        run_id = f"{instance_id}-r{number}"
        if to_close is not None:
            old_run, open_sid, reason, late, mark = to_close
            if open_sid is not None and mark:
                emit(SuperstepAborted, run_id=old_run, superstep_id=open_sid, reason=reason)
            emit(
                RunAbandoned, run_id=old_run, reason=reason, closed_by=run_id, superstep_id=open_sid
            )
            for act in late:  # a straggler of the closed run: never counts
                do(old_run, open_sid or f"{old_run}-gone", act, one_by_one=False)
            to_close = None
        emit(RunStarted, run_id=run_id, workflow_name="wf")
        flush()
        ended = False
        for index, step in enumerate(run.steps, start=1):
            counter[0] += 1
            sid = f"{instance_id}-s{counter[0]}"
            emit(SuperstepStarted, run_id=run_id, superstep_id=sid, index=index)
            for act in step.actions:
                do(run_id, sid, act, one_by_one=not step.batch)
            common = {"run_id": run_id, "superstep_id": sid}
            if step.outcome == "commit":
                emit(SuperstepCommitted, **common)
            elif step.outcome == "failed":
                error = ErrorInfo(type="ValueError", message="boom")
                emit(ExecutorFailed, executor_id="e1", error=error, **common)
                emit(SuperstepAborted, reason="failed", error=error, **common)
            elif step.outcome == "cancelled":
                emit(SuperstepAborted, reason="cancelled", **common)
            else:
                flush()
                to_close = (run_id, sid, run.close_reason, run.late_after_close, run.mark_on_close)
                ended = True
                break
            for act in step.late:
                do(run_id, sid, act, one_by_one=False)
            if step.outcome == "failed":
                emit(
                    RunFailed,
                    run_id=run_id,
                    error=ErrorInfo(type="ValueError", message="boom"),
                    executor_id="e1",
                    superstep_id=sid,
                )
                ended = True
            elif step.outcome == "cancelled":
                emit(RunCancelled, run_id=run_id, superstep_id=sid)
                ended = True
            flush()
            if ended:
                break
        if not ended:
            if run.crash_between:
                to_close = (run_id, None, run.close_reason, run.late_after_close, True)
            else:
                emit(RunCompleted, run_id=run_id, supersteps=len(run.steps))
        flush()
    return batches


def flatten(batches: list[list[EventBase]]) -> list[EventBase]:
    return [event for batch in batches for event in batch]


def append_all(store: EventStore, batches_by_instance: dict[str, list[list[EventBase]]]) -> None:
    """Append the batches of several instances, interleaved round-robin in the global log."""
    versions = dict.fromkeys(batches_by_instance, 0)
    queues = {i: list(b) for i, b in batches_by_instance.items()}
    while any(queues.values()):
        for instance_id, queue in queues.items():
            if queue:
                batch = queue.pop(0)
                store.append(instance_id, batch, expected_version=versions[instance_id])
                versions[instance_id] += len(batch)


def fixed_plans(copies: int = 1) -> list[list[RunPlan]]:
    """A deterministic mix for the non-property tests: commits, a failure, a cancellation with a
    late write, a crash closed by the next run, a run still going."""
    w = ("write", "e1", "a", "set", 1)
    w2 = ("write", "e2", "plan", "set", {"status": "failed"})
    d = ("write", "e3", "a", "delete", None)
    one = [
        RunPlan(
            [
                StepPlan([w, ("output", "e1", 1)], "commit", [], True),
                StepPlan([w2, ("invoke", "e2")], "commit", [w], False),
            ]
        ),
        RunPlan([StepPlan([d], "failed", [], True)]),
        RunPlan([StepPlan([w], "commit", [], False), StepPlan([d], "cancelled", [w2], True)]),
        RunPlan([StepPlan([w2], "crash", [], False)], close_reason="crashed"),
        RunPlan([StepPlan([d, w], "commit", [], True), StepPlan([w2], "commit", [], True)]),
    ]
    two = [RunPlan([StepPlan([w], "commit", [], True)], crash_between=True), RunPlan([])]
    return [one, two] * copies
