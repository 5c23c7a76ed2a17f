"""Benchmark 5: 1, 2 and 4 worker processes running independent instances against one
PostgreSQL database, with one projection process following the global log.

Each worker runs its own instance for S supersteps; total rate = all supersteps / (last worker
end - first worker start). The follower (steplog: a ``Projector`` keeping the ``state`` view;
raw: a loop reading new rows by ``notification_id`` and decoding each) records, after each page
it has folded, the lag of the page's newest event: now minus the event's timestamp (taken by the
writer just before its commit). "Catch-up" is the time from the last worker's end to the follower
having folded everything. Processes are started (spawn) and connected before the clock starts.

The raw baseline's writers take ``LOCK TABLE ... IN EXCLUSIVE MODE`` in each transaction, as
steplog's PostgreSQL store did before issue 10 (and eventsourcing's recorder does): without it a
follower reading ``notification_id > last`` can skip a row committed late with a lower id.
steplog's store now does without it (``docs/scaling.md``).

Lock waits: during the 4-worker runs a thread polls ``pg_stat_activity`` every 10 ms and counts,
over every sample of every active writer backend (``application_name`` set through
``PGAPPNAME``), those waiting on a heavyweight lock (``wait_event_type = 'Lock'``): the share of
append time spent waiting on locks, whatever the lock (table, advisory, row, transaction id).
"""

from __future__ import annotations

import datetime as dt
import multiprocessing as mp
import os
import queue
import statistics
import threading
import time
from collections import Counter
from typing import Any

import orjson

from bench._core import Benchmark, Case, Config, Measurement, Target, WrongResult, expect
from bench._db import fresh_schema, pg_connect, url_with_query
from bench._raw import PG_TABLE_DDL
from bench._rows import stamp

__all__ = ["BENCHMARK"]

FOLLOW_TIMEOUT = 300.0
WRITER_APP = "steplog-bench-writer"
"""``application_name`` of the writers' connections (through ``PGAPPNAME``), for the sampler."""
SAMPLE_EVERY = 0.01
SAMPLED_WORKERS = 4
"""Lock waits are sampled in the runs with this many workers only (polling costs CPU)."""
_SAMPLE_SQL = (
    "SELECT wait_event_type, wait_event FROM pg_stat_activity "
    "WHERE application_name = %s AND state = 'active' AND datname = current_database()"
)


class LockSampler:
    """Polls ``pg_stat_activity`` in a thread: every active writer backend in every sample is
    one observation, counted by what it waits on (``Lock/relation``, ``Lock/advisory``,
    ``IO/WALSync``, ``-`` for running)."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._stop = threading.Event()
        self.seen: Counter[str] = Counter()
        self._thread = threading.Thread(target=self._run, name="lock-sampler", daemon=True)

    def __enter__(self) -> LockSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        import psycopg

        with psycopg.connect(self._url, autocommit=True) as conn:
            while not self._stop.is_set():
                for kind, event in conn.execute(_SAMPLE_SQL, (WRITER_APP,)).fetchall():
                    self.seen[f"{kind}/{event}" if kind else "-"] += 1
                self._stop.wait(SAMPLE_EVERY)

    def extra(self) -> dict[str, float]:
        """``lock_wait_pct``: the share of writer observations waiting on a lock, in %."""
        total = sum(self.seen.values())
        locked = sum(n for key, n in self.seen.items() if key.startswith("Lock/"))
        return {"lock_wait_pct": 100.0 * locked / total if total else 0.0}

    def note(self) -> str:
        total = sum(self.seen.values()) or 1
        top = ", ".join(f"{k} {100 * n / total:.0f}%" for k, n in self.seen.most_common(4))
        return f"writer samples: {sum(self.seen.values())} ({top})"


def _now_dt() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _lag_stats(lags: list[float]) -> dict[str, float]:
    if not lags:
        return {"lag_p50_ms": 0.0, "lag_max_ms": 0.0}
    return {"lag_p50_ms": statistics.median(lags) * 1000, "lag_max_ms": max(lags) * 1000}


# -- raw psycopg processes ----------------------------------------------------------------------


def _raw_worker(
    url: str, schema: str, instance: str, supersteps: int, steps: Any, go: Any, out: Any
) -> None:
    import psycopg

    table = f'"{schema}".steplog_events'
    insert = (
        f"INSERT INTO {table} (originator_id, originator_version, topic, state) "
        "VALUES (%s, %s, %s, %s)"
    )
    lock = f"LOCK TABLE {table} IN EXCLUSIVE MODE"
    with psycopg.connect(url, application_name=WRITER_APP) as conn:
        conn.execute("SELECT 1")
        conn.commit()
        go.wait()
        start = time.time()
        version = 0
        for step in range(supersteps):
            now = _now_dt()
            batch = []
            for topic, state in steps[step % len(steps)]:
                version += 1
                batch.append((instance, version, topic, stamp(state, now)))
            with conn.cursor() as cur:
                cur.execute(lock)
                cur.executemany(insert, batch)
            conn.commit()
        out.put(("worker", instance, start, time.time(), version))


def _raw_follower(url: str, schema: str, expected: int, ready: Any, out: Any) -> None:
    import psycopg

    query = (
        "SELECT notification_id, originator_id, originator_version, state "
        f'FROM "{schema}".steplog_events '
        "WHERE notification_id > %s ORDER BY notification_id LIMIT 1000"
    )
    lags: list[float] = []
    versions: dict[str, int] = {}
    seen, last = 0, 0
    deadline = time.time() + FOLLOW_TIMEOUT
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT 1")
        ready.set()
        while seen < expected and time.time() < deadline:
            rows = conn.execute(query, (last,)).fetchall()
            if not rows:
                time.sleep(0.002)
                continue
            for _, instance, version, state in rows:
                obj = orjson.loads(state)  # the fold: decode every event, track stream versions
                versions[instance] = max(versions.get(instance, 0), version)
            newest = dt.datetime.fromisoformat(obj["timestamp"]).timestamp()
            lags.append(time.time() - newest)
            seen += len(rows)
            last = rows[-1][0]
    out.put(("follower", time.time(), seen, versions, _lag_stats(lags)))


# -- steplog processes --------------------------------------------------------------------------


def _steplog_worker(url: str, instance: str, supersteps: int, go: Any, out: Any) -> None:
    import asyncio

    os.environ["PGAPPNAME"] = WRITER_APP  # libpq names every connection the store opens
    from bench import _steplog_graphs as graphs
    from kernel import open_store

    store = open_store(url)
    try:
        wf = graphs.loop_workflow(store, instance, supersteps)
        go.wait()
        start = time.time()
        result = asyncio.run(wf.run(0))
        end = time.time()
        ok = result.get_outputs() == [supersteps]
        out.put(("worker", instance, start, end, store.version(instance) if ok else -1))
    finally:
        store.close()


def _steplog_follower(url: str, expected: int, ready: Any, out: Any) -> None:
    """steplog's projection process: a ``Projector`` keeping the ``state`` view caught up.

    After each catch-up that folded events, the lag is measured on the newest event now in the
    view: the time since it was stamped by its worker.
    """
    from kernel import open_store
    from projections import Projector

    store = open_store(url)
    lags: list[float] = []
    seen = 0
    deadline = time.time() + FOLLOW_TIMEOUT
    try:
        projector = Projector(store, ["state"], page_size=500)
        ready.set()
        checked = -1
        while time.time() < deadline:
            # The state view reads only the event types it folds, so progress is its position:
            # done when every worker's events are in the log and the view has scanned them all.
            # That check (a query per instance) runs only when the log has grown since the last
            # one, so an idle follower costs what the raw one does: a poll every 2 ms.
            if not projector.catch_up():
                last = projector.position("state")
                if last != checked:
                    checked = last
                    total = sum(store.version(i) for i in store.instances())
                    if total >= expected and last >= store.last_position():
                        seen = total
                        break
                time.sleep(0.002)
                continue
            position = projector.position("state")
            newest = store.read_all(after=position - 1, limit=1)
            if newest:
                lags.append(time.time() - newest[0].event.timestamp.timestamp())
        done_at = time.time()
        states = {i: projector.state(i) for i in store.instances()}
    finally:
        store.close()
    out.put(("follower", done_at, seen, states, _lag_stats(lags)))


# -- the driver ---------------------------------------------------------------------------------


def _drive(
    workers: list[Any], follower: Any, go: Any, ready: Any, out: Any, n: int, pg_url: str
) -> dict[str, Any]:
    sampler = LockSampler(pg_url) if n == SAMPLED_WORKERS else None
    procs = [follower, *workers]
    for p in procs:
        p.start()
    try:
        if not ready.wait(60):
            raise RuntimeError("follower did not start")
        time.sleep(0.5)  # let the workers connect and block on `go`
        if sampler is not None:
            sampler.__enter__()
        go.set()
        results = []
        deadline = time.time() + FOLLOW_TIMEOUT + 60
        while len(results) < n + 1:
            try:
                results.append(out.get(timeout=max(1.0, deadline - time.time())))
            except queue.Empty:
                raise RuntimeError(f"only {len(results)} of {n + 1} processes reported") from None
            if sampler is not None and sum(r[0] == "worker" for r in results) == n:
                sampler.__exit__()  # the writers are done: stop before the follower's tail
        for p in procs:
            p.join(30)
            if p.exitcode not in (0, None):
                raise RuntimeError(f"process {p.name} exited {p.exitcode}")
    finally:
        if sampler is not None:
            sampler.__exit__()
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(5)
    done = [r for r in results if r[0] == "worker"]
    follower_result = next(r for r in results if r[0] == "follower")
    start = min(r[2] for r in done)
    end = max(r[3] for r in done)
    return {
        "workers": done,
        "follower": follower_result,
        "start": start,
        "end": end,
        "sampler": sampler,
    }


CALIBRATION_SUPERSTEPS = 40


def _raw_step(cfg: Config) -> list[tuple[str, bytes]]:
    """The rows the raw writers insert per superstep: as many, and as long, as steplog's loop
    stores per superstep (read back from a 40-superstep run on a memory store: rows and bytes
    per superstep, whatever the log format), each a JSON object carrying a ``timestamp`` (so the
    follower can measure lag) padded to that length. Made once per invocation."""
    if "scaleout_raw_step" not in cfg.shared:
        import asyncio

        from bench import _steplog_graphs as graphs
        from kernel import open_store

        store = open_store("memory://")
        try:
            wf = graphs.loop_workflow(store, "calibrate", CALIBRATION_SUPERSTEPS)
            asyncio.run(wf.run(0))
            stored = store.recorder.select_events("calibrate")
        finally:
            store.close()
        count = max(1, round(len(stored) / CALIBRATION_SUPERSTEPS))
        size = sum(len(row.state) for row in stored) // (CALIBRATION_SUPERSTEPS * count)
        template = orjson.dumps({"timestamp": _now_dt().isoformat(timespec="microseconds")})
        pad = max(0, size - len(template) - len(b',"p":""'))
        state = orjson.dumps(
            {"timestamp": _now_dt().isoformat(timespec="microseconds"), "p": "x" * pad}
        )
        cfg.shared["scaleout_raw_step"] = [("row", state)] * count
    step: list[tuple[str, bytes]] = cfg.shared["scaleout_raw_step"]
    return step


def raw_case(cfg: Config, workers: int) -> Measurement:
    s = cfg.sizes.scale_supersteps
    steps = [_raw_step(cfg)]
    rows = s * len(steps[0])
    ctx = mp.get_context("spawn")
    go, ready, out = ctx.Event(), ctx.Event(), ctx.Queue()
    with fresh_schema(cfg, "scale") as schema:
        with pg_connect(cfg.pg_url, autocommit=True) as conn:
            conn.execute(PG_TABLE_DDL.format(schema=schema))
        procs = [
            ctx.Process(
                target=_raw_worker,
                args=(cfg.pg_url, schema, f"worker-{i}", s, steps, go, out),
                name=f"raw-worker-{i}",
            )
            for i in range(workers)
        ]
        follower = ctx.Process(
            target=_raw_follower,
            args=(cfg.pg_url, schema, rows * workers, ready, out),
            name="raw-follower",
        )
        r = _drive(procs, follower, go, ready, out, workers, cfg.pg_url)
    _, done_at, seen, versions, lag = r["follower"]
    expect(seen, rows * workers, "raw follower: events read")
    expect(versions, {f"worker-{i}": rows for i in range(workers)}, "raw follower: stream versions")
    _check_lag(lag, "raw follower")
    return _result(workers * s, r, done_at, lag)


def _check_lag(lag: dict[str, float], who: str) -> None:
    """A lag of a minute or more means the timestamps were not stamped: a broken measurement."""
    if not 0 <= lag["lag_p50_ms"] < 60_000:
        raise WrongResult(f"{who}: lag p50 {lag['lag_p50_ms']:.0f} ms is not a real lag")


def _result(
    supersteps: int, r: dict[str, Any], done_at: float, lag: dict[str, float]
) -> Measurement:
    extra = {"catchup_ms": max(0.0, done_at - r["end"]) * 1000, **lag}
    sampler: LockSampler | None = r["sampler"]
    note = ""
    if sampler is not None:
        extra.update(sampler.extra())
        note = sampler.note()
    return Measurement(supersteps / (r["end"] - r["start"]), extra=extra, note=note)


def steplog_case(cfg: Config, workers: int) -> Measurement:
    from kernel import open_store

    s = cfg.sizes.scale_supersteps
    ctx = mp.get_context("spawn")
    go, ready, out = ctx.Event(), ctx.Event(), ctx.Queue()
    with fresh_schema(cfg, "scale_steplog") as schema:
        url = url_with_query(cfg.pg_url, schema=schema)
        open_store(url).close()
        # The events one loop run logs: measured on a memory store before the clock starts.
        expected_per_worker = _events_per_run(s)
        procs = [
            ctx.Process(target=_steplog_worker, args=(url, f"worker-{i}", s, go, out))
            for i in range(workers)
        ]
        follower = ctx.Process(
            target=_steplog_follower, args=(url, expected_per_worker * workers, ready, out)
        )
        r = _drive(procs, follower, go, ready, out, workers, cfg.pg_url)
    for w in r["workers"]:
        expect(w[4], expected_per_worker, f"steplog worker {w[1]}: events logged")
    _, done_at, seen, states, lag = r["follower"]
    expect(seen, expected_per_worker * workers, "steplog follower: events read")
    want = {f"worker-{i}": {"a": s - 1, "b": s - 1} for i in range(workers)}
    expect(states, want, "steplog follower: committed state of every instance")
    _check_lag(lag, "steplog follower")
    return _result(workers * s, r, done_at, lag)


def _events_per_run(supersteps: int) -> int:
    import asyncio

    from bench import _steplog_graphs as graphs
    from kernel import open_store

    store = open_store("memory://")
    try:
        wf = graphs.loop_workflow(store, "count", supersteps)
        asyncio.run(wf.run(0))
        return int(store.version("count"))
    finally:
        store.close()


def _describe(cfg: Config) -> str:
    step = _raw_step(cfg)
    return (
        f"{cfg.sizes.scale_supersteps} supersteps per worker; workers {cfg.sizes.scale_workers}; "
        f"each worker has its own instance; raw writers insert {len(step)} row(s) of "
        f"{len(step[0][1])} bytes per superstep, as steplog stores"
    )


def _guard(fn: Any, workers: int) -> Any:
    def case(cfg: Config) -> Measurement:
        from bench._core import Skipped

        if workers not in cfg.sizes.scale_workers:
            raise Skipped(f"{workers} workers not in this run's sizes")
        return fn(cfg, workers=workers)

    return case


BENCHMARK = Benchmark(
    name="scaleout",
    title="5. Scale-out: worker processes on one PostgreSQL, one projection following",
    description=(
        "Total supersteps/s over all workers. Lag = age of the newest event of each page the "
        "follower folds (steplog: Projector state view, committed; raw: rows decoded), p50 and "
        "max; catch-up = last worker end to the follower having folded everything."
    ),
    metric="supersteps/s",
    higher_is_better=True,
    baseline="raw psycopg, 1 worker",
    extra_columns=[
        ("lag_p50_ms", "lag p50 ms"),
        ("lag_max_ms", "lag max ms"),
        ("catchup_ms", "catch-up ms"),
        ("lock_wait_pct", "writers waiting on a lock %"),
    ],
    max_repeat=3,
    prepare=_describe,
    targets=[
        Target(
            f"steplog vs raw psycopg, {w} worker{'s' if w > 1 else ''} each",
            f"steplog postgres, {w} worker{'s' if w > 1 else ''}",
            ">=",
            0.9,
            baseline=f"raw psycopg, {w} worker{'s' if w > 1 else ''}",
        )
        for w in (1, 2, 4)
    ],
    cases=[
        *(
            Case(
                f"steplog postgres, {w} worker{'s' if w > 1 else ''}",
                _guard(steplog_case, w),
                steplog=True,
            )
            for w in (1, 2, 4)
        ),
        *(
            Case(f"raw psycopg, {w} worker{'s' if w > 1 else ''}", _guard(raw_case, w))
            for w in (1, 2, 4)
        ),
    ],
)
