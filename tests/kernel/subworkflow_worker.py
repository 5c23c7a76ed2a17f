"""Run by test_subworkflow_crash: a parent whose sub-workflow stages a write in "write"
durability, says READY, then hangs until the process is killed."""

from __future__ import annotations

import asyncio
import sys
from typing import Never

from kernel import Executor, WorkflowBuilder, WorkflowContext, WorkflowExecutor, handler, open_store
from tests.kernel.test_subworkflows import Sink, Starter


class Hanger(Executor):
    """The sub-workflow's executor: it never returns in the worker, and returns in the test."""

    def __init__(self, hang: bool) -> None:
        super().__init__(id="hanger")
        self.hang = hang

    @handler
    async def work(self, text: str, ctx: WorkflowContext[Never, str]) -> None:
        ctx.set_state("attempt", text)
        if self.hang:
            print("READY", flush=True)
            await asyncio.Event().wait()
        await ctx.yield_output(text.upper())


def parent(url: str, *, hang: bool):  # type: ignore[no-untyped-def]
    store = open_store(url)
    inner = WorkflowBuilder(start_executor=Hanger(hang)).build()
    starter, sub, sink = Starter(), WorkflowExecutor(inner, id="sub"), Sink()
    return (
        WorkflowBuilder(
            start_executor=starter, store=store, instance_id="crashy", durability="write"
        )
        .add_edge(starter, sub)
        .add_edge(sub, sink)
        .build()
    )


async def main(url: str) -> None:
    await parent(url, hang=True).run("fine")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
