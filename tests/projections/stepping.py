"""A workflow whose handler calls recorded steps (``@step``), run so that its log holds every kind
of step record: the logs the step tests of the projections, the CLI (its docs too) and the UI
read.

``write_mail`` runs the ``agent`` executor on one message, twice:

* run 1: ``call_model`` returns (recorded, with token counts), ``check_spam`` raises (recorded
  with its error; the handler goes on), ``send_email`` is cancelled while it waits: the run is
  cancelled, its superstep aborted (``cancelled``), and nothing was staged as state;
* run 2 (``resume()``): ``call_model`` is served from run 1's record (``reused``), ``check_spam``
  raises again (an error is never served), ``send_email`` runs; the superstep commits ``sent``.

With ``hostile=True`` the handler also calls a step named ``HOSTILE`` whose result is
``HOSTILE`` too (and the prompt should hold it as well): escaping tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import Any

from kernel import (
    EventStore,
    Executor,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    handler,
    report_usage,
    step,
)
from tests.ui.workflows import HOSTILE

__all__ = ["HOSTILE", "MAIL", "Outbox", "SpamCheckDown", "mail", "write_mail"]

MAIL = "mail"
"""The default instance."""


@dataclass
class Outbox:
    """What ``send_email`` does: tells ``started`` it began, waits for ``gate``, appends to
    ``sent``."""

    started: asyncio.Event = field(default_factory=asyncio.Event)
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    sent: list[str] = field(default_factory=list)


_OUTBOX: contextvars.ContextVar[Outbox] = contextvars.ContextVar("outbox")


class SpamCheckDown(Exception):
    """What ``check_spam`` raises: the checker cannot be reached."""


@step
async def call_model(prompt: str) -> dict[str, str]:
    """A scripted model: the prompt and its answer, with token counts."""
    report_usage(input_tokens=len(prompt.split()), output_tokens=6)
    return {"prompt": prompt, "response": f"Dear Ann,\nthank you. ({prompt})"}


@step
async def check_spam(text: str) -> bool:
    raise SpamCheckDown("the spam checker is down")


@step
async def send_email(to: str, body: str) -> str:
    outbox = _OUTBOX.get()
    outbox.started.set()
    await outbox.gate.wait()
    outbox.sent.append(to)
    return f"sent to {to}"


@step(name=HOSTILE)
async def hostile_tool() -> str:
    return HOSTILE


class Agent(Executor):
    """Drafts with the model, checks for spam (ignoring a checker that is down), sends the
    mail: three recorded steps, then ``sent`` is staged and yielded."""

    @handler
    async def write(self, prompt: str, ctx: WorkflowContext[str, str]) -> None:
        draft = await call_model(prompt)
        if HOSTILE in prompt:
            await hostile_tool()
        with contextlib.suppress(SpamCheckDown):
            await check_spam(draft["response"])
        sent = await send_email("ann@example.com", draft["response"])
        ctx.set_state("sent", sent)
        await ctx.yield_output(sent)


def mail(store: EventStore, instance_id: str = MAIL, **options: Any) -> Workflow:
    """The ``agent`` alone on ``store``'s instance; ``options`` (a clock, ids, sensitive keys)
    go to the ``WorkflowBuilder``."""
    return WorkflowBuilder(
        start_executor=Agent(id="agent"), store=store, instance_id=instance_id, **options
    ).build()


async def write_mail(
    store: EventStore,
    instance_id: str = MAIL,
    *,
    prompt: str = "write to Ann",
    **options: Any,
) -> tuple[str, str]:
    """Run 1 cancelled in ``send_email``, then run 2 resuming it (see the module docstring);
    returns the two run ids."""
    outbox = Outbox()
    token = _OUTBOX.set(outbox)
    try:
        workflow = mail(store, instance_id, **options)
        running = asyncio.ensure_future(workflow.run(prompt))
        await outbox.started.wait()
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        outbox.gate.set()
        result = await workflow.resume()
    finally:
        _OUTBOX.reset(token)
    assert outbox.sent == ["ann@example.com"]  # sent once, by run 2
    assert result.get_outputs() == ["sent to ann@example.com"]
    runs = [e.run_id for e in store.read(instance_id, types=("run_started",))]
    return runs[-2], runs[-1]
