"""A process that runs the trip agent's turn and kills itself with SIGKILL, and the processes that
resume it and take the next turn. Run by ``test_agent_executor``'s process tests.

Usage (from the repository root, with it on ``PYTHONPATH``)::

    python -m tests.agents.agent_worker crash-after URL INSTANCE COUNTS
    python -m tests.agents.agent_worker crash-inside URL INSTANCE COUNTS
    python -m tests.agents.agent_worker resume URL INSTANCE COUNTS
    python -m tests.agents.agent_worker turn URL INSTANCE COUNTS TEXT

``crash-after`` runs the turn ``TURN`` and dies once ``hold_seat`` (tool 2 of 3) is recorded in
the log; ``crash-inside`` dies inside ``hold_seat``, after it counted its call and before it
returns. Either exits with ``EXIT_NOT_REACHED`` if it did not die. ``resume`` continues the
instance's last run (``wf.resume()``); ``turn`` runs a new turn on ``TEXT``. Both print the output
text as JSON. Calls are counted in files under the directory ``COUNTS`` (see ``fakes.Counts``).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

from kernel import RunHooks, StepInfo, SuperstepInfo, Workflow, WorkflowBuilder, open_store
from kernel.agents import AgentExecutor
from tests.agents.fakes import Counts, trip_agent

TURN = "Book me a seat to Lisbon and tell Ana."
EXIT_NOT_REACHED = 3


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class DieAfterHold(RunHooks):
    """Dies as soon as ``hold_seat``'s call is durable in the log."""

    def step_finished(self, step: SuperstepInfo, call: StepInfo) -> None:
        if call.name == "hold_seat" and not call.reused:
            die()


def workflow(url: str, instance: str, counts: Counts, mode: str) -> Workflow:
    async def on_hold() -> None:
        if mode == "crash-inside":
            die()

    builder = WorkflowBuilder(
        start_executor=AgentExecutor(trip_agent(counts, on_hold)),
        store=open_store(url),
        instance_id=instance,
    )
    if mode == "crash-after":
        builder.with_hooks(DieAfterHold())
    return builder.build()


async def main(mode: str, url: str, instance: str, counts_dir: str, *text: str) -> int:
    wf = workflow(url, instance, Counts(Path(counts_dir)), mode)
    if mode in ("crash-after", "crash-inside"):
        await wf.run(TURN)
        return EXIT_NOT_REACHED
    result = await (wf.resume() if mode == "resume" else wf.run(text[0]))
    print(json.dumps([output.text for output in result.get_outputs()]))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(*sys.argv[1:])))
