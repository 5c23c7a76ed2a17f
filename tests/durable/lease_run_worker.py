"""Runs one workflow run from its own process, for ``test_leases_runs``.

Usage: ``python -m tests.durable.lease_run_worker URL INSTANCE``. Prints ``ready`` once built,
waits for a line on stdin (so that all workers start together), then runs a three-superstep
workflow whose first superstep waits for the file ``$STEPLOG_TEST_GATE`` to exist, and prints one
JSON line (``won``, ``run_id``, ``error``).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from kernel import RunInProgressError, WorkflowBuilder, WorkflowContext, executor, open_store

GATE = Path(os.environ.get("STEPLOG_TEST_GATE", "/nonexistent"))


@executor(id="slow")
async def slow(n: int, ctx: WorkflowContext[int]) -> None:
    ctx.set_state(f"step-{n}", n)
    # Held open until every other worker has given up: the gate is a file the test creates.
    while n == 1 and not GATE.exists():  # noqa: ASYNC110, ASYNC240 - polled across processes
        await asyncio.sleep(0.02)
    if n < 3:
        await ctx.send_message(n + 1)


async def main(url: str, instance_id: str) -> None:
    store = open_store(url)
    wf = (
        WorkflowBuilder(start_executor=slow, store=store, instance_id=instance_id)
        .add_edge(slow, slow)
        .build()
    )
    print("ready", flush=True)
    sys.stdin.readline()
    try:
        result = await wf.run(1)
    except RunInProgressError as error:
        print(json.dumps({"won": False, "run_id": None, "error": str(error)}), flush=True)
        return
    print(json.dumps({"won": True, "run_id": result.run_id, "error": None}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
