"""Run by test_functional: a functional workflow in a process of its own.

``python functional_worker.py URL COUNTS MODE``: ``pause`` runs ``checkout`` until it waits for
its approval, then exits; ``crash`` also answers the approval, and hangs inside ``charge`` after
saying READY, until it is killed. Every step call appends its name to the file ``COUNTS``, so
that the test counts the executions of each step across processes.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from kernel import RunContext, open_store, step, workflow

COUNTS: Path | None = None
HANG_IN_CHARGE = False


def _count(name: str) -> None:
    if COUNTS is not None:
        with COUNTS.open("a") as counts:
            counts.write(f"{name}\n")


@step
async def fetch(order: str) -> str:
    _count("fetch")
    return f"fetched {order}"


@step
async def reserve(order: str) -> str:
    _count("reserve")
    return f"reserved {order}"


@step
async def charge(order: str) -> str:
    _count("charge")
    if HANG_IN_CHARGE:
        print("READY", flush=True)
        await asyncio.Event().wait()
    return f"charged {order}"


@workflow
async def checkout(order: str, ctx: RunContext) -> str:
    fetched = await fetch(order)
    ctx.set_state("fetched", fetched)
    approval = await ctx.request_info({"approve": order}, response_type=str)
    reserved = await reserve(order)
    charged = await charge(order)
    return f"{fetched}, {approval}, {reserved}, {charged}"


def executions(counts: Path) -> dict[str, int]:
    """How many times each step ran, from ``counts``."""
    found: dict[str, int] = {}
    if counts.exists():
        for name in counts.read_text().split():
            found[name] = found.get(name, 0) + 1
    return found


async def main(url: str, counts: str, mode: str) -> None:
    global COUNTS, HANG_IN_CHARGE
    COUNTS = Path(counts)
    store = open_store(url)
    wf = checkout.build(store=store, instance_id="checkout")
    paused = await wf.run("o-1")
    assert [r.request_id for r in paused.get_request_info_events()] == ["auto::0"]
    if mode == "pause":
        print("READY", flush=True)
        return
    HANG_IN_CHARGE = True
    await wf.run(responses={"auto::0": "approved"})


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
