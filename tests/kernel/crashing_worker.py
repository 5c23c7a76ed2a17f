"""Run by test_processes: stage a write in "write" durability, say READY, then hang until killed."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from kernel import WorkflowBuilder, WorkflowContext, executor, open_store


@executor(id="doomed")
async def doomed(n: int, ctx: WorkflowContext[Any]) -> None:
    ctx.set_state("attempted", n)
    print("READY", flush=True)
    await asyncio.Event().wait()


async def main(url: str) -> None:
    store = open_store(url)
    wf = WorkflowBuilder(
        start_executor=doomed, store=store, instance_id="crashy", durability="write"
    ).build()
    await wf.run(1)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
