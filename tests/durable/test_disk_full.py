"""A full disk never makes a process refuse itself (issue 21).

A run whose commit fails on a full disk cannot record its end nor give its lease back (each is a
write). The lease then used to block every later run of the same process, which got
``RunInProgressError`` naming itself until the lease's ttl ran out. Now a lease that a keeper of
the store could not release is "stranded" (``EventStore.stranded_leases``), and the next run of
the process takes it back at once; while the disk is still full that run fails with the disk's
own error, and once there is room it runs, closing the run that could not record its end.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kernel import (
    RunAbandoned,
    RunInProgressError,
    StoreUnavailableError,
    WorkflowBuilder,
    WorkflowContext,
    executor,
    open_store,
)

ROOT = Path(__file__).resolve().parents[2]
_ON_A_SMALL_DISK = 'mount -t tmpfs -o size=1m steplog-test "$1" || exit 97; shift; exec "$@"'


def on_a_small_disk(directory: Path) -> dict[str, Any]:
    """The report of ``disk_full_worker`` run on a 1 MB tmpfs mounted at ``directory``, in a
    mount namespace of its own (nothing is mounted outside the child)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1) to mount a small file system")
    as_user = [] if os.geteuid() == 0 else ["--map-root-user"]
    done = subprocess.run(
        [unshare, *as_user, "--mount", "--propagation", "private", "sh", "-c", _ON_A_SMALL_DISK,
         "sh", str(directory), sys.executable, "-m", "tests.durable.disk_full_worker",
         str(directory)],
        capture_output=True, text=True, timeout=120, check=False, cwd=ROOT,
    )  # fmt: skip
    if done.returncode == 97 or (done.returncode != 0 and "unshare:" in done.stderr):
        pytest.skip(f"cannot mount a small file system here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def test_after_a_full_disk_the_process_runs_again_without_refusing_itself(tmp_path: Path) -> None:
    report = on_a_small_disk(tmp_path)
    assert report["first"] == "ok"
    assert report["full"].startswith("StoreUnavailableError: ")
    assert "the disk is full" in report["full"]
    assert report["lease_left"] is not None  # the release failed too: that is the case here
    # While the disk is full, the next run fails with the disk's error, never naming itself.
    assert not report["still_full"].startswith("RunInProgressError"), report["still_full"]
    assert "the disk is full" in report["still_full"]
    # Once there is room, it runs at once (not after the lease's ttl), and gives the lease back.
    assert report["freed"] == "ok"
    assert report["lease_after"] is None
    # The run the disk stopped is closed in the log (by itself if the disk allowed, else by the
    # next run), and every run but it completed.
    log = report["log"]
    runs = list(dict.fromkeys(run_id for _, _, run_id in log))
    ends = {run: kind for kind, _, run in log if kind.startswith("Run") and kind != "RunStarted"}
    assert [ends.get(run) for run in runs] == ["RunCompleted", "RunAbandoned", "RunCompleted"]


# -- the same, on every backend, with a store whose release fails ------------------------------


@executor(id="step")
async def step(n: int, ctx: WorkflowContext[int]) -> None:
    ctx.set_state("n", n)


def stepping(store: Any, instance_id: str = "i") -> Any:
    return WorkflowBuilder(start_executor=step, store=store, instance_id=instance_id).build()


async def test_a_lease_that_could_not_be_released_is_taken_back_by_the_next_run(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open_store(store_url) as store:
        wf = stepping(store)
        release = store.release_lease

        def full(instance_id: str, holder: str) -> None:
            raise StoreUnavailableError("database or disk is full; the disk is full")

        monkeypatch.setattr(store, "release_lease", full)
        await wf.run(1)  # the run completes; giving its lease back fails
        assert store.read_lease("i") is not None
        monkeypatch.setattr(store, "release_lease", release)
        await stepping(store).run(2)  # another workflow object on the same store: not refused
        assert store.read_lease("i") is None
        assert store.stranded_leases == {}
        assert stepping(store).committed_state() == {"n": 2}
        assert not any(isinstance(e, RunAbandoned) for e in store.read("i"))


async def test_a_live_run_of_the_same_process_is_still_refused(store_url: str) -> None:
    """Only a stranded lease is taken back: a run of this process that is still going keeps
    its instance, as before."""
    gate, inside = asyncio.Event(), asyncio.Event()

    @executor(id="slow")
    async def slow(n: int, ctx: WorkflowContext[int]) -> None:
        inside.set()
        await gate.wait()
        ctx.set_state("n", n)

    with open_store(store_url) as store:
        first = WorkflowBuilder(start_executor=slow, store=store, instance_id="i").build()
        running = asyncio.create_task(first.run(1))
        await inside.wait()  # the first run holds the lease
        with pytest.raises(RunInProgressError):
            await stepping(store).run(2)
        gate.set()
        await running
