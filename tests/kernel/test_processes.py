"""A process killed mid-superstep: its attempted writes stay in the log, inert, and the next run
(in another process) closes the run as crashed before appending anything of its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from kernel import WorkflowBuilder, WorkflowContext, executor, open_store
from tests.kernel.helpers import fate_of, kinds, of_type

WORKER = Path(__file__).with_name("crashing_worker.py")
ROOT = Path(__file__).resolve().parents[2]


@executor(id="healthy")
async def healthy(n: int, ctx: WorkflowContext[Any]) -> None:
    ctx.set_state("healthy", n)


def start_worker(url: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    worker = subprocess.Popen(
        [sys.executable, str(WORKER), url], stdout=subprocess.PIPE, text=True, env=env
    )
    assert worker.stdout is not None
    line = worker.stdout.readline()
    assert line.strip() == "READY", f"worker said {line!r}"
    return worker


async def test_a_process_killed_mid_superstep_leaves_inert_writes_closed_as_crashed(
    durable_store_url,
):
    worker = start_worker(durable_store_url)
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=30)

    store = open_store(durable_store_url)
    try:
        wf = WorkflowBuilder(start_executor=healthy, store=store, instance_id="crashy").build()
        assert wf.committed_state() == {}
        (attempt,) = [e for e in of_type(wf.events(), "state_staged") if e.key == "attempted"]
        assert attempt.value == 1

        await wf.run(2)

        assert fate_of(wf, "attempted") == ["aborted:crashed"]
        closed = of_type(wf.events(), "run_abandoned")[0]
        assert closed.reason == "crashed"
        order = kinds(wf.events())
        assert order.index("run_abandoned") < order.index("run_started", 1)
        assert wf.committed_state() == {"healthy": 2}
    finally:
        store.close()
