"""Rerun: a recorded run executed again with today's executors, and where it diverges."""

from __future__ import annotations

from typing import Any

import pytest

from kernel import (
    Divergence,
    EventStore,
    ExecutionError,
    Executor,
    RunHooks,
    RunStarted,
    ValueCodec,
    WorkflowBuilder,
    WorkflowContext,
    handler,
    open_store,
    rerun,
)
from kernel.testing import LogBuilder
from tests.durable.helpers import Counter, Tick


class Adder(Executor):
    """Adds its input to the committed ``total``: what it writes depends on the state before."""

    @handler
    async def add(self, amount: int, ctx: WorkflowContext[int, int]) -> None:
        total = ctx.get_state("total", 0) + amount
        ctx.set_state("total", total)
        await ctx.yield_output(total)


class Source(Executor):
    @handler
    async def go(self, n: int, ctx: WorkflowContext[int]) -> None:
        await ctx.send_message(n)


class Worker(Executor):
    def __init__(self, id: str, *, shout: bool = False) -> None:
        super().__init__(id)
        self.shout = shout

    @handler
    async def work(self, n: int, ctx: WorkflowContext[str, str]) -> None:
        ctx.set_state(self.id, n)
        await ctx.yield_output(f"{self.id}:{n}!" if self.shout else f"{self.id}:{n}")


def counter(store: Any, **options: Any) -> Any:
    step = Counter("counter", 4, **options)
    return (
        WorkflowBuilder(start_executor=step, store=store, instance_id="count")
        .add_edge(step, step)
        .build()
    )


def fan_out(store: Any, shouting: str = "") -> Any:
    source = Source("source")
    workers = [Worker(f"w{i}", shout=f"w{i}" == shouting) for i in range(3)]
    return (
        WorkflowBuilder(start_executor=source, store=store, instance_id="fan")
        .add_fan_out_edges(source, workers)
        .build()
    )


def first_run(wf: Any) -> str:
    return next(e.run_id for e in wf.events() if e.type == "run_started")


async def test_the_same_executors_match_the_record(store_url: str) -> None:
    store = open_store(store_url)
    wf = counter(store)
    await wf.run(Tick(1))
    before = wf.events()
    report = await rerun(counter(store), first_run(wf))
    assert report.matches
    assert report.divergence is None
    assert str(report) == f"rerun of run {first_run(wf)} matches the record"
    assert wf.events() == before  # the recorded instance is only read
    assert [e.type for e in report.events][:2] == ["instance_forked", "run_started"]


async def test_a_changed_state_write_is_reported_where_it_first_differs(store_url: str) -> None:
    store = open_store(store_url)
    wf = counter(store)
    await wf.run(Tick(1))
    report = await rerun(counter(store, scale=10), first_run(wf))
    assert not report.matches
    assert report.divergence == Divergence(3, "counter", "state", "count", 3, 30)
    assert str(report.divergence) == (
        "superstep 3, executor 'counter': state key 'count' was 3 in the record, 30 in the rerun"
    )


async def test_a_failure_fixed_today_is_an_outcome_divergence(store_url: str) -> None:
    store = open_store(store_url)
    wf = counter(store, fail_at=3)
    with pytest.raises(RuntimeError):
        await wf.run(Tick(1))
    report = await rerun(counter(store), first_run(wf))
    assert report.divergence == Divergence(
        3, "counter", "outcome", None, "aborted (failed: RuntimeError: boom at 3)", "committed"
    )
    same = await rerun(counter(store, fail_at=3), first_run(wf))
    assert same.matches  # failing the same way today is no divergence


async def test_the_rerun_starts_from_the_state_the_run_started_from(store_url: str) -> None:
    store = open_store(store_url)
    wf = WorkflowBuilder(start_executor=Adder("adder"), store=store, instance_id="sum").build()
    for amount in (5, 3, 1):
        await wf.run(amount)
    assert wf.committed_state() == {"total": 9}
    second = [e.run_id for e in wf.events() if e.type == "run_started"][1]
    assert (await rerun(wf, second)).matches  # 5 + 3 = 8 again, not 9 + 3, nor 0 + 3

    class Doubler(Adder):
        @handler
        async def add(self, amount: int, ctx: WorkflowContext[int, int]) -> None:
            await super().add(amount * 2, ctx)

    changed = WorkflowBuilder(start_executor=Doubler("adder"), store=store, instance_id="sum")
    report = await rerun(changed.build(), second)
    assert report.divergence == Divergence(1, "adder", "state", "total", 8, 11)


async def test_parallel_executors_are_compared_each_in_its_own_order(store_url: str) -> None:
    store = open_store(store_url)
    wf = fan_out(store)
    await wf.run(7)
    assert (await rerun(fan_out(store), first_run(wf))).matches
    report = await rerun(fan_out(store, shouting="w1"), first_run(wf))
    assert report.divergence == Divergence(2, "w1", "output", None, "w1:7", "w1:7!")


async def test_a_message_that_is_no_longer_sent_is_reported() -> None:
    store = open_store("memory://")
    wf = counter(store)
    await wf.run(Tick(1))

    class Quitter(Counter):
        @handler
        async def tick(self, tick: Tick, ctx: WorkflowContext[Tick, int]) -> None:
            ctx.set_state("count", tick.n)
            await ctx.yield_output(tick.n)
            if tick.n < 2:
                await ctx.send_message(Tick(tick.n + 1))

    step = Quitter("counter", 4)
    quitting = (
        WorkflowBuilder(start_executor=step, store=store, instance_id="count")
        .add_edge(step, step)
        .build()
    )
    report = await rerun(quitting, first_run(wf))
    assert report.divergence == Divergence(
        2, "counter", "message", None, Tick(3), Divergence.NOTHING
    )
    assert "message was Tick(n=3) in the record, <nothing> in the rerun" in str(report)


async def test_a_continuation_or_an_unknown_run_is_refused() -> None:
    store = open_store("memory://")
    wf = counter(store, fail_at=3)
    with pytest.raises(RuntimeError):
        await wf.run(Tick(1))
    resumed = await counter(store).resume()
    with pytest.raises(ExecutionError, match=f"continues run {first_run(wf)}.*only fresh runs"):
        await rerun(wf, resumed.run_id)
    with pytest.raises(ExecutionError, match="instance 'count' has no run 'nope'"):
        await rerun(wf, "nope")


async def test_the_rerun_keeps_the_workflows_lease_and_sensitive_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = open_store("memory://")
    step = Counter("counter", 2)
    wf = (
        WorkflowBuilder(start_executor=step, store=store, instance_id="count")
        .add_edge(step, step)
        .with_lease(ttl=7.0)
        .with_sensitive_keys("count")
        .build()
    )
    await wf.run(Tick(1))
    taken: list[tuple[EventStore, float]] = []
    acquire = EventStore.acquire_lease

    def spy(self: EventStore, instance_id: str, holder: str, **options: Any) -> Any:
        taken.append((self, options["ttl"]))
        return acquire(self, instance_id, holder, **options)

    monkeypatch.setattr(EventStore, "acquire_lease", spy)
    report = await rerun(wf, first_run(wf))
    assert report.matches
    started = next(e for e in report.events if isinstance(e, RunStarted))
    assert started.sensitive_keys == ["count"]  # readers of the scratch log redact it too
    assert {ttl for scratch, ttl in taken if scratch is not store} == {7.0}


async def test_a_rerun_calls_no_hooks_of_the_workflow() -> None:
    """A rerun checks a past run on a scratch store; it is not a run of the instance, so what
    follows the instance's runs (tracing, metrics) does not see it (docs/hooks.md)."""

    class Runs(RunHooks):
        def __init__(self) -> None:
            self.started: list[str] = []

        def run_started(self, run: Any) -> None:
            self.started.append(run.run_id)

    hooks = Runs()
    step = Counter("counter", 2)
    wf = (
        WorkflowBuilder(start_executor=step, store=open_store("memory://"), instance_id="c")
        .add_edge(step, step)
        .with_hooks(hooks)
        .build()
    )
    await wf.run(Tick(1))
    assert len(hooks.started) == 1
    report = await rerun(wf, first_run(wf))
    assert report.matches
    assert len(hooks.started) == 1


async def test_the_record_is_read_by_the_fold_s_marker_rule() -> None:
    """What a superstep staged after its first marker, and a second marker, never count for the
    record, as for every fold: the rerun matches a log that has both."""
    store = open_store("memory://")
    log = LogBuilder("sum", codec=ValueCodec())
    log.start_run(5, workflow_name="adder", run_id="r1")
    first = log.start_superstep().superstep_id
    log.invoke("adder")
    log.write("total", 5, executor_id="adder")
    log.output(5, executor_id="adder")
    log.complete()
    log.commit()
    log.write("total", 999, executor_id="adder", superstep=first)  # after the marker: inert
    log.abort(superstep=first)  # a second marker changes nothing
    log.complete_run()
    log.append_to(store)
    wf = WorkflowBuilder(start_executor=Adder("adder"), store=store, instance_id="sum").build()
    assert wf.committed_state() == {"total": 5}
    assert (await rerun(wf, "r1")).matches
