"""Benchmark 6: group commit. N instances of the loop running concurrently in one process.

The loop of ``bench/loop.py`` (A -> B -> A, two keys set and one message sent per superstep),
N = 1, 8 and 64 instances at once, each on its own instance id, all on ONE store: one SQLite file
or one PostgreSQL pool. The instances are ``asyncio.gather``-ed in one event loop; the rate is
the aggregate: all instances' supersteps / wall time. The supersteps are split evenly
(``Sizes.concurrent_supersteps`` in all), so every width does the same total work.

Without group commit every superstep pays its own synced write, so the aggregate cannot pass the
disk's synced writes per second (the "floor" cases, measured in the directory of the databases)
however many instances run; with it, one sync serves every superstep that is ready.

Every case checks its result: each instance's output and committed state, and that every
superstep is durable: after the run the store is opened afresh and each instance's stream must
hold one ``SuperstepCommitted`` for each of its supersteps, indexes 1..n+1, once each (n
supersteps send, the last one yields the output), and one ``RunCompleted``.

LangGraph drives as many concurrent ``ainvoke`` (one thread id each) on one asyncio
checkpointer: ``AsyncSqliteSaver`` on one aiosqlite connection, ``AsyncPostgresSaver`` on one
connection pool as large as steplog's store's (2, overflow to 6). Its durability is "async" as in
the loop benchmark (the checkpoint of step k is written while step k+1 runs; ``ainvoke`` returns
after the last one is written); one "sync" case at 64 is shown beside it.
"""

from __future__ import annotations

import asyncio
import gc
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from typing import Any, TypeVar

from bench import _steplog_graphs as graphs
from bench._core import Benchmark, Case, Config, Measurement, Target, bench_extra, expect
from bench._db import fresh_schema, remove_sqlite, url_with_query
from bench.fsync_floor import fdatasync_rate, fsync_rate, sqlite_commit_rate
from kernel import EventStore, open_store

__all__ = ["BENCHMARK", "WIDTHS"]

T = TypeVar("T")

WIDTHS = (1, 8, 64)
WRITE_SHARE = 4
"""``durability="write"`` runs a quarter of the supersteps: one synced write per event is slow."""
PG_POOL = (2, 6)
"""LangGraph's pool: steplog's PostgreSQL store's default (``pool_size=2, max_overflow=4``)."""

AF = "agent framework (in-memory, 1 instance)"
LG_SQLITE = "langgraph sqlite checkpointer"


def _name(system: str, width: int, suffix: str = "") -> str:
    return f"{system} x{width}{suffix}"


def _per_instance(cfg: Config, width: int, share: int = 1) -> int:
    return max(cfg.sizes.concurrent_supersteps // (width * share), 1)


def _expected_state(n: int) -> dict[str, int]:
    return {"a": n - 1, "b": n - 1}


def _aggregate(width: int, n: int, seconds: float) -> Measurement:
    """``n`` supersteps per instance, as the loop benchmark counts them (the last, yielding,
    superstep is not counted, for steplog nor for the others)."""
    return Measurement(
        width * n / seconds, extra={"instances": float(width), "per_instance": float(n)}
    )


async def _clocked(work: Awaitable[T]) -> tuple[T, float]:
    gc.collect()
    start = time.perf_counter()
    result = await work
    return result, time.perf_counter() - start


# -- steplog ------------------------------------------------------------------------------------


def _check_durable(store: EventStore, instances: list[str], n: int) -> None:
    """Every superstep of every instance is in the store, committed exactly once."""
    types = ["superstep_started", "superstep_committed", "run_completed"]
    for instance in instances:
        events = store.read(instance, types=types)
        index = {e.superstep_id: e.index for e in events if e.type == "superstep_started"}
        committed = [index.get(e.superstep_id) for e in events if e.type == "superstep_committed"]
        expect(committed, list(range(1, n + 2)), f"steplog {instance}: committed supersteps")
        completed = sum(1 for e in events if e.type == "run_completed")
        expect(completed, 1, f"steplog {instance}: RunCompleted events")


def _steplog_concurrent(
    cfg: Config, url: str, width: int, durability: str = "superstep", share: int = 1
) -> Measurement:
    n = _per_instance(cfg, width, share)
    instances = [f"bench-conc-{i}-{uuid.uuid4().hex[:8]}" for i in range(width)]
    store = open_store(url)
    try:
        workflows = [graphs.loop_workflow(store, i, n, durability) for i in instances]

        async def run_all() -> tuple[list[Any], float]:
            return await _clocked(asyncio.gather(*(wf.run(0) for wf in workflows)))

        results, seconds = asyncio.run(run_all())
        for instance, wf, result in zip(instances, workflows, results, strict=True):
            expect(result.get_outputs(), [n], f"steplog {instance}: outputs")
            expect(dict(wf.committed_state()), _expected_state(n), f"steplog {instance}: state")
    finally:
        store.close()
    reopened = open_store(url, create=False)  # what a fresh reader finds: the durable log
    try:
        _check_durable(reopened, instances, n)
    finally:
        reopened.close()
    return _aggregate(width, n, seconds)


@contextmanager
def _sqlite_url(cfg: Config, prefix: str) -> Iterator[str]:
    path = cfg.workdir / f"{prefix}-{uuid.uuid4().hex[:8]}.db"  # workdir is absolute
    try:
        yield f"sqlite:///{path}"
    finally:
        remove_sqlite(path)


def _steplog_sqlite(
    width: int, durability: str = "superstep", share: int = 1
) -> Callable[[Config], Measurement]:
    def case(cfg: Config) -> Measurement:
        with _sqlite_url(cfg, "steplog-conc") as url:
            return _steplog_concurrent(cfg, url, width, durability, share)

    return case


def _steplog_postgres(width: int) -> Callable[[Config], Measurement]:
    def case(cfg: Config) -> Measurement:
        with fresh_schema(cfg, "steplog_conc") as schema:
            return _steplog_concurrent(cfg, url_with_query(cfg.pg_url, schema=schema), width)

    return case


# -- LangGraph ----------------------------------------------------------------------------------


def _lg_concurrent(
    cfg: Config,
    width: int,
    saver: Callable[[], AbstractAsyncContextManager[Any]],
    durability: str,
) -> Measurement:
    """``saver()`` opens the checkpointer (tables created, off the clock) in the run's loop."""
    lg = bench_extra("_lg_graphs")
    n = _per_instance(cfg, width)
    threads = [uuid.uuid4().hex for _ in range(width)]
    configs = [{"recursion_limit": n + 10, "configurable": {"thread_id": t}} for t in threads]
    start = {"count": 0, "a": -1, "b": -1}

    async def main() -> float:
        async with saver() as checkpointer:
            app = lg.loop_graph(n, checkpointer)
            runs = (app.ainvoke(start, c, durability=durability) for c in configs)
            results, seconds = await _clocked(asyncio.gather(*runs))
            for thread, result in zip(threads, results, strict=True):
                expect(result["count"], n, f"langgraph {thread}: count")
                state = {"a": result["a"], "b": result["b"]}
                expect(state, _expected_state(n), f"langgraph {thread}: state")
        async with saver() as checkpointer:  # a fresh connection: what was made durable
            app = lg.loop_graph(n, checkpointer)
            for thread, c in zip(threads, configs, strict=True):
                saved = (await app.aget_state(c)).values
                expect(saved["count"], n, f"langgraph {thread}: checkpointed count")
        return seconds

    return _aggregate(width, n, asyncio.run(main()))


def _lg_sqlite(width: int, durability: str = "async") -> Callable[[Config], Measurement]:
    def case(cfg: Config) -> Measurement:
        lg = bench_extra("_lg_graphs")
        with _sqlite_url(cfg, "langgraph-conc") as url:
            path = url.removeprefix("sqlite:///")
            return _lg_concurrent(cfg, width, lambda: lg.async_sqlite_saver(path), durability)

    return case


def _lg_postgres(width: int) -> Callable[[Config], Measurement]:
    def case(cfg: Config) -> Measurement:
        lg = bench_extra("_lg_graphs")
        with fresh_schema(cfg, "langgraph_conc") as schema:
            url = url_with_query(cfg.pg_url, options=f"-csearch_path={schema}")
            low, high = PG_POOL
            return _lg_concurrent(
                cfg,
                width,
                lambda: lg.async_postgres_saver(url, min_size=low, max_size=high),
                "async",
            )

    return case


# -- Agent Framework: the reference line ----------------------------------------------------------


def af_memory(cfg: Config) -> Measurement:
    """One instance, no checkpoint storage, all the supersteps the concurrent cases share."""
    af = bench_extra("_af_graphs")
    n = cfg.sizes.concurrent_supersteps
    wf = af.loop_workflow(n, None)

    async def run() -> tuple[Any, float]:
        return await _clocked(wf.run(0))

    result, seconds = asyncio.run(run())
    outputs = result.get_outputs()
    expect(len(outputs), 1, "agent framework loop: number of outputs")
    expect(outputs[0]["count"], n, "agent framework loop count")
    expect(outputs[0]["state"], _expected_state(n), "agent framework loop state")
    return _aggregate(1, n, seconds)


# -- the physical floor -------------------------------------------------------------------------


def floor_fsync(cfg: Config) -> Measurement:
    return Measurement(fsync_rate(cfg.workdir, cfg.sizes.floor_syncs), note="os.fsync/s")


def floor_fdatasync(cfg: Config) -> Measurement:
    return Measurement(fdatasync_rate(cfg.workdir, cfg.sizes.floor_syncs), note="fdatasync/s")


def floor_sqlite(cfg: Config) -> Measurement:
    rate = sqlite_commit_rate(cfg.workdir, cfg.sizes.floor_syncs)
    return Measurement(rate, note="1-row commits/s, WAL, synchronous=FULL")


def _cases() -> list[Case]:
    cases = [Case(_name("steplog sqlite", w), _steplog_sqlite(w), steplog=True) for w in WIDTHS]
    cases.append(
        Case(
            _name("steplog sqlite", WIDTHS[-1], " (durability=write)"),
            _steplog_sqlite(WIDTHS[-1], "write", WRITE_SHARE),
            steplog=True,
        )
    )
    cases += [
        Case(_name("steplog postgres", w), _steplog_postgres(w), steplog=True) for w in WIDTHS
    ]
    cases.append(Case(AF, af_memory))
    cases += [Case(_name(LG_SQLITE, w), _lg_sqlite(w)) for w in WIDTHS]
    cases.append(
        Case(_name(LG_SQLITE, WIDTHS[-1], " (durability=sync)"), _lg_sqlite(WIDTHS[-1], "sync"))
    )
    cases += [Case(_name("langgraph postgres checkpointer", w), _lg_postgres(w)) for w in WIDTHS]
    cases += [
        Case("floor: os.fsync, 4 KiB appends (1 writer)", floor_fsync),
        Case("floor: os.fdatasync, 4 KiB appends (1 writer)", floor_fdatasync),
        Case("floor: raw sqlite3 commits (WAL, synchronous=FULL)", floor_sqlite),
    ]
    return cases


BENCHMARK = Benchmark(
    name="concurrent",
    title="6. Group commit: 1, 8, 64 concurrent loop instances in one process, one store",
    description=(
        "N instances of the loop, gather-ed in one event loop of one process, on one SQLite file "
        "or one PostgreSQL pool; rate = all instances' supersteps / wall time. Each instance's "
        "output and state are checked, and every superstep must be in the store afterwards "
        "(SuperstepCommitted indexes 1..n+1 per instance, read through a freshly opened store). "
        f"durability=write runs 1/{WRITE_SHARE} of the supersteps. LangGraph: as many concurrent "
        "ainvoke (one thread id each) on one AsyncSqliteSaver (one aiosqlite connection) or one "
        f"AsyncPostgresSaver (one pool of {PG_POOL[0]}..{PG_POOL[1]} connections, as steplog's "
        "store), durability='async' as in the loop benchmark unless named. The floor cases are "
        "the disk's synced writes per second in the databases' directory (one writer): the most "
        "supersteps/s any design reaches that syncs once per superstep."
    ),
    metric="supersteps/s",
    higher_is_better=True,
    baseline=AF,
    warmup=True,
    extra_columns=[("instances", "instances"), ("per_instance", "supersteps/instance")],
    cases=_cases(),
    targets=[
        Target(
            "sqlite x64 >= 7x LangGraph SQLite x64 (async; issue 25)",
            _name("steplog sqlite", 64),
            ">=",
            7.0,
            _name(LG_SQLITE, 64),
        ),
        Target(
            "sqlite x64 >= AF in-memory, 1 instance", _name("steplog sqlite", 64), ">=", 1.0, AF
        ),
    ],
)
