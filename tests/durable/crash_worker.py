"""A worker process that kills itself with SIGKILL at a chosen point of a deterministic workflow,
and the same workflow resumed in a new process. Run by ``test_crash_resume``; also importable, so
the test computes its reference (an uninterrupted run) in-process.

The workflow loops ``ROUNDS`` times through a fan-out, a fan-in whose sources send in different
supersteps, and back, four supersteps a round::

    dispatch --fan-out--> left ---------------\\
            \\-----------> right --> right2 --fan-in--> join --(loop)--> dispatch

so that at most kill points a fan-in buffer (``left``'s message, waiting for ``right2``'s) or
pending messages have to be rebuilt from the log. Every handler reads the committed state, stages
writes derived from it, and yields an output; a write of an aborted superstep that counted would
change every later value.

Usage (from the repository root, with it on ``PYTHONPATH``)::

    python -m tests.durable.crash_worker crash URL INSTANCE DURABILITY POINT SUPERSTEP [EXECUTOR]
    python -m tests.durable.crash_worker resume URL INSTANCE DURABILITY

``crash`` runs the workflow from its start and dies at ``POINT`` of superstep ``SUPERSTEP`` (in
the handler of ``EXECUTOR`` for the handler points; the first handler to get there by default); it
exits with ``EXIT_NOT_REACHED`` if the run ends without reaching the point. ``resume`` continues
the instance's last run (``wf.resume()``) and prints the result and the committed state as one
JSON object. ``crash_child`` and ``resume_child`` are the same two modes as ``multiprocessing``
targets, reporting through a file: the test forks its processes from a server that has imported
this module once, rather than paying for the imports in every process.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernel import (
    EventBase,
    EventStore,
    Executor,
    SuperstepCommitted,
    SuperstepStarted,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    handler,
    open_store,
)
from kernel._run._snapshot import DEFAULT_SNAPSHOT_EVERY

ROUNDS = 3
SUPERSTEPS = 4 * ROUNDS
"""Supersteps of an uninterrupted run."""

EXIT_NOT_REACHED = 3
"""The exit status of a ``crash`` whose kill point was never reached (a broken test, not a pass)."""

HANDLER_POINTS = ("before_staging", "between_writes", "after_staging")
"""Kill points inside a handler: before its first write, between two writes, after its last
write, send and output (just before it returns)."""

STORE_POINTS = ("before_marker_append", "inside_marker_transaction", "after_marker_append")
"""Kill points around the append of the batch that holds the superstep's ``SuperstepCommitted``:
before it is handed to the store, inside the database transaction after its rows are inserted
and before it commits, and right after it committed."""

POINTS = HANDLER_POINTS + STORE_POINTS


# -- the workflow -------------------------------------------------------------------------------


@dataclass
class Tick:
    """Starts a round."""

    round: int


@dataclass
class Part:
    """A branch's contribution to a round."""

    source: str
    round: int
    value: int


Hook = Callable[[str, str, int], None]
"""Called by every handler at each of ``HANDLER_POINTS``: (point, executor id, superstep)."""


def no_hook(point: str, executor_id: str, superstep: int) -> None:
    """The hook of an uninterrupted run: does nothing."""


class Stage(Executor):
    """An executor that calls its workflow's kill hook at the handler points."""

    def __init__(self, id: str, hook: Hook) -> None:
        super().__init__(id)
        self.hook = hook

    def at(self, point: str, ctx: WorkflowContext[Any, Any]) -> None:
        self.hook(point, self.id, ctx.superstep)


class Dispatch(Stage):
    @handler
    async def tick(self, tick: Tick, ctx: WorkflowContext[Part, str]) -> None:
        self.at("before_staging", ctx)
        count = ctx.get_state("dispatched", 0) + 1
        ctx.set_state("dispatched", count)
        self.at("between_writes", ctx)
        ctx.set_state("round", tick.round)
        await ctx.send_message(Part(self.id, tick.round, count * 10 + tick.round))
        await ctx.yield_output(f"dispatch r{tick.round} #{count}")
        self.at("after_staging", ctx)


class Left(Stage):
    @handler
    async def part(self, part: Part, ctx: WorkflowContext[Part, str]) -> None:
        self.at("before_staging", ctx)
        total = ctx.get_state("left_total", 0) + part.value
        ctx.set_state("left_total", total)
        self.at("between_writes", ctx)
        ctx.set_state("left_seen", [*ctx.get_state("left_seen", []), part.round])
        await ctx.send_message(Part(self.id, part.round, total))
        await ctx.yield_output(f"left r{part.round} {total}")
        self.at("after_staging", ctx)


class Right(Stage):
    @handler
    async def part(self, part: Part, ctx: WorkflowContext[Part, str]) -> None:
        self.at("before_staging", ctx)
        total = ctx.get_state("right_total", 0) + 2 * part.value
        ctx.set_state("right_total", total)
        self.at("between_writes", ctx)
        ctx.set_state("scratch", f"r{part.round}")  # deleted by right2 a superstep later
        await ctx.send_message(Part(self.id, part.round, total))
        await ctx.yield_output(f"right r{part.round} {total}")
        self.at("after_staging", ctx)


class Right2(Stage):
    @handler
    async def part(self, part: Part, ctx: WorkflowContext[Part, str]) -> None:
        self.at("before_staging", ctx)
        scratch = ctx.get_state("scratch", "none")
        ctx.delete_state("scratch")
        self.at("between_writes", ctx)
        hops = ctx.get_state("right2_hops", 0) + 1
        ctx.set_state("right2_hops", hops)
        await ctx.send_message(Part(self.id, part.round, part.value + hops))
        await ctx.yield_output(f"right2 r{part.round} {scratch} {hops}")
        self.at("after_staging", ctx)


class Join(Stage):
    @handler
    async def parts(self, parts: list[Part], ctx: WorkflowContext[Tick, str]) -> None:
        self.at("before_staging", ctx)
        rnd = parts[0].round
        total = ctx.get_state("total", 0) + sum(p.value for p in parts)
        ctx.set_state("total", total)
        self.at("between_writes", ctx)
        history = [*ctx.get_state("history", []), [p.source for p in parts], total]
        ctx.set_state("history", history)
        await ctx.yield_output(f"join r{rnd} {total}")
        if rnd < ROUNDS:
            await ctx.send_message(Tick(rnd + 1))
        self.at("after_staging", ctx)


def crashy(store: EventStore, instance_id: str, durability: Any, hook: Hook = no_hook) -> Workflow:
    """The workflow on ``store``'s instance ``instance_id``, calling ``hook`` at handler points.

    ``durability`` may end in ``+snapshots``: the run then keeps a snapshot of the instance at
    every committed superstep, so that every kill point has one and the resume starts from it."""
    durability, _, variant = str(durability).partition("+")
    every = 1 if variant == "snapshots" else DEFAULT_SNAPSHOT_EVERY
    dispatch, left, right = Dispatch("dispatch", hook), Left("left", hook), Right("right", hook)
    right2, join = Right2("right2", hook), Join("join", hook)
    return (
        WorkflowBuilder(
            start_executor=dispatch,
            store=store,
            instance_id=instance_id,
            name="crashy",
            durability=durability,
        )
        .add_fan_out_edges(dispatch, [left, right])
        .add_edge(right, right2)
        .add_fan_in_edges([left, right2], join)
        .add_edge(join, dispatch)
        .with_snapshots(every=every)
        .build()
    )


async def uninterrupted(store: EventStore, instance_id: str, durability: Any) -> dict[str, Any]:
    """The report of an uninterrupted run, in the shape ``resume`` prints."""
    wf = crashy(store, instance_id, durability)
    result = await wf.run(Tick(1))
    return report(wf, result)


def report(wf: Workflow, result: Any) -> dict[str, Any]:
    """What a run came to: status, supersteps, outputs, committed state (JSON-ready)."""
    return {
        "status": result.status,
        "supersteps": result.supersteps,
        "outputs": result.get_outputs(),
        "state": wf.committed_state(),
    }


# -- dying on purpose ---------------------------------------------------------------------------


def die() -> None:
    """SIGKILL this process: no handler, no finally, no flush runs."""
    os.kill(os.getpid(), signal.SIGKILL)


def handler_hook(point: str, superstep: int, executor_id: str | None) -> Hook:
    """A hook that kills the process at ``point`` of superstep ``superstep``, in the handler of
    ``executor_id`` (any handler if None)."""

    def hook(at: str, executor: str, index: int) -> None:
        if at == point and index == superstep and executor_id in (None, executor):
            die()

    return hook


class MarkerTrap:
    """Kills the process around the append of the batch holding superstep ``superstep``'s
    ``SuperstepCommitted`` marker, at one of ``STORE_POINTS``.

    It wraps this process's ``store.append``, and the group commit's ``store.prepare`` and
    ``store.append_prepared`` (and, for ``inside_marker_transaction``, the insert inside the
    transaction), nothing else. On SQLite the store's code runs unchanged up to the kill; on
    PostgreSQL, whose append is one autocommitted call, ``inside_marker_transaction`` runs the
    same append function inside an explicit transaction that never commits.
    """

    def __init__(self, store: EventStore, point: str, superstep: int) -> None:
        self.point = point
        self.superstep = superstep
        self.indices: dict[str, int] = {}  # superstep id -> index, from appended SuperstepStarted
        self.armed = False  # the batch being appended is the marked one
        self._append = store.append
        store.append = self.append  # type: ignore[method-assign]
        self._prepare = store.prepare
        store.prepare = self.prepare  # type: ignore[method-assign]
        self._append_prepared = store.append_prepared
        store.append_prepared = self.append_prepared  # type: ignore[method-assign]
        self.prepared_marked: set[int] = set()  # id() of the prepared batches holding the marker
        if point == "inside_marker_transaction":
            self._wrap_insert(store)

    def _marked(self, events: Sequence[EventBase]) -> bool:
        for event in events:
            if isinstance(event, SuperstepStarted):
                self.indices[event.superstep_id] = event.index
        return any(
            isinstance(e, SuperstepCommitted) and self.indices.get(e.superstep_id) == self.superstep
            for e in events
        )

    def append(
        self, instance_id: str, events: Sequence[EventBase], *, expected_version: int
    ) -> list[int]:
        marked = self._marked(events)
        if marked and self.point == "before_marker_append":
            die()
        self.armed = marked
        ids = self._append(instance_id, events, expected_version=expected_version)
        if marked and self.point == "after_marker_append":
            die()
        self.armed = False
        return ids

    def prepare(
        self, instance_id: str, events: Sequence[EventBase], *, expected_version: int
    ) -> Any:
        prepared = self._prepare(instance_id, events, expected_version=expected_version)
        if self._marked(events):
            if self.point == "before_marker_append":
                die()
            self.prepared_marked.add(id(prepared))
        return prepared

    def append_prepared(self, batches: Sequence[Any]) -> Any:
        marked = any(id(batch) in self.prepared_marked for batch in batches)
        self.armed = marked
        outcomes = self._append_prepared(batches)
        if marked and self.point == "after_marker_append":
            die()
        self.armed = False
        return outcomes

    def _wrap_insert(self, store: EventStore) -> None:
        if store.url.startswith("sqlite"):
            # SQLite: the store opens the transaction and inserts the batch's row with
            # _insert_checked inside it; die after the row is written, before COMMIT.
            insert = store.backend._insert_checked  # type: ignore[attr-defined]

            def insert_then_die(cursor: Any, *args: Any) -> Any:
                row_id = insert(cursor, *args)
                if self.armed:
                    die()
                return row_id

            store.backend._insert_checked = insert_then_die  # type: ignore[attr-defined]
            return
        # PostgreSQL: an append is one CALL of a procedure that commits; here the same write
        # function runs inside an explicit transaction that never commits.
        from psycopg import sql

        from kernel._store._postgres import WRITE_FUNCTION, append_columns

        insert_rows = store.backend.insert_rows
        write = sql.SQL("SELECT {}(%s, %s, %s, %s, %s, %s) AS written").format(
            sql.Identifier(store.schema, WRITE_FUNCTION)  # type: ignore[attr-defined]
        )

        def insert_in_transaction(rows: Any) -> Any:
            if not self.armed:
                return insert_rows(rows)
            columns = append_columns(rows)
            with store.datastore.get_connection() as conn, conn.transaction():  # type: ignore[attr-defined]
                written = conn.execute(write, columns).fetchone()["written"]
                if any(row_id is None for row_id in written):
                    raise AssertionError(f"the write function refused a row: {written}")
                die()
            raise AssertionError("unreachable: the process is dead")

        store.backend.insert_rows = insert_in_transaction  # type: ignore[method-assign]


# -- the two modes ------------------------------------------------------------------------------


async def crash(
    url: str,
    instance_id: str,
    durability: str,
    point: str,
    superstep: int,
    executor_id: str | None = None,
) -> int:
    """Run the workflow from its start and die at ``point`` of ``superstep``; return
    ``EXIT_NOT_REACHED`` if the run ended without getting there."""
    if point not in POINTS:
        raise SystemExit(f"unknown kill point {point!r}; one of {', '.join(POINTS)}")
    store = open_store(url)
    hook: Hook = no_hook
    if point in HANDLER_POINTS:
        hook = handler_hook(point, superstep, executor_id)
    else:
        MarkerTrap(store, point, superstep)
    wf = crashy(store, instance_id, durability, hook)
    await wf.run(Tick(1))
    print(f"kill point {point} of superstep {superstep} never reached", file=sys.stderr)
    return EXIT_NOT_REACHED


async def resume(url: str, instance_id: str, durability: str) -> dict[str, Any]:
    """Continue the instance's last run in this (new) process; its result and committed state."""
    store = open_store(url, create=False)
    try:
        wf = crashy(store, instance_id, durability)
        result = await wf.resume()
        return report(wf, result)
    finally:
        store.close()


def crash_child(result: str, *args: Any) -> None:
    """``crash`` as a ``multiprocessing`` target: what it says if it does not die goes to the file
    ``result``, and the process exits with ``EXIT_NOT_REACHED``."""
    try:
        status = asyncio.run(crash(*args))
    except BaseException:
        Path(result).write_text(traceback.format_exc())
        raise
    Path(result).write_text("the kill point was never reached")
    sys.exit(status)


def resume_child(result: str, url: str, instance_id: str, durability: str) -> None:
    """``resume`` as a ``multiprocessing`` target: the report (or the traceback) goes to the file
    ``result`` as JSON."""
    try:
        outcome: dict[str, Any] = asyncio.run(resume(url, instance_id, durability))
    except BaseException:
        outcome = {"error": traceback.format_exc()}
    Path(result).write_text(json.dumps(outcome))


def main(argv: Sequence[str]) -> int:
    mode, *args = argv
    if mode == "crash":
        url, instance_id, durability, point, superstep, *executor = args
        chosen = executor[0] if executor else None
        return asyncio.run(crash(url, instance_id, durability, point, int(superstep), chosen))
    if mode == "resume":
        url, instance_id, durability = args
        print(json.dumps(asyncio.run(resume(url, instance_id, durability))))
        return 0
    raise SystemExit(f"unknown mode {mode!r}: crash or resume")


if __name__ == "__main__":
    # Run from the module under its importable name, so that the log names its classes
    # (``tests.durable.crash_worker.Part``) as the test process and the forked processes do.
    from tests.durable import crash_worker

    sys.exit(crash_worker.main(sys.argv[1:]))
