"""The demo: the original stale-write bug scenario, run on steplog, shown from the log."""

from __future__ import annotations

import itertools
from typing import Any

from pydantic import BaseModel

from kernel import EventStore, Executor, Workflow, WorkflowBuilder, WorkflowContext, handler

__all__ = ["Checkout", "DemoOutcome", "Order", "demo_instances", "free_demo_instance", "run_demo"]


class Order(BaseModel):
    """The demo's message: an order, and whether the payment provider will fail."""

    id: str
    payment_fails: bool = False


class Checkout(Executor):
    """Stages a payment token, then charges; the first attempt fails after staging the token."""

    @handler
    async def charge(self, order: Order, ctx: WorkflowContext[Order, str]) -> None:
        if order.payment_fails:
            ctx.set_state("secret", f"card-token-for-{order.id}")
            raise ConnectionError("payment provider timed out")
        ctx.set_state("charged", [*ctx.get_state("charged", []), order.id])
        await ctx.yield_output(f"charged {order.id}")


def demo_instances(instance_id: str) -> tuple[str, str, str]:
    """The instances a demo on ``instance_id`` writes: its own, the second act's, and its fork."""
    recovery = f"{instance_id}-recovery"
    return instance_id, recovery, f"{recovery}-fork"


def free_demo_instance(store: EventStore, asked: str) -> str:
    """``asked`` if none of the demo's instances on it has an event, else the first of
    ``asked-2``, ``asked-3``, ... whose instances are all empty.

    The demo never appends to an instance that has events: one written by an earlier demo (of this
    steplog or an older one, with other content) is left as it was, and nothing of the demo is
    appended before it knows that every instance it will write is free.
    """
    for instance_id in itertools.chain([asked], (f"{asked}-{n}" for n in itertools.count(2))):
        if not any(store.version(name) for name in demo_instances(instance_id)):
            return instance_id
    raise AssertionError("unreachable: itertools.count never ends")  # pragma: no cover


class DemoOutcome(BaseModel):
    instance_id: str
    first_error: str
    second_outputs: list[Any]
    committed_state: dict[str, Any]
    leaked: bool


async def run_demo(store: EventStore, instance_id: str) -> tuple[Workflow, DemoOutcome]:
    """Run the scenario of Agent Framework issue #7859 and report what the log says."""
    wf = WorkflowBuilder(
        start_executor=Checkout(id="checkout"),
        store=store,
        instance_id=instance_id,
        name="checkout",
    ).build()
    try:
        await wf.run(Order(id="A-1", payment_fails=True))
    except ConnectionError as error:
        first_error = f"{type(error).__name__}: {error}"
    else:  # pragma: no cover - the scenario always fails first
        raise AssertionError("the first run was meant to fail")
    second = await wf.run(Order(id="A-1"))
    state = wf.committed_state()
    outcome = DemoOutcome(
        instance_id=instance_id,
        first_error=first_error,
        second_outputs=second.get_outputs(),
        committed_state=state,
        leaked="secret" in state,
    )
    return wf, outcome
