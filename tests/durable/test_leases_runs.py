"""Leases at the level of runs: one writer per instance, across processes and workflow objects."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from kernel import (
    RunInProgressError,
    WorkflowBuilder,
    WorkflowContext,
    executor,
    open_store,
    recover,
)
from kernel.testing import LogBuilder

ROOT = Path(__file__).resolve().parents[2]
WORKER = "tests.durable.lease_run_worker"


@executor(id="step")
async def step(n: int, ctx: WorkflowContext[int]) -> None:
    ctx.set_state("n", n)
    if n < 2:
        await ctx.send_message(n + 1)


def looping(store: object, instance_id: str = "leased") -> object:
    return (
        WorkflowBuilder(start_executor=step, store=store, instance_id=instance_id)  # type: ignore[arg-type]
        .add_edge(step, step)
        .build()
    )


@pytest.mark.parametrize("round_", range(3))
def test_processes_racing_to_run_one_instance_exactly_one_wins(
    durable_store_url: str, round_: int, tmp_path: Path
) -> None:
    instance_id = f"race-{round_}"
    gate = tmp_path / "gate"
    open_store(durable_store_url).close()  # the schema exists before the race
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", WORKER, durable_store_url, instance_id],
            cwd=ROOT,
            env={**os.environ, "STEPLOG_TEST_GATE": str(gate)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    for worker in workers:
        assert worker.stdout is not None
        assert worker.stdout.readline().strip() == "ready"
    for worker in workers:
        assert worker.stdin is not None
        worker.stdin.write("go\n")
        worker.stdin.flush()
    # The winner's run is held open at its first superstep until the gate opens, so every other
    # worker tries while it runs: three must give up, whatever the timing.
    deadline = time.monotonic() + 60
    while sum(w.poll() is not None for w in workers) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sum(w.poll() is not None for w in workers) == 3, "not exactly three gave up"
    gate.touch()
    results = [json.loads(worker.communicate(timeout=60)[0]) for worker in workers]
    winners = [r for r in results if r["won"]]
    assert len(winners) == 1, results
    assert all("is being run by" in r["error"] for r in results if not r["won"])

    events = open_store(durable_store_url, create=False).read(instance_id)
    kinds = Counter(e.type for e in events)
    assert kinds["run_started"] == 1  # nothing written by the losers
    assert kinds["superstep_started"] == kinds["superstep_committed"] == 3
    assert kinds["run_completed"] == 1
    assert {e.run_id for e in events} == {winners[0]["run_id"]}  # type: ignore[attr-defined]
    assert [e.position for e in events] == list(range(1, len(events) + 1))


def open_run_of_a_dead_host(store: object, instance_id: str) -> tuple[str, str]:
    """A log whose run, owned by a process of another host, stopped mid-superstep."""
    log = LogBuilder(instance_id)
    started = log.start_run(1, workflow_name="step", owner="far-away-host:4242")
    opened = log.start_superstep()
    log.invoke("step")
    log.write("n", 99)
    log.append_to(store)  # type: ignore[arg-type]
    return started.run_id, opened.superstep_id


def lease_of(store: object, instance_id: str, owner: str, *, expired: bool) -> None:
    now = datetime.now(UTC)
    when = now - timedelta(hours=1) if expired else now
    lease = store.acquire_lease(instance_id, f"{owner}/t0", ttl=60.0, now=when)  # type: ignore[attr-defined]
    assert lease is not None


async def test_an_expired_lease_of_another_host_is_taken_over_and_its_superstep_crashed(
    store_url: str,
) -> None:
    store = open_store(store_url)
    run_id, superstep_id = open_run_of_a_dead_host(store, "leased")
    lease_of(store, "leased", "far-away-host:4242", expired=True)

    wf = looping(store)
    await wf.run(1)  # type: ignore[attr-defined]

    events = wf.events()  # type: ignore[attr-defined]
    aborted = [e for e in events if e.type == "superstep_aborted"]
    assert [(e.superstep_id, e.reason) for e in aborted] == [(superstep_id, "crashed")]
    ended = next(e for e in events if e.type == "run_abandoned")
    assert (ended.run_id, ended.reason) == (run_id, "crashed")
    assert wf.committed_state() == {"n": 2}  # type: ignore[attr-defined]
    assert store.read_lease("leased") is None  # the run gave it back


async def test_a_live_lease_of_another_host_refuses_a_run_and_recover_leaves_it(
    store_url: str,
) -> None:
    store = open_store(store_url)
    open_run_of_a_dead_host(store, "leased")
    lease_of(store, "leased", "far-away-host:4242", expired=False)
    before = store.read("leased")

    with pytest.raises(RunInProgressError, match="far-away-host:4242"):
        await looping(store).run(1)  # type: ignore[attr-defined]
    assert recover(store, "leased") == []
    assert store.read("leased") == before


async def test_recover_closes_a_run_whose_lease_expired(store_url: str) -> None:
    store = open_store(store_url)
    run_id, superstep_id = open_run_of_a_dead_host(store, "leased")
    lease_of(store, "leased", "far-away-host:4242", expired=True)

    (closed,) = recover(store)
    assert (closed.instance_id, closed.run_id, closed.superstep_id) == (
        "leased",
        run_id,
        superstep_id,
    )
    assert [e.type for e in store.read("leased")][-2:] == ["superstep_aborted", "run_abandoned"]
    assert recover(store) == []


async def test_a_run_waits_for_the_lease_when_asked_to(store_url: str) -> None:
    store = open_store(store_url)
    holder = f"{'far-away-host:1'}/t0"
    store.acquire_lease("leased", holder, ttl=60.0, now=datetime.now(UTC))
    wf = (
        WorkflowBuilder(start_executor=step, store=store, instance_id="leased")
        .add_edge(step, step)
        .with_lease(ttl=5.0, wait=2.0)
        .build()
    )

    async def release_soon() -> None:
        await asyncio.sleep(0.3)
        store.release_lease("leased", holder)

    releasing = asyncio.create_task(release_soon())
    result = await wf.run(1)
    await releasing
    assert result.status == "completed"


async def test_a_run_that_loses_its_lease_stops_and_appends_nothing(store_url: str) -> None:
    store = open_store(store_url)
    taken = asyncio.Event()

    @executor(id="slow")
    async def slow(n: int, ctx: WorkflowContext[int]) -> None:
        # Another process takes the lease over, as if this one looked dead.
        current = store.read_lease("leased")
        store.acquire_lease(
            "leased", "far-away-host:9/x", ttl=60.0, now=datetime.now(UTC), replace=current
        )
        taken.set()
        await asyncio.sleep(5)  # the heartbeat notices long before this ends

    wf = (
        WorkflowBuilder(start_executor=slow, store=store, instance_id="leased")
        .with_lease(ttl=0.15)
        .build()
    )
    with pytest.raises(RunInProgressError, match="lost the lease"):
        await wf.run(1)
    assert taken.is_set()
    current = asyncio.current_task()
    assert current is not None
    assert current.cancelling() == 0  # the caller's task is not left cancelled
    assert [e.type for e in wf.events()] == ["run_started", "superstep_started"]
