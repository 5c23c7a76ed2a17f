"""Benchmark 1: superstep throughput of a two-executor loop (A -> B -> A), N supersteps.

Each superstep one executor sets two keys and sends one message. Every case checks the loop's
final count and final state (``a == b == N - 1``).
"""

from __future__ import annotations

import uuid

from bench._core import Benchmark, Case, Config, Measurement, Skipped, Target, expect
from bench._db import (
    fresh_schema,
    pg_schema_bytes,
    remove_sqlite,
    require_pg,
    sqlite_bytes,
    url_with_query,
)
from bench._raw import raw_psycopg_run, raw_sqlite_run
from bench._rows import RowShape, calibrate_from_sqlite, synthetic_loop
from bench._steplog import require_runner, runner_available
from bench._timing import timed, timed_async

__all__ = ["BENCHMARK"]

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


# -- steplog ------------------------------------------------------------------------------------


def _steplog_run(cfg: Config, url: str, durability: str = "superstep") -> float:
    graphs = require_runner()
    from kernel import open_store

    n = cfg.sizes.loop_n
    store = open_store(url)
    try:
        wf = graphs.loop_workflow(store, f"bench-loop-{uuid.uuid4().hex[:8]}", n, durability)
        result, seconds = timed_async(lambda: wf.run(0))
        expect(result.get_outputs(), [n], "steplog loop outputs")
        expect(dict(wf.committed_state()), _expected_state(n), "steplog loop committed state")
    finally:
        store.close()
    return seconds


def steplog_memory(cfg: Config) -> Measurement:
    seconds = _steplog_run(cfg, "memory://")
    return Measurement(cfg.sizes.loop_n / seconds)


def _steplog_sqlite(cfg: Config, durability: str) -> Measurement:
    require_runner()
    from kernel import open_store

    path = cfg.workdir / f"steplog-loop-{uuid.uuid4().hex[:8]}.db"
    url = f"sqlite:///{path}"  # workdir is absolute: sqlite:////abs/path
    try:
        open_store(url).close()  # the empty store's tables: not billed to the supersteps
        empty = sqlite_bytes(path)
        seconds = _steplog_run(cfg, url, durability)
        grown = sqlite_bytes(path) - empty
    finally:
        remove_sqlite(path)
    n = cfg.sizes.loop_n
    return Measurement(n / seconds, bytes_per_step=grown / n)


def steplog_sqlite(cfg: Config) -> Measurement:
    return _steplog_sqlite(cfg, "superstep")


def steplog_sqlite_write(cfg: Config) -> Measurement:
    return _steplog_sqlite(cfg, "write")


def steplog_postgres(cfg: Config) -> Measurement:
    require_runner()
    from kernel import open_store

    with fresh_schema(cfg, "steplog") as schema:
        url = url_with_query(cfg.pg_url, schema=schema)
        open_store(url).close()
        empty = pg_schema_bytes(cfg.pg_url, schema)
        seconds = _steplog_run(cfg, url)
        grown = pg_schema_bytes(cfg.pg_url, schema) - empty
    n = cfg.sizes.loop_n
    return Measurement(n / seconds, bytes_per_step=grown / n)


# -- Agent Framework ----------------------------------------------------------------------------


def _af() -> object:
    try:
        from bench import _af_graphs
    except ImportError as error:
        raise Skipped(
            f"agent-framework-core not installed (pip install -e '.[bench]'): {error}"
        ) from None
    return _af_graphs


def _af_run(cfg: Config, checkpointing: bool) -> Measurement:
    af = _af()
    n = cfg.sizes.loop_n
    storage = af.InMemoryCheckpointStorage() if checkpointing else None  # type: ignore[attr-defined]
    wf = af.loop_workflow(n, storage)  # type: ignore[attr-defined]
    result, seconds = timed_async(lambda: wf.run(0))
    outputs = result.get_outputs()
    expect(len(outputs), 1, "agent framework loop: number of outputs")
    expect(outputs[0]["count"], n, "agent framework loop count")
    expect(outputs[0]["state"], _expected_state(n), "agent framework loop state")
    return Measurement(n / seconds)


def af_memory(cfg: Config) -> Measurement:
    return _af_run(cfg, checkpointing=False)


def af_checkpointed(cfg: Config) -> Measurement:
    return _af_run(cfg, checkpointing=True)


# -- LangGraph ----------------------------------------------------------------------------------


def _lg() -> object:
    try:
        from bench import _lg_graphs
    except ImportError as error:
        raise Skipped(f"langgraph not installed (pip install -e '.[bench]'): {error}") from None
    return _lg_graphs


def _lg_invoke(cfg: Config, checkpointer: object, durability: str | None) -> float:
    lg = _lg()
    n = cfg.sizes.loop_n
    app = lg.loop_graph(n, checkpointer)  # type: ignore[attr-defined]
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
    return Measurement(cfg.sizes.loop_n / _lg_invoke(cfg, None, None))


def _lg_sqlite(cfg: Config, durability: str) -> Measurement:
    _lg()
    try:
        from langgraph.checkpoint.sqlite import SqliteSaver
    except ImportError as error:
        raise Skipped(f"langgraph-checkpoint-sqlite not installed: {error}") from None
    import sqlite3

    path = cfg.workdir / f"langgraph-{uuid.uuid4().hex[:8]}.db"
    try:
        conn = sqlite3.connect(path, check_same_thread=False)
        try:
            saver = SqliteSaver(conn)
            saver.setup()  # WAL; synchronous stays at SQLite's default FULL
            conn.commit()
            empty = sqlite_bytes(path)
            seconds = _lg_invoke(cfg, saver, durability)
        finally:
            conn.close()
        grown = sqlite_bytes(path) - empty
    finally:
        remove_sqlite(path)
    n = cfg.sizes.loop_n
    return Measurement(n / seconds, bytes_per_step=grown / n)


def lg_sqlite(cfg: Config) -> Measurement:
    return _lg_sqlite(cfg, "async")


def lg_sqlite_sync(cfg: Config) -> Measurement:
    return _lg_sqlite(cfg, "sync")


def _lg_postgres(cfg: Config, durability: str) -> Measurement:
    _lg()
    try:
        from langgraph.checkpoint.postgres import PostgresSaver
    except ImportError as error:
        raise Skipped(f"langgraph-checkpoint-postgres not installed: {error}") from None
    require_pg(cfg)
    with fresh_schema(cfg, "langgraph") as schema:
        url = url_with_query(cfg.pg_url, options=f"-csearch_path={schema}")
        with PostgresSaver.from_conn_string(url) as saver:
            saver.setup()
            empty = pg_schema_bytes(cfg.pg_url, schema)
            seconds = _lg_invoke(cfg, saver, durability)
        grown = pg_schema_bytes(cfg.pg_url, schema) - empty
    n = cfg.sizes.loop_n
    return Measurement(n / seconds, bytes_per_step=grown / n)


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


def prepare(cfg: Config) -> str:
    """Choose the raw baselines' rows: a real steplog run's when the runner exists."""
    if "loop_shape_override" in cfg.shared:
        cfg.shared["loop_shape"] = cfg.shared["loop_shape_override"]
    elif runner_available():
        cfg.shared["loop_shape"] = _calibrate(cfg) or synthetic_loop()
    else:
        cfg.shared["loop_shape"] = synthetic_loop()
    return "raw baselines write " + cfg.shared["loop_shape"].describe()


def _calibrate(cfg: Config) -> RowShape | None:
    graphs = require_runner()
    from kernel import open_store

    path = cfg.workdir / "calibrate-loop.db"
    instance = "bench-calibrate"
    try:
        store = open_store(f"sqlite:///{path}")
        try:
            wf = graphs.loop_workflow(store, instance, 40)
            timed_async(lambda: wf.run(0))
        finally:
            store.close()
        return calibrate_from_sqlite(path, instance)
    finally:
        remove_sqlite(path)


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
        Target("sqlite >= 60% of raw sqlite3", "steplog sqlite", ">=", 0.6, RAW_SQLITE),
        Target(
            "postgres >= 2x LangGraph PostgreSQL checkpointer", "steplog postgres", ">=", 2.0, LG_PG
        ),
        Target("postgres >= 60% of raw psycopg", "steplog postgres", ">=", 0.6, RAW_PG),
        Target(
            "sqlite bytes/superstep <= 1/3 of LangGraph SQLite",
            "steplog sqlite",
            "<=",
            1 / 3,
            LG_SQLITE,
            metric="bytes",
        ),
    ],
)
