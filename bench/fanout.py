"""Benchmark 2: wide supersteps. One source fans out to W executors, each writing K keys.

Each round is two supersteps: the source writes ``round`` and sends one message to all W
workers; then the W workers each write K keys and ``w0`` sends the next round back. The per-event
column divides wall time by the events steplog logged (rows, for the raw baseline).
"""

from __future__ import annotations

import uuid

from bench import _steplog_graphs as graphs
from bench._core import Benchmark, Case, Config, Measurement, bench_extra, expect
from bench._db import sqlite_growth
from bench._raw import raw_sqlite_run
from bench._rows import RowShape, calibrate
from bench._timing import timed_async
from kernel import open_store

__all__ = ["BENCHMARK"]

AF = "agent framework (in-memory)"


def _expected_state(cfg: Config) -> dict[str, int]:
    s = cfg.sizes
    last = s.fanout_rounds - 1
    state = {"round": last}
    state.update({f"w{i}.k{k}": last for i in range(s.fanout_width) for k in range(s.fanout_keys)})
    return state


def _counts(cfg: Config) -> tuple[int, int]:
    """(supersteps, state writes) of one run."""
    s = cfg.sizes
    return 2 * s.fanout_rounds, s.fanout_rounds * (1 + s.fanout_width * s.fanout_keys)


def _measure(cfg: Config, seconds: float, events: int | None, grown: int | None) -> Measurement:
    supersteps, writes = _counts(cfg)
    extra = {"writes": writes / seconds}
    if events:
        extra["us_per_event"] = seconds / events * 1e6
    return Measurement(
        supersteps / seconds,
        bytes_per_step=None if grown is None else grown / supersteps,
        extra=extra,
    )


def _steplog(cfg: Config, url: str) -> tuple[float, int]:
    s = cfg.sizes
    instance = f"bench-fanout-{uuid.uuid4().hex[:8]}"
    store = open_store(url)
    try:
        wf = graphs.fanout_workflow(store, instance, s.fanout_rounds, s.fanout_width, s.fanout_keys)
        result, seconds = timed_async(lambda: wf.run(0))
        expect(result.get_outputs(), [s.fanout_rounds], "steplog fan-out outputs")
        expect(dict(wf.committed_state()), _expected_state(cfg), "steplog fan-out state")
        events = store.version(instance)
    finally:
        store.close()
    return seconds, events


def steplog_memory(cfg: Config) -> Measurement:
    seconds, events = _steplog(cfg, "memory://")
    return _measure(cfg, seconds, events, None)


def steplog_sqlite(cfg: Config) -> Measurement:
    path = cfg.workdir / f"steplog-fanout-{uuid.uuid4().hex[:8]}.db"
    url = f"sqlite:///{path}"
    (seconds, events), grown = sqlite_growth(
        path, lambda _: open_store(url).close(), lambda _: _steplog(cfg, url)
    )
    return _measure(cfg, seconds, events, grown)


def af_memory(cfg: Config) -> Measurement:
    af = bench_extra("_af_graphs")
    s = cfg.sizes
    wf = af.fanout_workflow(s.fanout_rounds, s.fanout_width, s.fanout_keys)
    result, seconds = timed_async(lambda: wf.run(0))
    outputs = result.get_outputs()
    expect(len(outputs), 1, "agent framework fan-out: number of outputs")
    expect(outputs[0]["count"], s.fanout_rounds, "agent framework fan-out rounds")
    expect(outputs[0]["state"], _expected_state(cfg), "agent framework fan-out state")
    return _measure(cfg, seconds, None, None)


def raw_sqlite(cfg: Config) -> Measurement:
    shape: RowShape = cfg.shared["fanout_shape"]
    supersteps, _ = _counts(cfg)
    m = raw_sqlite_run(cfg, shape, supersteps, txn_per_row=False)
    seconds = supersteps / m.value
    rows = int(shape.rows_per_step * supersteps)
    return _measure(cfg, seconds, rows, int((m.bytes_per_step or 0) * supersteps))


def prepare(cfg: Config) -> str:
    s = cfg.sizes
    shape = calibrate(
        cfg.workdir,
        lambda store, instance: graphs.fanout_workflow(
            store, instance, 6, s.fanout_width, s.fanout_keys
        ),
        cycle=2,
    )
    cfg.shared["fanout_shape"] = shape
    return (
        f"width {s.fanout_width}, {s.fanout_keys} keys each, {s.fanout_rounds} rounds; raw "
        "baseline writes " + shape.describe()
    )


BENCHMARK = Benchmark(
    name="fanout",
    title="2. Fan-out supersteps: 1 source -> 16 executors x 4 keys",
    description=(
        "Per-event cost when supersteps are wide. Rate = supersteps / wall time; writes/s "
        "counts state writes; µs/event = wall time / events logged (raw: rows written)."
    ),
    metric="supersteps/s",
    higher_is_better=True,
    baseline=AF,
    show_bytes=True,
    warmup=True,
    extra_columns=[("writes", "state writes/s"), ("us_per_event", "µs/event")],
    prepare=prepare,
    cases=[
        Case("steplog memory", steplog_memory, steplog=True),
        Case("steplog sqlite", steplog_sqlite, steplog=True),
        Case(AF, af_memory),
        Case("raw sqlite3 (1 txn/superstep)", raw_sqlite),
    ],
)
