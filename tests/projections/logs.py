"""Test-side log generator: random runs and supersteps that follow the kernel's rules.

``plans()`` is a hypothesis strategy for the shape of an instance's log; ``build_events`` turns a
plan into events with ``kernel.testing.LogBuilder``, stamping them with a clock (so freezegun
controls the timestamps), and returns them in append batches (a superstep's events may be
appended one by one, as in "write" durability).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from hypothesis import strategies as st

from kernel import ErrorInfo, EventBase, EventStore
from kernel.testing import LogBuilder, ticking_clock

__all__ = [
    "EXECUTORS",
    "KEYS",
    "RunPlan",
    "StepPlan",
    "append_all",
    "build_events",
    "fixed_plans",
    "flatten",
    "plans",
    "ticking_clock",
]

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


def build_events(
    instance_id: str, plan: list[RunPlan], clock: Callable[[], datetime]
) -> list[list[EventBase]]:
    """The plan as events (made by ``LogBuilder``), grouped in append batches."""
    log = LogBuilder(instance_id, clock=clock)
    supersteps = 0

    def do(sid: str, act: tuple[Any, ...], *, run: str, one_by_one: bool) -> None:
        kind = act[0]
        if kind == "write":
            _, executor, key, op, value = act
            if op == "set":
                log.write(key, value, executor_id=executor, superstep=sid, run=run)
            else:
                log.delete(key, executor_id=executor, superstep=sid, run=run)
        elif kind == "invoke":
            log.invoke(act[1], superstep=sid, run=run)
        elif kind == "output":
            log.output(act[2], executor_id=act[1], superstep=sid, run=run)
        elif kind == "message":
            log.send("m", source=act[1], targets=["e1"], superstep=sid, run=run)
        else:
            log.complete(act[1], superstep=sid, run=run)
        if one_by_one:
            log.flush()

    to_close: tuple[str, str | None, RunPlan] | None = None
    for number, run in enumerate(plan, start=1):
        run_id = f"{instance_id}-r{number}"
        if to_close is not None:
            old_run, open_sid, closed = to_close
            if open_sid is not None and closed.mark_on_close:
                log.abort(closed.close_reason, superstep=open_sid)
            log.abandon_run(
                closed.close_reason,  # type: ignore[arg-type]
                closed_by=run_id,
                superstep_id=open_sid,
                run=old_run,
            )
            for act in closed.late_after_close:  # a straggler of the closed run: never counts
                do(open_sid or f"{old_run}-gone", act, run=old_run, one_by_one=False)
            to_close = None
        log.start_run(run_id=run_id, workflow_name="wf")
        log.flush()
        ended = False
        for step in run.steps:
            supersteps += 1
            sid = log.start_superstep(superstep_id=f"{instance_id}-s{supersteps}").superstep_id
            for act in step.actions:
                do(sid, act, run=run_id, one_by_one=not step.batch)
            boom = ErrorInfo(type="ValueError", message="boom")
            if step.outcome == "commit":
                log.commit()
            elif step.outcome == "failed":
                log.fail("e1", boom)
                log.abort("failed", error=boom)
            elif step.outcome == "cancelled":
                log.abort("cancelled")
            else:
                log.flush()
                to_close = (run_id, sid, run)
                ended = True
                break
            for act in step.late:
                do(sid, act, run=run_id, one_by_one=False)
            if step.outcome == "failed":
                log.fail_run(boom, executor_id="e1")
                ended = True
            elif step.outcome == "cancelled":
                log.cancel_run()
                ended = True
            log.flush()
            if ended:
                break
        if not ended:
            if run.crash_between:
                to_close = (run_id, None, run)
            else:
                log.complete_run()
        log.flush()
    return log.batches()


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
