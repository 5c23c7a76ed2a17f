"""Writes ``format1.db``: a SQLite log in steplog's first storage format (one row per event, topic
``type@version``, JSON payloads with named fields and ISO timestamps), and ``format1.json``, the
events it holds as ``model_dump(mode="json")``.

It was run once with steplog at commit f4eb7de, before the compact format: the files are committed
test data, and ``tests/store/test_format1.py`` checks that today's steplog reads them exactly.
Running it again with a later steplog would write that steplog's format, so it is kept only as the
record of how the data was made: ``python tests/data/make_format1_log.py`` at f4eb7de.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sys
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import orjson

from kernel import (
    Executor,
    WorkflowBuilder,
    WorkflowContext,
    handler,
    open_store,
    response_handler,
)

HERE = Path(__file__).parent


class Clock:
    """Ticks a millisecond and a bit per reading, from a fixed time (one in a +02:00 zone)."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        self.now += timedelta(microseconds=1013)
        return self.now


class Counter(Executor):
    def __init__(self, id: str, limit: int, fail_at: int | None = None) -> None:
        super().__init__(id)
        self.limit, self.fail_at = limit, fail_at

    @handler
    async def tick(self, n: int, ctx: WorkflowContext[int, int]) -> None:
        ctx.set_state("count", n)
        ctx.set_state("note", {"n": n, "text": "grüße ✓", "list": [1, 2.5, None, True]})
        if n == 2:
            ctx.delete_state("note")
        if n == self.fail_at:
            raise RuntimeError(f"boom at {n}")
        await ctx.yield_output(n)
        if n < self.limit:
            await ctx.send_message(n + 1)


class Asker(Executor):
    @handler
    async def ask(self, text: str, ctx: WorkflowContext[str, str]) -> None:
        ctx.set_state("draft", text)
        await ctx.request_info({"draft": text}, str)

    @response_handler
    async def answered(self, request: dict, answer: str, ctx: WorkflowContext[str, str]) -> None:
        ctx.set_state("answer", answer)
        await ctx.yield_output(answer)


async def main(path: Path) -> None:
    store = open_store(f"sqlite:///{path}")
    ids = itertools.count(1)

    def build(start: Executor, instance: str, clock: Clock, **options: object):
        builder = WorkflowBuilder(
            start,
            store=store,
            instance_id=instance,
            clock=clock,
            id_factory=lambda: f"id{next(ids):04d}",
            **options,
        )
        if isinstance(start, Counter):
            builder.add_edge(start, start)
        return builder.build()

    utc = Clock(datetime(2026, 11, 30, 12, 0, tzinfo=UTC))
    counting = build(Counter("counter", 4), "counting", utc)
    await counting.run(1)
    failing = build(Counter("counter", 4, fail_at=3), "counting", utc)
    with contextlib.suppress(RuntimeError):
        await failing.run(1)
    writes = build(Counter("counter", 2), "per-write", utc, durability="write")
    await writes.run(1)
    zoned = Clock(datetime(2026, 11, 30, 14, 0, tzinfo=timezone(timedelta(hours=2))))
    asking = build(Asker("asker"), "asking", zoned)
    await asking.run("hello")
    forked = counting.fork(at=4, instance_id="forked")
    del forked
    request = asking.pending_requests()[0]
    await asking.run(responses={request.request_id: "yes"})
    events = [event for instance in store.instances() for event in store.read(instance)]
    store.close()
    (path.with_suffix(".json")).write_bytes(
        orjson.dumps([e.model_dump(mode="json") for e in events], option=orjson.OPT_INDENT_2)
    )
    print(f"{len(events)} events in {path}")


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "format1.db"
    target.unlink(missing_ok=True)
    asyncio.run(main(target))
