"""One writer process of ``bench.load``: runs fresh workflow instances on one store for a while.

Usage: ``python -m bench._load_worker URL TAG SECONDS SEED REPORT``. Until SECONDS have passed it
runs instances ``TAG-1``, ``TAG-2``, ... two at a time (``asyncio.gather``, so their commits share
the group committer). Each instance is a two-executor loop of ``n`` supersteps (``n`` drawn from
SEED) that writes ``count`` and ``k0``..``k2``; one in four is planned to fail in a superstep
after staging ``doomed``, which must never be committed.

It writes one JSON object to the file REPORT (written whole, then renamed into place, so the
parent reads all of it or nothing; never to a pipe, whose buffer a long run's report overflows):
``{"instances": {id: report}, "elapsed": s, "error": null}``, where each report holds what this
process knows without reading the views: the stream's version after the run (only this process
writes the instance), the supersteps committed and aborted, and the committed state its own
model expects. The worker checks ``committed_state()`` against that model
itself; a mismatch or an unplanned error is ``"error"`` (exit status 1).

The worker is bounded: if it has not finished ``HANG_GRACE`` seconds after SECONDS, faulthandler
prints every thread's stack to stderr and the process exits (status 1), which the parent reports.

No ``from __future__ import annotations``: the handler's annotations are real types.
"""

import asyncio
import faulthandler
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

from kernel import EventStore, Executor, WorkflowBuilder, WorkflowContext, handler, open_store

PLANNED = "planned failure"
HANG_GRACE = 60.0
"""Seconds past its SECONDS after which a worker that has not finished is taken to hang."""


class Step(Executor):
    """Handles message ``m``: at ``fail_at`` stages ``doomed`` and raises; at ``n`` yields ``n``;
    otherwise writes ``count`` and ``k{m % 3}`` and sends ``m + 1``."""

    def __init__(self, id: str, n: int, fail_at: int | None) -> None:
        super().__init__(id=id)
        self.n = n
        self.fail_at = fail_at

    @handler
    async def step(self, message: int, ctx: WorkflowContext[int, int]) -> None:
        if message == self.fail_at:
            ctx.set_state("doomed", message)
            raise RuntimeError(f"{PLANNED} at {message}")
        if message >= self.n:
            await ctx.yield_output(message)
            return
        ctx.set_state("count", message)
        ctx.set_state(f"k{message % 3}", message)
        await ctx.send_message(message + 1)


def expected(n: int, fail_at: int | None) -> dict[str, Any]:
    """What the instance must report: supersteps committed and aborted, and committed state."""
    last = n if fail_at is None else fail_at  # the message whose superstep ends the run
    state: dict[str, int] = {}
    for message in range(min(last, n)):
        state["count"] = message
        state[f"k{message % 3}"] = message
    committed = n + 1 if fail_at is None else fail_at
    return {"committed": committed, "aborted": 0 if fail_at is None else 1, "state": state}


async def run_one(
    store: EventStore, instance_id: str, n: int, fail_at: int | None
) -> dict[str, Any]:
    a, b = Step("a", n, fail_at), Step("b", n, fail_at)
    workflow = (
        WorkflowBuilder(
            start_executor=a, store=store, instance_id=instance_id, max_supersteps=n + 5
        )
        .add_edge(a, b)
        .add_edge(b, a)
        .build()
    )
    try:
        await workflow.run(0)
    except RuntimeError as error:
        if fail_at is None or PLANNED not in str(error):
            raise
    want = expected(n, fail_at)
    got = workflow.committed_state()
    if got != want["state"]:
        raise AssertionError(f"{instance_id}: committed state {got}, expected {want['state']}")
    return {**want, "version": store.version(instance_id)}


async def work(url: str, tag: str, seconds: float, seed: int) -> dict[str, Any]:
    draw = random.Random(seed)
    instances: dict[str, Any] = {}
    started = time.monotonic()
    with open_store(url) as store:
        number = 0
        while time.monotonic() - started < seconds:
            plans = []
            for _ in range(2):
                number += 1
                n = draw.randint(2, 12)
                fail_at = draw.randint(1, n) if draw.random() < 0.25 else None
                plans.append((f"{tag}-{number}", n, fail_at))
            done = await asyncio.gather(*(run_one(store, *plan) for plan in plans))
            instances.update({plan[0]: report for plan, report in zip(plans, done, strict=True)})
    return {"instances": instances, "elapsed": time.monotonic() - started}


def _write(path: Path, result: dict[str, Any]) -> None:
    scratch = path.with_name(path.name + ".part")
    scratch.write_text(json.dumps(result))
    os.replace(scratch, path)


def main(argv: list[str]) -> int:
    url, tag, seconds, seed = argv[0], argv[1], float(argv[2]), int(argv[3])
    out = Path(argv[4])
    faulthandler.dump_traceback_later(seconds + HANG_GRACE, exit=True)
    try:
        report = asyncio.run(work(url, tag, seconds, seed))
    except Exception as error:  # reported to the parent, which counts it as an error
        _write(out, {"error": f"{type(error).__name__}: {error}"})
        return 1
    _write(out, {**report, "error": None})
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
