"""A run needs nothing from its workflow but a ``RunnerContext``: here one with no store at all."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from kernel import (
    AbortReason,
    CommittedState,
    EventBase,
    InstanceForked,
    OpenRun,
    RunStarted,
    ValueCodec,
    WorkflowContext,
    counter_ids,
    executor,
)
from kernel._define._graph import Graph, Single
from kernel._run._algo import Router
from kernel._run._instance import RunnerContext
from kernel._run._ledger import Ledger
from kernel._run._runner import Run
from tests.kernel.helpers import kinds

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class SoleWriter:
    """The lease of a log nobody else writes: always free."""

    async def acquire(self) -> bool:
        return False

    def start_heartbeat(self, on_lost: Callable[[], None]) -> None:
        pass

    async def release(self) -> None:
        pass

    def release_now(self) -> None:
        pass


class ListContext:
    """A ``RunnerContext`` that keeps the log in a list."""

    def __init__(self, graph: Graph) -> None:
        self.instance_id = "listed"
        self.snapshots: list[bool] = []  # take_snapshot calls: every=...
        self.workflow_name = "in a list"
        self.router = Router(graph)
        self.max_supersteps = 10
        self.durability = "superstep"
        self.codec = ValueCodec()
        self.owner = "nowhere:0"
        self.sensitive_keys = ("token",)
        self.clock = lambda: T0
        self.hooks = ()
        self.live_steps = None
        self.new_id = counter_ids("id")
        self.log: list[EventBase] = []
        self.batches: list[int] = []

    def committed(self, key: str, default: Any) -> Any:
        return CommittedState().apply_all(self.log).values.get(key, default)

    def catch_up(self) -> OpenRun:
        return OpenRun().apply_all(self.log)

    def presumed_reason(self, owner: str) -> AbortReason:
        return "crashed"

    def lease_keeper(self) -> SoleWriter:
        return SoleWriter()

    def catch_up_ledger(self) -> tuple[OpenRun, Ledger]:
        return self.catch_up(), Ledger(self.instance_id).apply_all(self.log)

    def full_ledger(self) -> Ledger:
        return self.catch_up_ledger()[1]

    def take_snapshot(self, *, every: bool) -> None:
        self.snapshots.append(every)

    def origin_ledger(self, forked: InstanceForked) -> Ledger:
        raise AssertionError("a list is never forked")

    def append(self, batch: Sequence[EventBase], *, expected_version: int) -> None:
        assert expected_version == len(self.log)
        self.log.extend(batch)
        self.batches.append(len(batch))

    def append_commit(self, batch: Sequence[EventBase], *, expected_version: int) -> None:
        self.append(batch, expected_version=expected_version)


@executor(id="count")
async def count(n: int, ctx: WorkflowContext[int]) -> None:
    ctx.set_state("total", ctx.get_state("total", 0) + n)
    if n > 1:
        await ctx.send_message(n - 1)


@executor(id="echo")
async def echo(n: int, ctx: WorkflowContext[int]) -> None:
    await ctx.send_message(n)


async def test_a_run_drives_its_supersteps_through_the_context_alone():
    context = ListContext(
        Graph(
            {"count": count, "echo": echo},
            "count",
            (Single("count", "echo"), Single("echo", "count")),
        )
    )
    hosted: RunnerContext = context

    first = await Run(hosted, 3, {}).drive()
    second = await Run(hosted, 1, {}).drive()

    assert (first.run_id, first.supersteps, second.supersteps) == ("id-1", 5, 1)
    assert CommittedState().apply_all(context.log).values == {"total": 3 + 2 + 1 + 1}
    assert kinds(context.log)[:4] == [
        "run_started",
        "superstep_started",
        "executor_invoked",
        "state_staged",
    ]
    assert [e.position for e in context.log] == list(range(1, len(context.log) + 1))
    assert {e.timestamp for e in context.log} == {T0}
    started = [e for e in context.log if isinstance(e, RunStarted)]
    assert [e.sensitive_keys for e in started] == [["token"], ["token"]]
    assert len(context.batches) == 2 * 1 + 5 + 1  # one batch to start each run, one per superstep
