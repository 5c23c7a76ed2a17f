"""Recorded steps across a real crash: a process killed with SIGKILL at a step, resumed in a new
process, executes every step exactly once, except the one it died inside before its record.

The workflow is ``bench.step_crash``'s (also the steps benchmark's crash counts): ``intake`` commits
superstep 1; in superstep 2 ``agent`` stages a draft and calls the recorded steps ``reserve``,
``charge`` and ``email``, each appending a line to a counts file just before it returns. The worker
process dies by SIGKILL inside ``email`` (after its line, before its record) or right after it
returned (all three recorded, the superstep not committed). Then a new process resumes the run
(``wf.resume()``; or ``recover`` in this process first). The counts are exact: each step once,
``email`` twice when it died inside it, both times under one idempotency key. The log shows the
killed superstep aborted as ``crashed``, the killed run's records, and the resumed run's served
records pointing at them. On SQLite and PostgreSQL, in both durability modes; the memory store's
equivalent runs in-process (see its test).
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import pytest

from bench import step_crash
from bench.step_crash import OUTPUT, STATE, STEPS, agent_workflow, executions, summarize
from kernel import EventStore, open_store, recover

pytestmark = pytest.mark.slow


def kill(url: str, counts: Path, durability: str, point: str) -> None:
    """The worker, in a process of its own, runs the workflow until it dies at ``point``."""
    killed = step_crash.run_worker("crash", url, "order", str(counts), durability, point)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # The kill happened where planned: each step ran once, all in the killed process.
    done = executions(counts)
    assert [e.name for e in done] == list(STEPS)
    assert len({e.by for e in done}) == 1


def resume(url: str, counts: Path, durability: str) -> None:
    """Another new process continues the run, to the uninterrupted run's result."""
    resumed = step_crash.run_worker("resume", url, "order", str(counts), durability)
    assert resumed.returncode == 0, resumed.stderr
    report = json.loads(resumed.stdout)
    assert report == {"status": "completed", "outputs": [OUTPUT], "state": STATE}


def read(url: str) -> list[Any]:
    store = open_store(url, create=False)
    try:
        assert agent_workflow(store, "order").committed_state() == STATE
        events: list[Any] = store.read("order")
        return events
    finally:
        store.close()


def check_records(events: list[Any], served: tuple[str, ...]) -> None:
    """Each served record points at the killed run's record of the same call, with its key."""
    records = [e for e in events if e.type == "step_recorded"]
    by_position = {e.position: e for e in records}
    started = [e for e in events if e.type == "run_started"]
    killed, resumed = (e.run_id for e in started)
    reused = [e for e in records if e.reused is not None]
    assert [e.name for e in reused] == list(served)
    for record in reused:
        original = by_position[record.reused]
        assert (original.run_id, original.reused, original.error) == (killed, None, None)
        assert (original.name, original.key, original.step_key) == (
            record.name,
            record.key,
            record.step_key,
        )
        assert (record.run_id, record.result) == (resumed, None)
    # The continuation goes on from the killed run's checkpoint (superstep 1), and closed it.
    index = {e.superstep_id: e.index for e in events if e.type == "superstep_started"}
    (abandoned,) = [e for e in events if e.type == "run_abandoned"]
    assert (abandoned.run_id, abandoned.reason) == (killed, "crashed")
    assert (started[1].continues, index[started[1].checkpoint]) == (killed, 1)


@pytest.mark.parametrize("durability", ["superstep", "write"])
def test_killed_inside_a_step_only_that_step_runs_again(
    durable_store_url: str, durability: str, tmp_path: Path
) -> None:
    counts = tmp_path / "counts"
    kill(durable_store_url, counts, durability, "in_step")
    resume(durable_store_url, counts, durability)

    events = read(durable_store_url)
    summary = summarize(events, counts)
    assert summary.runs == {"reserve": 1, "charge": 1, "email": 2}
    assert summary.duplicates == 0
    assert (summary.recorded, summary.served, summary.rerun) == (
        ("reserve", "charge"),
        ("reserve", "charge"),
        ("email",),
    )
    assert summary.aborted == ((2, "crashed"),)
    assert summary.keys == {"reserve": 1, "charge": 1, "email": 1}  # one idempotency key each
    check_records(events, ("reserve", "charge"))
    (abandoned,) = [e for e in events if e.type == "run_abandoned"]
    resumed = [e for e in events if e.type == "run_started"][1]
    assert abandoned.closed_by == resumed.run_id
    # The aborted superstep's draft reached the log with the first record, and counts for
    # nothing: the committed state is the resumed superstep's (checked in ``read``).
    (aborted,) = [e for e in events if e.type == "superstep_aborted"]
    drafts = [e for e in events if e.type == "state_staged" and e.key == "draft"]
    assert [d.superstep_id == aborted.superstep_id for d in drafts] == [True, False]


def test_killed_after_its_last_step_every_step_is_served(
    durable_store_url: str, tmp_path: Path
) -> None:
    """Killed once ``email`` was recorded, before the superstep committed; ``recover`` (in this
    process) closes the run, and the resumed run is served all three steps."""
    counts = tmp_path / "counts"
    kill(durable_store_url, counts, "superstep", "after_steps")
    store = open_store(durable_store_url, create=False)
    try:
        (closed,) = recover(store, "order")
        killed = next(e for e in store.read("order") if e.type == "run_started")
        assert closed.run_id == killed.run_id
    finally:
        store.close()
    resume(durable_store_url, counts, "superstep")

    events = read(durable_store_url)
    summary = summarize(events, counts)
    assert summary.runs == {"reserve": 1, "charge": 1, "email": 1}
    assert summary.duplicates == 0
    assert summary.recorded == summary.served == STEPS
    assert (summary.rerun, summary.aborted) == ((), ((2, "crashed"),))
    check_records(events, STEPS)
    (abandoned,) = [e for e in events if e.type == "run_abandoned"]
    assert abandoned.closed_by.startswith("recover@")


async def test_memory_run_cancelled_inside_a_step_only_that_step_runs_again(
    tmp_path: Path,
) -> None:
    """The memory store's equivalent, in this process. A memory store cannot outlive its process,
    so there is no kill: the run is cancelled while ``email`` waits inside its body (after its
    line, before its record), the way a crash interrupts it, and then resumed on the same store.
    What differs from a crash is only the abort's reason: ``cancelled``."""
    counts = tmp_path / "counts"
    store: EventStore = open_store("memory://")
    inside = asyncio.Event()

    async def wait_for_the_cancellation() -> None:
        inside.set()
        await asyncio.Event().wait()  # never set

    with step_crash.plan(counts, "in_step", wait_for_the_cancellation, by="cancelled"):
        running = asyncio.create_task(agent_workflow(store, "order").run("order-7"))
    await inside.wait()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    with step_crash.plan(counts, by="resumed"):
        result = await agent_workflow(store, "order").resume()
    assert (result.status, result.get_outputs()) == ("completed", [OUTPUT])
    assert agent_workflow(store, "order").committed_state() == STATE

    events: list[Any] = store.read("order")
    summary = summarize(events, counts)
    assert summary.runs == {"reserve": 1, "charge": 1, "email": 2}
    assert [(e.name, e.by) for e in executions(counts)] == [
        ("reserve", "cancelled"),
        ("charge", "cancelled"),
        ("email", "cancelled"),
        ("email", "resumed"),
    ]
    assert summary.duplicates == 0
    assert (summary.served, summary.rerun) == (("reserve", "charge"), ("email",))
    assert summary.aborted == ((2, "cancelled"),)
    assert summary.keys == {"reserve": 1, "charge": 1, "email": 1}
