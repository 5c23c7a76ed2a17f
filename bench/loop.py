"""Benchmark 1: superstep throughput of a two-executor loop (A -> B -> A), N supersteps.

Each superstep one executor sets two keys and sends one message. Every case checks the loop's
final count and final state (``a == b == N - 1``).
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from bench import _steplog_graphs as graphs
from bench._core import Benchmark, Case, Config, Measurement, Target, bench_extra, expect
from bench._db import pg_growth, sqlite_growth, url_with_query
from bench._raw import raw_psycopg_run, raw_sqlite_run
from bench._rows import RowShape, calibrate
from bench._timing import timed, timed_async, timed_async_cpu
from kernel import EventStore, open_store

__all__ = ["BENCHMARK", "loop_shape", "sqlite_url", "steplog_loop"]

# A durable case's growth: ``measure(create, run)`` -> (seconds, bytes added); ``create`` and
# ``run`` take where the run goes (a SQLite path or a PostgreSQL schema).
Measure = Callable[[Callable[[Any], object], Callable[[Any], float]], tuple[float, int]]

AF = "agent framework (in-memory)"
AF_CP = "agent framework + InMemoryCheckpointStorage"
LG_SQLITE = "langgraph sqlite checkpointer"
LG_PG = "langgraph postgres checkpointer"
RAW_SQLITE = "raw sqlite3 (1 txn/superstep)"
RAW_PG = "raw psycopg (1 txn/superstep)"


def _expected_state(n: int) -> dict[str, int]:
    return {"a": n - 1, "b": n - 1}


def _shape(cfg: Config) -> RowShape:
    shape: RowShape = cfg.shared["loop_shape"]
    return shape


def _per_step(cfg: Config, seconds: float, grown: int | None = None) -> Measurement:
    n = cfg.sizes.loop_n
    return Measurement(n / seconds, bytes_per_step=None if grown is None else grown / n)


def _on_sqlite(cfg: Config, prefix: str) -> Measure:
    path = cfg.workdir / f"{prefix}-{uuid.uuid4().hex[:8]}.db"  # workdir is absolute
    return lambda create, run: sqlite_growth(path, create, run)


def _on_postgres(cfg: Config, prefix: str) -> Measure:
    return lambda create, run: pg_growth(cfg, prefix, create, run)


# -- steplog ------------------------------------------------------------------------------------


def steplog_loop(
    url: str,
    n: int,
    durability: str = "superstep",
    advance: graphs.Advance | None = None,
    check: Callable[[EventStore, str], None] | None = None,
) -> tuple[float, float]:
    """Seconds and CPU seconds of one steplog loop of ``n`` supersteps on a store opened at
    ``url``, its output and committed state checked; ``advance`` as ``loop_workflow``'s;
    ``check(store, instance)`` runs after the clock, before the store is closed."""
    store = open_store(url)
    try:
        instance = f"bench-loop-{uuid.uuid4().hex[:8]}"
        wf = graphs.loop_workflow(store, instance, n, durability, advance)
        result, seconds, cpu = timed_async_cpu(lambda: wf.run(0))
        expect(result.get_outputs(), [n], "steplog loop outputs")
        expect(dict(wf.committed_state()), _expected_state(n), "steplog loop committed state")
        if check is not None:
            check(store, instance)
    finally:
        store.close()
    return seconds, cpu


def _steplog_run(cfg: Config, url: str, durability: str = "superstep") -> float:
    return steplog_loop(url, cfg.sizes.loop_n, durability)[0]


def _steplog_durable(
    cfg: Config, measure: Measure, url: Callable[[Any], str], durability: str = "superstep"
) -> Measurement:
    """The empty store's tables are created first: not billed to the supersteps."""
    seconds, grown = measure(
        lambda where: open_store(url(where)).close(),
        lambda where: _steplog_run(cfg, url(where), durability),
    )
    return _per_step(cfg, seconds, grown)


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"  # an absolute path: sqlite:////abs/path


def steplog_memory(cfg: Config) -> Measurement:
    return _per_step(cfg, _steplog_run(cfg, "memory://"))


def steplog_sqlite(cfg: Config) -> Measurement:
    return _steplog_durable(cfg, _on_sqlite(cfg, "steplog-loop"), sqlite_url)


def steplog_sqlite_write(cfg: Config) -> Measurement:
    return _steplog_durable(cfg, _on_sqlite(cfg, "steplog-loop"), sqlite_url, "write")


def steplog_postgres(cfg: Config) -> Measurement:
    return _steplog_durable(
        cfg,
        _on_postgres(cfg, "steplog"),
        lambda schema: url_with_query(cfg.pg_url, schema=schema),
    )


# -- Agent Framework ----------------------------------------------------------------------------


def _af_run(cfg: Config, checkpointing: bool) -> Measurement:
    af = bench_extra("_af_graphs")
    n = cfg.sizes.loop_n
    storage = af.InMemoryCheckpointStorage() if checkpointing else None
    wf = af.loop_workflow(n, storage)
    result, seconds = timed_async(lambda: wf.run(0))
    outputs = result.get_outputs()
    expect(len(outputs), 1, "agent framework loop: number of outputs")
    expect(outputs[0]["count"], n, "agent framework loop count")
    expect(outputs[0]["state"], _expected_state(n), "agent framework loop state")
    return _per_step(cfg, seconds)


def af_memory(cfg: Config) -> Measurement:
    return _af_run(cfg, checkpointing=False)


def af_checkpointed(cfg: Config) -> Measurement:
    return _af_run(cfg, checkpointing=True)


# -- LangGraph ----------------------------------------------------------------------------------


def _lg_invoke(cfg: Config, checkpointer: object, durability: str | None) -> float:
    lg = bench_extra("_lg_graphs")
    n = cfg.sizes.loop_n
    app = lg.loop_graph(n, checkpointer)
    config = {"recursion_limit": n + 10, "configurable": {"thread_id": uuid.uuid4().hex}}
    kwargs = {"durability": durability} if durability else {}
    result, seconds = timed(lambda: app.invoke({"count": 0, "a": -1, "b": -1}, config, **kwargs))
    expect(result["count"], n, "langgraph loop count")
    expect({"a": result["a"], "b": result["b"]}, _expected_state(n), "langgraph loop state")
    if checkpointer is not None:
        saved = app.get_state(config).values
        expect(saved["count"], n, "langgraph checkpointed count")
    return seconds


def lg_memory(cfg: Config) -> Measurement:
    return _per_step(cfg, _lg_invoke(cfg, None, None))


def _lg_durable(
    cfg: Config,
    measure: Measure,
    saver: Callable[[Any], AbstractContextManager[Any]],
    durability: str,
) -> Measurement:
    """``saver(where)`` opens a checkpointer whose tables exist; the first one only creates
    them (not billed to the supersteps)."""

    def create(where: Any) -> None:
        with saver(where):
            pass

    def run(where: Any) -> float:
        with saver(where) as checkpointer:
            return _lg_invoke(cfg, checkpointer, durability)

    seconds, grown = measure(create, run)
    return _per_step(cfg, seconds, grown)


def _lg_sqlite(cfg: Config, durability: str) -> Measurement:
    lg = bench_extra("_lg_graphs")

    @contextmanager
    def saver(path: Path) -> Iterator[Any]:
        conn = sqlite3.connect(path, check_same_thread=False)
        try:
            checkpointer = lg.SqliteSaver(conn)
            checkpointer.setup()  # WAL; synchronous stays at SQLite's default FULL
            conn.commit()
            yield checkpointer
        finally:
            conn.close()

    return _lg_durable(cfg, _on_sqlite(cfg, "langgraph"), saver, durability)


def lg_sqlite(cfg: Config) -> Measurement:
    return _lg_sqlite(cfg, "async")


def lg_sqlite_sync(cfg: Config) -> Measurement:
    return _lg_sqlite(cfg, "sync")


def _lg_postgres(cfg: Config, durability: str) -> Measurement:
    lg = bench_extra("_lg_graphs")

    @contextmanager
    def saver(schema: str) -> Iterator[Any]:
        url = url_with_query(cfg.pg_url, options=f"-csearch_path={schema}")
        with lg.PostgresSaver.from_conn_string(url) as checkpointer:
            checkpointer.setup()
            yield checkpointer

    return _lg_durable(cfg, _on_postgres(cfg, "langgraph"), saver, durability)


def lg_postgres(cfg: Config) -> Measurement:
    return _lg_postgres(cfg, "async")


def lg_postgres_sync(cfg: Config) -> Measurement:
    return _lg_postgres(cfg, "sync")


# -- the physical limit -------------------------------------------------------------------------


def raw_sqlite(cfg: Config) -> Measurement:
    return raw_sqlite_run(cfg, _shape(cfg), cfg.sizes.loop_n, txn_per_row=False)


def raw_sqlite_per_row(cfg: Config) -> Measurement:
    return raw_sqlite_run(cfg, _shape(cfg), cfg.sizes.loop_n, txn_per_row=True)


def raw_psycopg(cfg: Config) -> Measurement:
    return raw_psycopg_run(cfg, _shape(cfg), cfg.sizes.loop_n)


# -- preparation --------------------------------------------------------------------------------


def loop_shape(cfg: Config) -> RowShape:
    """The rows the raw baselines write per superstep: ``--raw-shape`` if given, else a real
    40-superstep steplog loop's (calibrated once per invocation)."""
    if "loop_shape" not in cfg.shared:
        cfg.shared["loop_shape"] = cfg.shared.get("loop_shape_override") or calibrate(
            cfg.workdir, lambda store, instance: graphs.loop_workflow(store, instance, 40)
        )
    return _shape(cfg)


def prepare(cfg: Config) -> str:
    return "raw baselines write " + loop_shape(cfg).describe()


BENCHMARK = Benchmark(
    name="loop",
    title="1. Superstep throughput: A -> B -> A loop",
    description=(
        "Two executors in a loop; each superstep one executor sets two keys and sends one "
        "message. Rate = N / wall time of the run. Bytes = on-disk growth / N (SQLite: "
        "page_count*page_size after a TRUNCATE checkpoint; PostgreSQL: pg_total_relation_size "
        "of the schema's tables). LangGraph's default durability is 'async' (the checkpoint of "
        "step k is written while step k+1 runs); 'sync' waits for it like steplog's "
        "durability='superstep'."
    ),
    metric="supersteps/s",
    higher_is_better=True,
    baseline=AF,
    show_bytes=True,
    warmup=True,
    prepare=prepare,
    cases=[
        Case("steplog memory", steplog_memory, steplog=True),
        Case("steplog sqlite", steplog_sqlite, steplog=True),
        Case("steplog sqlite (durability=write)", steplog_sqlite_write, steplog=True),
        Case("steplog postgres", steplog_postgres, steplog=True),
        Case(AF, af_memory),
        Case(AF_CP, af_checkpointed),
        Case("langgraph (no checkpointer)", lg_memory),
        Case(LG_SQLITE, lg_sqlite),
        Case("langgraph sqlite checkpointer (durability=sync)", lg_sqlite_sync),
        Case(LG_PG, lg_postgres),
        Case("langgraph postgres checkpointer (durability=sync)", lg_postgres_sync),
        Case(RAW_SQLITE, raw_sqlite),
        Case("raw sqlite3 (1 txn/row, for durability=write)", raw_sqlite_per_row),
        Case(RAW_PG, raw_psycopg),
    ],
    targets=[
        Target("memory >= 2x AF in-memory", "steplog memory", ">=", 2.0, AF),
        Target("sqlite >= AF with in-memory checkpointing", "steplog sqlite", ">=", 1.0, AF_CP),
        Target(
            "sqlite >= 3x LangGraph SQLite checkpointer", "steplog sqlite", ">=", 3.0, LG_SQLITE
        ),
        Target("sqlite >= 70% of raw sqlite3 (issue 25)", "steplog sqlite", ">=", 0.7, RAW_SQLITE),
        Target(
            "postgres >= 2x LangGraph PostgreSQL checkpointer", "steplog postgres", ">=", 2.0, LG_PG
        ),
        Target("postgres >= 60% of raw psycopg", "steplog postgres", ">=", 0.6, RAW_PG),
        Target(
            "sqlite bytes/superstep <= 0.2x LangGraph SQLite (issue 25)",
            "steplog sqlite",
            "<=",
            0.2,
            LG_SQLITE,
            metric="bytes",
        ),
    ],
)
