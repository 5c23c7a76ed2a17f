"""Real workflow runs for the UI's tests: the demo's instances, and a chain whose state holds
hostile text and a sensitive key."""

from __future__ import annotations

import contextlib

from pydantic import BaseModel

from kernel import EventStore, Executor, Workflow, WorkflowBuilder, WorkflowContext, handler

HOSTILE = "<script>window.__pwned = 1</script><img src=x onerror=alert(1)>"
HOSTILE_INSTANCE = "hostile"
CHAIN_INSTANCE = "chain"


class Tick(BaseModel):
    n: int
    stop: int
    fail_at: int | None = None


class Writer(Executor):
    """Writes ``count`` = n and a hostile value each superstep; raises at ``fail_at``."""

    @handler
    async def tick(self, tick: Tick, ctx: WorkflowContext[Tick, str]) -> None:
        ctx.set_state("count", tick.n)
        ctx.set_state("api_key", f"sk-{tick.n}")
        ctx.set_state(HOSTILE, HOSTILE)
        if tick.fail_at == tick.n:
            raise RuntimeError(f"failing at {tick.n}: {HOSTILE}")
        if tick.n < tick.stop:
            await ctx.send_message(tick.model_copy(update={"n": tick.n + 1}))
        else:
            await ctx.yield_output(f"done at {tick.n}")


class Relay(Executor):
    """Passes the tick on."""

    @handler
    async def relay(self, tick: Tick, ctx: WorkflowContext[Tick, str]) -> None:
        ctx.set_state("relayed", tick.n)
        await ctx.send_message(tick)


def chain(store: EventStore, instance_id: str) -> Workflow:
    """writer -> relay -> writer ..., one superstep each; ``api_key`` is sensitive."""
    writer, relay = Writer(id="writer"), Relay(id="relay")
    return (
        WorkflowBuilder(
            start_executor=writer,
            store=store,
            instance_id=instance_id,
            name="chain",
            sensitive_keys=["api_key"],
        )
        .add_edge(writer, relay)
        .add_edge(relay, writer)
        .build()
    )


async def write_chain(
    store: EventStore, instance_id: str, *, stop: int, fail_at: int | None = None
) -> None:
    """One run of the chain (a failed run is part of the log too)."""
    with contextlib.suppress(RuntimeError):
        await chain(store, instance_id).run(Tick(n=1, stop=stop, fail_at=fail_at))
