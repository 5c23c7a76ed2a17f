"""Benchmark: recorded steps (issue 23). What recording a step costs a superstep; steplog's durable
steps beside DBOS Transact's; and how often each step executes across a real SIGKILL and resume.

Two benchmarks of one name (``--only steps`` runs both):

* ``BENCHMARK`` (steps/s). The loop of benchmark 1 with one call per superstep of ``advance``
  (the next count), recorded (``@step``: a ``StepRecorded`` appended at once, its own commit on
  SQLite) and, in the same case and alternating which goes first, the same coroutine unrecorded:
  ``recording cost`` is time with / time without, ``us/step`` the time recording adds to each
  superstep. Then the shape of a DBOS workflow: one handler (one superstep) calling ``advance``
  N times, each call recorded and durable before the next. DBOS Transact does the same work, one
  ``@DBOS.workflow`` calling its ``@DBOS.step`` N times, on its SQLite system database with its
  defaults (one transaction per step; SQLite's rollback journal, ``synchronous=FULL``); the
  baseline is its sync form (neither form is reliably the faster); its async form, and the sync
  form on a file switched to WAL (steplog's journal mode), are shown beside it. Every case checks
  its result and reads back what it recorded: N step records (steplog's log, DBOS's
  ``list_workflow_steps``), each with the right output. Two floor rows give the disk's 1-row
  SQLite commits per second in each journal mode, measured in the same run: a durable step costs
  at least one commit.
* ``BENCHMARK_CRASH`` (duplicate executions). ``bench.step_crash``'s workflow in a process of its
  own, killed with SIGKILL inside its third step (before that step's record) or right after it
  (all three recorded), then resumed by another process; the counts file says how often each step
  executed, the log what was recorded and served. A count other than the exact one (each step
  once; the step killed before its record twice) is a wrong result.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import _steplog_graphs as graphs
from bench import step_crash
from bench._core import Benchmark, Case, Config, Measurement, Target, bench_extra, expect
from bench._db import fresh_schema, sqlite_growth, url_with_query
from bench._timing import timed_async_cpu, timed_cpu
from bench.fsync_floor import sqlite_commit_rate
from bench.loop import sqlite_url, steplog_loop
from kernel import EventStore, open_store

__all__ = ["BENCHMARK", "BENCHMARK_CRASH"]

DBOS = "dbos sqlite: 1 workflow, N steps"
DBOS_ASYNC = "dbos sqlite: 1 async workflow, N async steps"
DBOS_WAL = "dbos sqlite in WAL mode (tuned): 1 workflow, N steps"
LOOP_MEMORY = "steplog memory: loop, 1 recorded step per superstep"
LOOP_SQLITE = "steplog sqlite: loop, 1 recorded step per superstep"
ONE_MEMORY = "steplog memory: 1 handler, N recorded steps"
ONE_SQLITE = "steplog sqlite: 1 handler, N recorded steps"
GATHER_WIDTH = 10
"""How many steps the gathered cases run at once (``asyncio.gather``), wave after wave."""
GATHER_MEMORY = f"steplog memory: 1 handler, N steps, {GATHER_WIDTH} at a time gathered"
GATHER_SQLITE = f"steplog sqlite: 1 handler, N steps, {GATHER_WIDTH} at a time gathered"
DBOS_GATHER = f"dbos sqlite: 1 async workflow, N async steps, {GATHER_WIDTH} at a time gathered"


def _recorded(n: int) -> Callable[[EventStore, str], None]:
    """A check that the instance's log holds ``n`` records of ``advance``, none of them an error
    or a served call, with the results 1..n in order."""

    def check(store: EventStore, instance: str) -> None:
        records: list[Any] = store.read(instance, types=("step_recorded",))
        expect(len(records), n, "steps recorded")
        expect({(e.name, e.error, e.reused) for e in records}, {("advance", None, None)}, "records")
        results = [store.codec.decode(e.result) for e in records]
        expect(sorted(results), list(range(1, n + 1)), "recorded results")

    return check


def _unrecorded(store: EventStore, instance: str) -> None:
    expect(store.read(instance, types=("step_recorded",)), [], "steps recorded without @step")


# -- the cost of recording: the loop with and without its step ----------------------------------


def _with_and_without(cfg: Config, store: str) -> Measurement:
    """The loop with its step recorded and unrecorded, in turns (unrecorded first on one call,
    recorded first on the next), each on a fresh store; bytes are the recorded run's."""
    n = cfg.sizes.steps_n
    flip = cfg.shared[f"steps order {store}"] = not cfg.shared.get(f"steps order {store}", False)
    runs = [(graphs.advance, _unrecorded), (graphs.advance_recorded, _recorded(n))]
    seconds: list[tuple[float, float]] = []
    grown: int | None = None
    for advance, check in runs if flip else runs[::-1]:

        def loop(
            url: str, advance: graphs.Advance = advance, check: Any = check
        ) -> tuple[float, float]:
            return steplog_loop(url, n, "superstep", advance, check)

        if store == "memory":
            took = loop("memory://")
        else:
            path = cfg.workdir / f"steps-loop-{uuid.uuid4().hex[:8]}.db"
            took, added = sqlite_growth(
                path, lambda p: open_store(sqlite_url(p)).close(), lambda p: loop(sqlite_url(p))
            )
            if advance is graphs.advance_recorded:
                grown = added
        seconds.append(took)
    (plain, _), (recorded, cpu) = seconds if flip else seconds[::-1]
    return Measurement(
        n / recorded,
        bytes_per_step=None if grown is None else grown / n,
        extra={
            "plain": n / plain,
            "cost": recorded / plain,
            "us": (recorded - plain) / n * 1e6,
            "cpu": cpu / n * 1e6,
        },
    )


def loop_memory(cfg: Config) -> Measurement:
    return _with_and_without(cfg, "memory")


def loop_sqlite(cfg: Config) -> Measurement:
    return _with_and_without(cfg, "sqlite")


# -- N steps in one handler ---------------------------------------------------------------------


def _one_handler(cfg: Config, url: str, width: int = 1) -> tuple[float, float]:
    """N steps in one handler: one after the other, or ``width`` at a time gathered."""
    n = cfg.sizes.steps_n
    store = open_store(url)
    try:
        instance = f"bench-steps-{uuid.uuid4().hex[:8]}"
        if width == 1:
            wf = graphs.steps_workflow(store, instance, n)
        else:
            wf = graphs.gathered_workflow(store, instance, n, width)
        result, seconds, cpu = timed_async_cpu(lambda: wf.run(0))
        expect(result.get_outputs(), [n], "steplog steps outputs")
        expect(dict(wf.committed_state()), {"count": n}, "steplog steps committed state")
        _recorded(n)(store, instance)
    finally:
        store.close()
    return seconds, cpu


def _rate(cfg: Config, seconds: float, cpu: float, grown: int | None = None) -> Measurement:
    """N steps in ``seconds`` (``cpu`` of them the process's CPU), ``grown`` bytes added."""
    n = cfg.sizes.steps_n
    return Measurement(
        n / seconds,
        bytes_per_step=None if grown is None else grown / n,
        extra={"cpu": cpu / n * 1e6},
    )


def one_memory(cfg: Config) -> Measurement:
    return _rate(cfg, *_one_handler(cfg, "memory://"))


def one_sqlite(cfg: Config, width: int = 1) -> Measurement:
    path = cfg.workdir / f"steps-one-{uuid.uuid4().hex[:8]}.db"
    (seconds, cpu), grown = sqlite_growth(
        path,
        lambda p: open_store(sqlite_url(p)).close(),
        lambda p: _one_handler(cfg, sqlite_url(p), width),
    )
    return _rate(cfg, seconds, cpu, grown)


def gather_memory(cfg: Config) -> Measurement:
    return _rate(cfg, *_one_handler(cfg, "memory://", GATHER_WIDTH))


def gather_sqlite(cfg: Config) -> Measurement:
    return one_sqlite(cfg, GATHER_WIDTH)


# -- DBOS Transact ------------------------------------------------------------------------------


def _dbos(cfg: Config, asynchronous: bool, wal: bool = False, width: int = 1) -> Measurement:
    """DBOS's workflow of N steps on a fresh SQLite system database; with ``wal``, the file is
    switched to WAL (``synchronous`` stays FULL) after its migrations, as steplog's store runs;
    with ``width`` (async only), the steps run that many at a time, gathered."""
    dbos = bench_extra("_dbos_graphs")
    n = cfg.sizes.steps_n

    def run(path: Path) -> tuple[float, float]:
        workflow_id = uuid.uuid4().hex
        with dbos.launched(path):
            if asynchronous:

                async def go() -> int:
                    with dbos.SetWorkflowID(workflow_id):
                        if width == 1:
                            count: int = await dbos.steps_async(n)
                        else:
                            count = await dbos.steps_gathered(n, width)
                        return count

                result, seconds, cpu = timed_async_cpu(go)
            else:

                def go_sync() -> int:
                    with dbos.SetWorkflowID(workflow_id):
                        count: int = dbos.steps(n)
                        return count

                result, seconds, cpu = timed_cpu(go_sync)
            expect(result, n, "dbos workflow result")
            recorded = dbos.recorded_steps(workflow_id)
            expect(len(recorded), n, "dbos steps recorded")
            outputs = sorted(s["output"] for s in recorded)
            expect(outputs, list(range(1, n + 1)), "dbos recorded outputs")
        return seconds, cpu

    def create(path: Path) -> None:
        with dbos.launched(path):  # its migrations make the tables
            pass
        if wal:
            conn = sqlite3.connect(path)
            try:
                mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            finally:
                conn.close()
            expect(mode, "wal", "the DBOS system database's journal mode")

    path = cfg.workdir / f"dbos-{uuid.uuid4().hex[:8]}.sqlite"
    (seconds, cpu), grown = sqlite_growth(path, create, run)
    return _rate(cfg, seconds, cpu, grown)


def dbos_sync(cfg: Config) -> Measurement:
    return _dbos(cfg, asynchronous=False)


def dbos_async(cfg: Config) -> Measurement:
    return _dbos(cfg, asynchronous=True)


def dbos_wal(cfg: Config) -> Measurement:
    return _dbos(cfg, asynchronous=False, wal=True)


def dbos_gather(cfg: Config) -> Measurement:
    return _dbos(cfg, asynchronous=True, width=GATHER_WIDTH)


# -- the disk's floor ---------------------------------------------------------------------------


def floor_wal(cfg: Config) -> Measurement:
    rate = sqlite_commit_rate(cfg.workdir, cfg.sizes.floor_syncs)
    return Measurement(rate, note="1-row commits/s: a step's floor in steplog's journal mode")


def floor_rollback(cfg: Config) -> Measurement:
    rate = sqlite_commit_rate(cfg.workdir, cfg.sizes.floor_syncs, journal="DELETE")
    return Measurement(rate, note="1-row commits/s: a step's floor in DBOS's default journal mode")


BENCHMARK = Benchmark(
    name="steps",
    title="11. Recorded steps: what recording costs, and DBOS Transact",
    description=(
        "steps/s = N recorded steps / wall time (N = loop supersteps, or calls in one handler). "
        "The loop cases run the loop of benchmark 1 with one call of `advance` per superstep, "
        "recorded (@step: a StepRecorded appended at once, its own commit on SQLite, before the "
        "superstep's commit) and, alternating, unrecorded (the same coroutine): 'without' is the "
        "unrecorded rate (supersteps/s), 'cost' time with / time without, 'us/step' the time "
        "recording adds per superstep. '1 handler' calls `advance` N times in one superstep; "
        f"'{GATHER_WIDTH} at a time gathered' in waves of {GATHER_WIDTH} concurrent calls "
        "(asyncio.gather; DBOS: the same in an async workflow). "
        "DBOS Transact: one @DBOS.workflow calling its @DBOS.step N times, SQLite system database "
        "with DBOS's defaults (rollback journal, synchronous=FULL); 'WAL (tuned)' switches the "
        "file to WAL, steplog's journal mode, after DBOS's migrations. Bytes: on-disk growth / N. "
        "CPU: the process's CPU time (user + system, all threads) per step; wall time minus it is "
        "mostly waiting on the disk. "
        "Every case reads back its N records and their results. The floor rows are 1-row SQLite "
        "commits/s in the same directory, in each journal mode: a durable step costs at least one."
    ),
    metric="steps/s",
    higher_is_better=True,
    baseline=DBOS,
    show_bytes=True,
    bytes_header="bytes/step",
    warmup=True,
    extra_columns=[
        ("plain", "without recording, supersteps/s"),
        ("cost", "recording cost (time x)"),
        ("us", "us/step added"),
        ("cpu", "CPU us/step"),
    ],
    cases=[
        Case(LOOP_MEMORY, loop_memory, steplog=True),
        Case(LOOP_SQLITE, loop_sqlite, steplog=True),
        Case(ONE_MEMORY, one_memory, steplog=True),
        Case(ONE_SQLITE, one_sqlite, steplog=True),
        Case(GATHER_MEMORY, gather_memory, steplog=True),
        Case(GATHER_SQLITE, gather_sqlite, steplog=True),
        Case(DBOS, dbos_sync),
        Case(DBOS_ASYNC, dbos_async),
        Case(DBOS_WAL, dbos_wal),
        Case(DBOS_GATHER, dbos_gather),
        Case("floor: raw sqlite3 1-row commits (WAL, synchronous=FULL)", floor_wal),
        Case(
            "floor: raw sqlite3 1-row commits (rollback journal, synchronous=FULL)", floor_rollback
        ),
    ],
    targets=[
        Target("sqlite loop, 1 step/superstep >= 10x DBOS", LOOP_SQLITE, ">=", 10.0, DBOS),
        Target("sqlite, 1 handler, N steps >= 10x DBOS", ONE_SQLITE, ">=", 10.0, DBOS),
        Target(
            f"sqlite, N steps {GATHER_WIDTH} at a time >= 10x DBOS's gathered",
            GATHER_SQLITE,
            ">=",
            10.0,
            DBOS_GATHER,
        ),
    ],
)


# -- the crash counts ---------------------------------------------------------------------------


def _crash(cfg: Config, url: str, point: str) -> Measurement:
    instance = f"step-crash-{uuid.uuid4().hex[:8]}"
    counts = cfg.workdir / f"{instance}.counts"
    killed = step_crash.run_worker("crash", url, instance, str(counts), "superstep", point)
    expect(killed.returncode, -signal.SIGKILL, f"the worker's exit ({killed.stderr[-300:]})")
    resumed = step_crash.run_worker("resume", url, instance, str(counts), "superstep")
    expect(resumed.returncode, 0, f"the resumer's exit ({resumed.stderr[-300:]})")
    report = json.loads(resumed.stdout)
    wanted = {"status": "completed", "outputs": [step_crash.OUTPUT], "state": step_crash.STATE}
    expect(report, wanted, "the resumed run")
    with open_store(url, create=False) as store:
        summary = step_crash.summarize(store.read(instance), counts)
    runs = step_crash.expected_runs(point)
    expect(summary.runs, runs, "executions per step")
    expect(summary.duplicates, 0, "duplicate executions")
    expect(summary.aborted, ((2, "crashed"),), "aborted supersteps")
    expect(
        summary.served, summary.recorded, "steps served from the log: those the killed run recorded"
    )
    expect(summary.keys, dict.fromkeys(step_crash.STEPS, 1), "idempotency keys per step")
    counts.unlink()
    return Measurement(summary.duplicates, extra={**summary.runs, "served": len(summary.served)})


def crash_sqlite_in_step(cfg: Config) -> Measurement:
    path = cfg.workdir / f"step-crash-{uuid.uuid4().hex[:8]}.db"
    return _crash(cfg, sqlite_url(path), "in_step")


def crash_sqlite_after_steps(cfg: Config) -> Measurement:
    path = cfg.workdir / f"step-crash-{uuid.uuid4().hex[:8]}.db"
    return _crash(cfg, sqlite_url(path), "after_steps")


def crash_postgres_in_step(cfg: Config) -> Measurement:
    with fresh_schema(cfg, "stepcrash") as schema:
        return _crash(cfg, url_with_query(cfg.pg_url, schema=schema), "in_step")


CRASH_SQLITE = "steplog sqlite: SIGKILL inside step 3, resume"
CRASH_SQLITE_AFTER = "steplog sqlite: SIGKILL after step 3, resume"
CRASH_POSTGRES = "steplog postgres: SIGKILL inside step 3, resume"
BENCHMARK_CRASH = Benchmark(
    name="steps",
    title="11a. Recorded steps: executions per step across SIGKILL and resume",
    description=(
        "bench/step_crash.py: a handler calls reserve, charge, email (recorded steps; each "
        "appends a line to a counts file just before it returns). A process runs it and kills "
        "itself with SIGKILL inside email (after its line, before its record) or right after "
        "email returned (all three recorded); a new process resumes (wf.resume(), which closes "
        "the killed run as crashed). The value is the duplicate executions: executions of a call "
        "already recorded. Each case checks the exact counts (each step once; the step killed "
        "before its record twice, with one idempotency key), the steps served from the log "
        "(those the killed run recorded), the aborted superstep (crashed), the resumed run's "
        "output and committed state. One run per case: each is a real kill."
    ),
    metric="duplicate executions",
    higher_is_better=False,
    baseline=CRASH_SQLITE,
    max_repeat=1,
    extra_columns=[
        ("reserve", "reserve runs"),
        ("charge", "charge runs"),
        ("email", "email runs"),
        ("served", "served from the log"),
    ],
    cases=[
        Case(CRASH_SQLITE, crash_sqlite_in_step, steplog=True),
        Case(CRASH_SQLITE_AFTER, crash_sqlite_after_steps, steplog=True),
        Case(CRASH_POSTGRES, crash_postgres_in_step, steplog=True),
    ],
    targets=[
        Target(f"0 duplicate executions ({name})", name, "<=", 0.0)
        for name in (CRASH_SQLITE, CRASH_SQLITE_AFTER, CRASH_POSTGRES)
    ],
)
