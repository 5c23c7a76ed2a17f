"""Fills the disk under a SQLite store in the middle of a run, for ``test_disk_full``.

Usage: ``python -m tests.durable.disk_full_worker DIRECTORY`` (a small file system of its own:
the test mounts a tmpfs there). One run commits; the next fills the disk from its handler, so
that its commit (and its end, and the release of its lease) fail with ``SQLITE_FULL``; a third
run is tried while the disk is still full, and a fourth once the filler file is gone. Prints one
JSON document: each run's outcome, the lease left behind, and the log's event types and reasons.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from kernel import Executor, StepLogError, WorkflowBuilder, WorkflowContext, handler, open_store


class Filler(Executor):
    """Commits a value; on message 2, first fills the disk the store is on."""

    def __init__(self, id: str, directory: Path) -> None:
        super().__init__(id)
        self.directory = directory

    @handler
    async def run(self, n: int, ctx: WorkflowContext[int, int]) -> None:
        if n == 2:
            with (self.directory / "filler").open("wb", buffering=0) as filler:
                try:
                    while True:
                        filler.write(b"\0" * 4096)
                except OSError:
                    pass  # the disk is full
        ctx.set_state("value", os.urandom(8_000).hex())


async def outcome(run: object) -> str:
    try:
        await run  # type: ignore[misc]
    except StepLogError as error:
        return f"{type(error).__name__}: {error}"
    return "ok"


async def main(directory: Path) -> None:
    store = open_store(f"sqlite:///{directory}/steplog.db")
    wf = WorkflowBuilder(
        start_executor=Filler("w", directory), store=store, instance_id="i"
    ).build()
    report: dict[str, object] = {"first": await outcome(wf.run(1))}
    report["full"] = await outcome(wf.run(2))
    lease = store.read_lease("i")
    report["lease_left"] = None if lease is None else lease.holder
    report["still_full"] = await outcome(wf.run(3))
    (directory / "filler").unlink()
    report["freed"] = await outcome(wf.run(3))
    lease = store.read_lease("i")
    report["lease_after"] = None if lease is None else lease.holder
    report["log"] = [
        [type(e).__name__, getattr(e, "reason", None), e.run_id] for e in store.read("i")
    ]
    store.close()
    print(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
