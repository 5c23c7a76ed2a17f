"""Run by test_recover: start a run on a store, stage a write mid-superstep ("write" durability),
then either SIGKILL itself (``die``) or say READY and block there, alive (``hang``)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

from kernel import WorkflowBuilder, WorkflowContext, executor, open_store

MODE = sys.argv[3] if len(sys.argv) > 3 else "die"


@executor(id="worker")
async def worker(n: int, ctx: WorkflowContext[Any]) -> None:
    ctx.set_state("attempted", n)
    if MODE == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    print("READY", flush=True)
    await asyncio.Event().wait()


async def main(url: str, instance_id: str) -> None:
    store = open_store(url)
    wf = WorkflowBuilder(
        start_executor=worker, store=store, instance_id=instance_id, durability="write"
    ).build()
    await wf.run(1)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
