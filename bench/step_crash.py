"""A graph workflow whose handler calls three recorded steps, killed with SIGKILL at the third and
resumed in a new process. Used by the steps benchmark (its crash counts) and by
``tests/durable/test_step_crash.py``.

    python -m bench.step_crash crash URL INSTANCE COUNTS DURABILITY POINT
    python -m bench.step_crash resume URL INSTANCE COUNTS DURABILITY

The workflow: ``intake`` (superstep 1) stages the order and sends it on; ``agent`` (superstep 2)
stages a draft, calls the steps ``reserve``, ``charge`` and ``email`` one after the other, stages
the receipt and yields it. Each step, once its work is done and just before it returns, appends a
line ``NAME BY STEP_KEY`` to the file COUNTS: the file's lines are the steps' executions, who ran
each (the process id, unless the plan names the attempt) and the idempotency key each was given.

``crash`` runs the workflow from its start and dies at ``POINT``:

* ``in_step``: inside ``email``, after its line and before it returns, so before its record: an
  execution the log never saw, which the resumed run must do again (``email`` runs twice, both
  times with the same step key; ``reserve`` and ``charge`` are served from the log);
* ``after_steps``: in the handler, after ``email`` returned (all three recorded), before the
  superstep commits: the resumed run serves all three.

It exits with ``EXIT_NOT_REACHED`` if the run ends without dying. ``resume`` continues the
instance's last run (``wf.resume()``, which first closes the killed run as crashed) and prints its
result and the committed state as one JSON object.

In-process (a memory store cannot outlive its process), ``plan(..., die=..., by=...)`` replaces the
kill with any coroutine, for example one that waits until the run is cancelled, and names the
attempt in the counts file.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel import (
    EventStore,
    Executor,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    handler,
    open_store,
    step,
    step_key,
)

__all__ = [
    "EXIT_NOT_REACHED",
    "OUTPUT",
    "POINTS",
    "STATE",
    "STEPS",
    "Execution",
    "Plan",
    "Summary",
    "agent_workflow",
    "crash",
    "executions",
    "expected_runs",
    "plan",
    "resume",
    "run_worker",
    "summarize",
]

ORDER = "order-7"
STEPS = ("reserve", "charge", "email")
"""The recorded steps, in the order the handler calls them."""
POINTS = ("in_step", "after_steps")
EXIT_NOT_REACHED = 3
"""The exit status of a ``crash`` whose kill point was never reached (a broken run, not a pass)."""

RECEIPT = {"reservation": f"R-{ORDER}", "charged": 4200, "mail": f"M-{ORDER}"}
OUTPUT = f"{ORDER}: reserved R-{ORDER}, charged 4200, mailed M-{ORDER}"
"""The run's one output."""
STATE = {"order": ORDER, "draft": f"receipt for {ORDER}", "receipt": RECEIPT}
"""The committed state once the run completed."""


def expected_runs(point: str) -> dict[str, int]:
    """How many times each step executes across the kill and the resume: once, but ``email``
    twice when the process died inside it (before its record)."""
    return {name: 2 if (point, name) == ("in_step", "email") else 1 for name in STEPS}


# -- the plan: where executions are counted, and where the first attempt dies -------------------


async def sigkill() -> None:
    """SIGKILL this process: no handler, no finally, no flush runs."""
    os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True)
class Plan:
    """Where the steps count their executions (``counts``, each line naming the attempt ``by``:
    this process's id by default), and where the run dies (``point``, None: nowhere) by awaiting
    ``die``."""

    counts: Path
    point: str | None = None
    die: Callable[[], Awaitable[None]] = sigkill
    by: str = field(default_factory=lambda: str(os.getpid()))


PLAN: contextvars.ContextVar[Plan] = contextvars.ContextVar("step_crash_plan")
"""The plan of the runs started in this context (the runner's tasks inherit it)."""


@contextlib.contextmanager
def plan(
    counts: Path,
    point: str | None = None,
    die: Callable[[], Awaitable[None]] = sigkill,
    by: str | None = None,
) -> Iterator[Plan]:
    """Runs started inside this block follow the plan ``Plan(counts, point, die, by)``."""
    chosen = Plan(counts, point, die) if by is None else Plan(counts, point, die, by)
    token = PLAN.set(chosen)
    try:
        yield chosen
    finally:
        PLAN.reset(token)


async def _done(name: str, result: Any) -> Any:
    """A step's work is done: count the execution, die if the plan says so here, return."""
    chosen = PLAN.get()
    with chosen.counts.open("a") as counts:
        counts.write(f"{name} {chosen.by} {step_key()}\n")
    if chosen.point == "in_step" and name == STEPS[-1]:
        await chosen.die()
    return result


@dataclass(frozen=True)
class Execution:
    """One line of the counts file: a step's execution, by which attempt, with which key."""

    name: str
    by: str
    step_key: str


def executions(counts: Path) -> list[Execution]:
    """The executions the counts file holds, in order (none if it does not exist)."""
    if not counts.exists():
        return []
    found = []
    for line in counts.read_text().splitlines():
        name, by, key = line.split()
        found.append(Execution(name, by, key))
    return found


# -- the workflow -------------------------------------------------------------------------------


@step
async def reserve(order: str) -> str:
    return await _done("reserve", f"R-{order}")


@step
async def charge(order: str, cents: int) -> int:
    return await _done("charge", cents)


@step
async def email(order: str, reservation: str) -> str:
    return await _done("email", f"M-{order}")


class Intake(Executor):
    @handler
    async def take(self, order: str, ctx: WorkflowContext[str]) -> None:
        ctx.set_state("order", order)
        await ctx.send_message(order)


class Agent(Executor):
    @handler
    async def act(self, order: str, ctx: WorkflowContext[str, str]) -> None:
        ctx.set_state("draft", f"receipt for {order}")
        reservation = await reserve(order)
        charged = await charge(order, 4200)
        mail = await email(order, reservation)
        chosen = PLAN.get()
        if chosen.point == "after_steps":
            await chosen.die()
        ctx.set_state("receipt", {"reservation": reservation, "charged": charged, "mail": mail})
        await ctx.yield_output(f"{order}: reserved {reservation}, charged {charged}, mailed {mail}")


def agent_workflow(store: EventStore, instance_id: str, durability: Any = "superstep") -> Workflow:
    intake, agent = Intake("intake"), Agent("agent")
    return (
        WorkflowBuilder(
            start_executor=intake,
            store=store,
            instance_id=instance_id,
            name="step-crash",
            durability=durability,
        )
        .add_edge(intake, agent)
        .build()
    )


# -- what happened ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Summary:
    """What a kill and its resume came to, from the counts file and the log.

    ``runs``: executions per step; ``duplicates``: executions of a call that had been recorded
    already (by the killed run, or earlier in the same process); ``recorded``: the steps the
    killed run recorded; ``served``: the steps the resumed run was served from the log;
    ``rerun``: the steps it executed; ``aborted``: (index, reason) of each aborted superstep;
    ``keys``: per step, the distinct idempotency keys its executions were given.
    """

    runs: dict[str, int]
    duplicates: int
    recorded: tuple[str, ...]
    served: tuple[str, ...]
    rerun: tuple[str, ...]
    aborted: tuple[tuple[int, str], ...]
    keys: dict[str, int]


def summarize(events: Sequence[Any], counts: Path) -> Summary:
    """``events``: the instance's log (its first run is the killed one); ``counts``: the file."""
    done = executions(counts)
    started = [e.run_id for e in events if e.type == "run_started"]
    killed, later = started[0], set(started[1:])
    records = [e for e in events if e.type == "step_recorded" and e.error is None]
    recorded = tuple(e.name for e in records if e.run_id == killed and e.reused is None)
    first = done[0].by if done else None  # the killed attempt ran the first execution
    duplicates = sum(1 for e in done if e.by != first and e.name in recorded)
    duplicates += sum(n - 1 for n in Counter((e.name, e.by) for e in done).values())
    index = {e.superstep_id: e.index for e in events if e.type == "superstep_started"}
    return Summary(
        runs=dict(Counter(e.name for e in done)),
        duplicates=duplicates,
        recorded=recorded,
        served=tuple(e.name for e in records if e.run_id in later and e.reused is not None),
        rerun=tuple(e.name for e in records if e.run_id in later and e.reused is None),
        aborted=tuple(
            (index[e.superstep_id], e.reason) for e in events if e.type == "superstep_aborted"
        ),
        keys={name: len({e.step_key for e in done if e.name == name}) for name in STEPS},
    )


def run_worker(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """``python -m bench.step_crash ARGS`` in a new process, from the repository's root."""
    root = Path(__file__).resolve().parent.parent
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-m", "bench.step_crash", *args],
        cwd=root,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# -- the two modes ------------------------------------------------------------------------------


async def crash(url: str, instance_id: str, counts: Path, durability: str, point: str) -> int:
    """Run the workflow from its start and die at ``point``; ``EXIT_NOT_REACHED`` if it ends."""
    if point not in POINTS:
        raise SystemExit(f"unknown kill point {point!r}; one of {', '.join(POINTS)}")
    store = open_store(url)
    with plan(counts, point):
        await agent_workflow(store, instance_id, durability).run(ORDER)
    print(f"kill point {point} never reached", file=sys.stderr)
    return EXIT_NOT_REACHED


async def resume(url: str, instance_id: str, counts: Path, durability: str) -> dict[str, Any]:
    """Continue the instance's last run in this process: its result and the committed state."""
    store = open_store(url, create=False)
    try:
        wf = agent_workflow(store, instance_id, durability)
        with plan(counts):
            result = await wf.resume()
        return {
            "status": result.status,
            "outputs": result.get_outputs(),
            "state": wf.committed_state(),
        }
    finally:
        store.close()


def main(argv: Sequence[str]) -> int:
    mode, *args = argv
    if mode == "crash" and len(args) == 5:
        url, instance_id, counts, durability, point = args
        return asyncio.run(crash(url, instance_id, Path(counts), durability, point))
    if mode == "resume" and len(args) == 4:
        url, instance_id, counts, durability = args
        print(json.dumps(asyncio.run(resume(url, instance_id, Path(counts), durability))))
        return 0
    raise SystemExit(__doc__)


if __name__ == "__main__":
    # Run under its importable name, as the bench and the tests import it.
    from bench import step_crash

    sys.exit(step_crash.main(sys.argv[1:]))
