"""Benchmark 6: resume latency, after 1,000 and after 100,000 supersteps of history.

Resume latency is the time from asking to continue a run from its last checkpoint to the first
new superstep starting, in a fresh setting: a new store (or checkpointer) object and a new
workflow (or graph) object on the history left by another one. Finding the last checkpoint is
inside the clock for every system, because a process that restarts after a crash has to find it:

* steplog: ``wf.checkpoints()`` and ``wf.run(checkpoint_id=<last>, stream=True)``, until the first
  ``superstep_started`` event; and ``wf.resume(stream=True)``, which continues the instance's last
  run from its checkpoint without listing them;
* Agent Framework 1.23.0 with ``FileCheckpointStorage``: ``storage.get_latest(workflow_name=...)``
  and ``workflow.run(checkpoint_id=<latest>, stream=True)``, until its first ``superstep_started``;
  a second case starts the clock with the latest checkpoint's id already known (an application
  that keeps it somewhere), so the cost of the listing and the cost of the restore are apart;
* LangGraph with the SQLite checkpointer: ``graph.stream(None, {thread_id})`` (which looks up the
  thread's latest checkpoint itself) in ``stream_mode="tasks"``, until the first task starts.

The history is the same for all: the A -> B -> A loop (``LoopStep``: two keys and one message per
superstep), run towards ``N + TAIL`` but stopped by its superstep limit after ``N`` committed
supersteps (steplog ``max_supersteps``, Agent Framework ``max_iterations``, LangGraph
``recursion_limit``), so the last checkpoint still has a message to deliver. Each system writes its
own history through its own API, for real; the histories are cached under ``bench/.cache/``,
keyed by the versions and source that wrote them. Each timed run resumes a fresh copy (steplog
SQLite and LangGraph: a copy of the file; memory and PostgreSQL: the cached log appended into a
new store; Agent Framework: the cached directory, from which the files the resumed run adds are
deleted afterwards). The resumed run then goes on to the end, off the clock, and every case
checks it: its first superstep is ``N + 1`` and it finishes with output ``N + TAIL`` and state
``a == b == N + TAIL - 1``.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import importlib.metadata
import json
import os
import shutil
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from bench import _steplog_graphs as graphs
from bench._core import Benchmark, Case, Config, Measurement, bench_extra, expect
from bench._db import fresh_schema, remove_sqlite, sqlite_bytes, url_with_query
from kernel import ConvergenceError, EventStore, WorkflowBuilder, open_store

__all__ = ["BENCHMARK_LARGE", "BENCHMARK_SMALL"]

TAIL = 2
"""Supersteps past ``N`` the loop wants: the resumed run runs ``N + 1 .. N + TAIL + 1``."""
INSTANCE = "bench-resume"
THREAD = "bench-resume"
COPY_BATCH = 7000  # events per append when a cached steplog log is loaded into another store

AF_FILE = "agent framework FileCheckpointStorage"
AF_KNOWN = "agent framework FileCheckpointStorage, id known"
LG_SQLITE = "langgraph sqlite checkpointer"
SL_SQLITE = "steplog sqlite"


def _size(cfg: Config, large: bool) -> int:
    """Supersteps of history: 1,000 and 100,000; 20 and 40 in a smoke run."""
    if cfg.smoke:
        return 40 if large else 20
    return 100_000 if large else 1000


def _digest(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
    return h.hexdigest()[:12]


def _sources(folder: Path) -> bytes:
    """The ``*.py`` files under ``folder`` (its rooms too: what a history holds, snapshots
    included, depends on them), concatenated in path order (a cache key's part)."""
    return b"".join(p.read_bytes() for p in sorted(folder.rglob("*.py")))


def _versions(*dists: str) -> str:
    return ",".join(f"{d}={importlib.metadata.version(d)}" for d in dists)


def _cached(cfg: Config, stem: str, key: str, suffix: str, make: Callable[[Path], None]) -> Path:
    """``cache_dir/stem-key.suffix``, made by ``make(partial path)`` when missing; stale entries
    of the same stem (other keys) are removed first.

    The first path found for a stem is kept for the whole invocation: the code this process
    imported does not change when its files are edited during a long run, so neither does the
    history it would write.
    """
    known: dict[str, Path] = cfg.shared.setdefault("resume_histories", {})
    if stem in known:
        return known[stem]
    path = cfg.cache_dir / f"{stem}-{key}{suffix}"
    if path.exists():
        known[stem] = path
        return path
    cfg.cache_dir.mkdir(parents=True, exist_ok=True)
    for old in cfg.cache_dir.glob(f"{stem}-*"):
        if old.is_dir():
            shutil.rmtree(old)
        else:
            old.unlink()
    partial = cfg.cache_dir / f"{stem}-{key}.partial{suffix}"
    if suffix:
        remove_sqlite(partial)
    else:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
    make(partial)
    partial.rename(path)
    for leftover in ("-wal", "-shm"):
        Path(f"{partial}{leftover}").unlink(missing_ok=True)
    known[stem] = path
    return path


def _clocked(work: Callable[[], Any]) -> Any:
    """Run the coroutine ``work()`` in a fresh event loop after a full collection."""
    gc.collect()
    return asyncio.run(work())


async def _first_superstep(stream: AsyncIterator[Any]) -> tuple[float, int | None, list[Any]]:
    """Drain a resumed run's event ``stream`` (steplog's or Agent Framework's: both name a
    superstep's index ``iteration``): when its first ``superstep_started`` came
    (``time.perf_counter()``), that superstep's index, and the outputs."""
    first: float | None = None
    index: int | None = None
    outputs: list[Any] = []
    async for event in stream:
        if first is None and event.type == "superstep_started":
            first = time.perf_counter()
            index = event.iteration
        elif event.type == "output":
            outputs.append(event.data)
    assert first is not None, "the resumed run started no superstep"
    return first, index, outputs


def _check_end(system: str, n: int, first_index: int | None, outputs: list[Any]) -> None:
    expect(first_index, n - TAIL + 1, f"{system}: index of the resumed run's first superstep")
    expect(outputs, [n], f"{system}: the resumed run's outputs")


def _measurement(total: float, find: float | None = None, *, split: bool = True) -> Measurement:
    """``total`` seconds as ms; ``find`` (the part spent finding the checkpoint) and the rest as
    the extra columns, unless the system does both in one call (``split=False``)."""
    extra: dict[str, float] = {}
    if split:
        extra["start_ms"] = (total - (find or 0.0)) * 1000
    if find is not None:
        extra["find_ms"] = find * 1000
    return Measurement(total * 1000, extra=extra)


# -- steplog ------------------------------------------------------------------------------------


def _steplog_workflow(store: EventStore, n: int, max_supersteps: int) -> Any:
    a, b = graphs.LoopStep("a", n), graphs.LoopStep("b", n)
    return (
        WorkflowBuilder(
            start_executor=a,
            store=store,
            instance_id=INSTANCE,
            max_supersteps=max_supersteps,
            durability="superstep",
        )
        .add_edge(a, b)
        .add_edge(b, a)
        .build()
    )


def _steplog_history(cfg: Config, steps: int) -> Path:
    """A SQLite log of one run of the loop stopped by ``max_supersteps`` after ``steps``."""
    root = Path(__file__).resolve().parent.parent / "kernel"

    def make(path: Path) -> None:
        store = open_store(f"sqlite:///{path}")
        try:
            wf = _steplog_workflow(store, steps + TAIL, max_supersteps=steps)
            try:
                asyncio.run(wf.run(0))
            except ConvergenceError:
                pass
            else:
                raise RuntimeError("the steplog history run did not stop at its superstep limit")
            expect(
                dict(wf.committed_state()),
                {"a": steps - 1, "b": steps - 1},
                "steplog history: committed state",
            )
        finally:
            store.close()
        sqlite_bytes(path)  # the WAL folded into the file, which is then copied alone

    key = _digest(_sources(root), str(steps))
    return _cached(cfg, f"resume-steplog-s{steps}", key, ".db", make)


def _steplog_resume(
    cfg: Config, store: EventStore, n: int, *, by_checkpoint: bool = True
) -> Measurement:
    """The timed resume on ``store`` (holding the history) with a new workflow object: from the
    last of ``checkpoints()``, or (``by_checkpoint=False``) by ``resume()``, which continues the
    instance's last run and finds its checkpoint itself."""
    wf = _steplog_workflow(store, n, max_supersteps=n + 10)

    async def work() -> tuple[float | None, float, int | None, list[Any], int | None]:
        start = time.perf_counter()
        found: float | None = None
        last: int | None = None
        if by_checkpoint:
            checkpoints = wf.checkpoints()
            found = time.perf_counter()
            last = checkpoints[-1].index
            stream = wf.run(checkpoint_id=checkpoints[-1].checkpoint_id, stream=True)
        else:
            stream = wf.resume(stream=True)
        first, index, outputs = await _first_superstep(stream)
        return (None if found is None else found - start), first - start, index, outputs, last

    find, total, index, outputs, last = _clocked(work)
    if by_checkpoint:
        expect(last, n - TAIL, "steplog: index of the last checkpoint")
    _check_end("steplog", n, index, outputs)
    expect(dict(wf.committed_state()), {"a": n - 1, "b": n - 1}, "steplog: state after resume")
    return _measurement(total, find, split=by_checkpoint)


def _copy_log(source: Path, target: EventStore) -> None:
    """Append the cached log's events, as stored, into ``target`` (off the clock)."""
    src = open_store(f"sqlite:///{source}", create=False)
    try:
        events = src.read(INSTANCE)
    finally:
        src.close()
    for i in range(0, len(events), COPY_BATCH):
        target.append(INSTANCE, events[i : i + COPY_BATCH], expected_version=i)


def _steplog_sqlite(cfg: Config, large: bool, *, by_checkpoint: bool = True) -> Measurement:
    steps = _size(cfg, large)
    history = _steplog_history(cfg, steps)
    path = cfg.workdir / f"resume-steplog-{uuid.uuid4().hex[:8]}.db"
    shutil.copyfile(history, path)
    try:
        store = open_store(f"sqlite:///{path}")
        try:
            return _steplog_resume(cfg, store, steps + TAIL, by_checkpoint=by_checkpoint)
        finally:
            store.close()
    finally:
        remove_sqlite(path)


def _steplog_memory(cfg: Config, large: bool) -> Measurement:
    steps = _size(cfg, large)
    history = _steplog_history(cfg, steps)
    store = open_store("memory://")
    try:
        _copy_log(history, store)
        return _steplog_resume(cfg, store, steps + TAIL)
    finally:
        store.close()


def _steplog_postgres(cfg: Config, large: bool) -> Measurement:
    steps = _size(cfg, large)
    history = _steplog_history(cfg, steps)
    with fresh_schema(cfg, "resume") as schema:
        url = url_with_query(cfg.pg_url, schema=schema)
        loader = open_store(url)
        try:
            _copy_log(history, loader)
        finally:
            loader.close()
        store = open_store(url)
        try:
            return _steplog_resume(cfg, store, steps + TAIL)
        finally:
            store.close()


# -- Agent Framework ----------------------------------------------------------------------------


def _af_history(cfg: Config, steps: int) -> tuple[Path, str]:
    """The checkpoint directory of one ``FileCheckpointStorage`` run of the loop stopped by
    ``max_iterations`` after ``steps``, and the id of its latest checkpoint.

    The cache entry is a folder: ``checkpoints/`` (the storage's directory, nothing else in it,
    as ``get_latest`` reads every ``*.json`` there) and ``meta.json``.
    """
    af = bench_extra("_af_graphs")

    def make(entry: Path) -> None:
        storage = af.FileCheckpointStorage(entry / "checkpoints")
        wf = af.resumable_loop_workflow(steps + TAIL, steps, storage)

        async def run() -> None:
            try:
                async for _ in wf.run(0, stream=True):
                    pass
            except af.WorkflowConvergenceException:
                return
            raise RuntimeError("the Agent Framework history run did not stop at max_iterations")

        asyncio.run(run())
        latest = asyncio.run(storage.get_latest(workflow_name=af.RESUME_WORKFLOW_NAME))
        expect(latest.iteration_count, steps, "agent framework history: latest checkpoint")
        files = len(os.listdir(entry / "checkpoints"))
        (entry / "meta.json").write_text(
            json.dumps({"latest": latest.checkpoint_id, "files": files})
        )

    key = _digest(
        _versions("agent-framework-core"), Path(str(af.__file__)).read_bytes(), str(steps)
    )
    entry = _cached(cfg, f"resume-af-s{steps}", key, "", make)
    meta = json.loads((entry / "meta.json").read_text())
    path = entry / "checkpoints"
    expect(len(os.listdir(path)), meta["files"], "agent framework history: checkpoint files")
    return path, str(meta["latest"])


def _af_case(cfg: Config, large: bool, known: bool) -> Measurement:
    af = bench_extra("_af_graphs")
    steps = _size(cfg, large)
    n = steps + TAIL
    path, latest_id = _af_history(cfg, steps)
    before = set(os.listdir(path))
    storage = af.FileCheckpointStorage(path)
    wf = af.resumable_loop_workflow(n, n + 10, storage)

    async def work() -> tuple[float | None, float, int | None, list[Any]]:
        start = time.perf_counter()
        found: float | None = None
        if known:
            checkpoint_id = latest_id
        else:
            latest = await storage.get_latest(workflow_name=af.RESUME_WORKFLOW_NAME)
            found = time.perf_counter()
            expect(latest.checkpoint_id, latest_id, "agent framework: the latest checkpoint")
            checkpoint_id = latest.checkpoint_id
        stream = wf.run(checkpoint_id=checkpoint_id, stream=True)
        first, index, outputs = await _first_superstep(stream)
        return (None if found is None else found - start), first - start, index, outputs

    try:
        find, total, index, outputs = _clocked(work)
    finally:
        for name in set(os.listdir(path)) - before:  # the resumed run's own checkpoints
            (path / name).unlink()
    expect(index, n - TAIL + 1, "agent framework: iteration of the resumed run's first superstep")
    expect(
        outputs,
        [{"count": n, "state": {"a": n - 1, "b": n - 1}}],
        "agent framework: the resumed run's outputs",
    )
    return _measurement(total, find)


# -- LangGraph ----------------------------------------------------------------------------------


def _lg_saver(lg: Any, path: Path) -> tuple[sqlite3.Connection, Any]:
    conn = sqlite3.connect(path, check_same_thread=False)
    saver = lg.SqliteSaver(conn)
    saver.setup()
    conn.commit()
    return conn, saver


def _lg_history(cfg: Config, steps: int) -> Path:
    """A SQLite checkpointer file of one thread of the loop stopped by ``recursion_limit``
    after ``steps`` steps (default durability, ``async``)."""
    lg = bench_extra("_lg_graphs")

    def make(path: Path) -> None:
        conn, saver = _lg_saver(lg, path)
        try:
            graph = lg.loop_graph(steps + TAIL, saver)
            config = {"recursion_limit": steps, "configurable": {"thread_id": THREAD}}
            try:
                graph.invoke({"count": 0, "a": -1, "b": -1}, config)
            except lg.GraphRecursionError:
                pass
            else:
                raise RuntimeError("the LangGraph history run did not stop at recursion_limit")
            saved = graph.get_state(config).values
            expect(saved["count"], steps, "langgraph history: checkpointed count")
        finally:
            conn.close()
        sqlite_bytes(path)

    key = _digest(
        _versions("langgraph", "langgraph-checkpoint", "langgraph-checkpoint-sqlite"),
        Path(str(lg.__file__)).read_bytes(),
        str(steps),
    )
    return _cached(cfg, f"resume-lg-s{steps}", key, ".db", make)


def _lg_case(cfg: Config, large: bool) -> Measurement:
    lg = bench_extra("_lg_graphs")
    steps = _size(cfg, large)
    n = steps + TAIL
    history = _lg_history(cfg, steps)
    path = cfg.workdir / f"resume-lg-{uuid.uuid4().hex[:8]}.db"
    shutil.copyfile(history, path)
    conn = sqlite3.connect(path, check_same_thread=False)
    try:
        graph = lg.loop_graph(n, lg.SqliteSaver(conn))
        config = {"recursion_limit": TAIL + 10, "configurable": {"thread_id": THREAD}}
        gc.collect()
        start = time.perf_counter()
        tasks = graph.stream(None, config, stream_mode="tasks")
        first_task = next(tasks)
        total = time.perf_counter() - start
        for _ in tasks:
            pass
        expect(first_task.get("input", {}).get("count"), steps, "langgraph: first task's input")
        expect("result" in first_task, False, "langgraph: first event is a task's start")
        expect(
            dict(graph.get_state(config).values),
            {"count": n, "a": n - 1, "b": n - 1},
            "langgraph: state after resume",
        )
    finally:
        conn.close()
        remove_sqlite(path)
    return _measurement(total, split=False)


# -- the two benchmarks -------------------------------------------------------------------------


def _benchmark(large: bool) -> Benchmark:
    size = "100,000" if large else "1,000"

    def case(name: str, fn: Callable[[Config, bool], Measurement], steplog: bool) -> Case:
        return Case(name, lambda cfg: fn(cfg, large), steplog=steplog)

    return Benchmark(
        name="resume",
        title=f"6{'b' if large else 'a'}. Resume latency after {size} supersteps of history",
        description=(
            "Time from asking to continue a run from its last checkpoint to the first new "
            "superstep starting, with a new store and workflow object (finding the last "
            "checkpoint included, except in the 'id known' case). find ms: finding the "
            "checkpoint (steplog checkpoints(), Agent Framework get_latest); start ms: from "
            "there to the first superstep. LangGraph finds the thread's latest checkpoint inside "
            "stream(None, config). Histories: the loop stopped by its superstep limit (smoke: "
            "20 and 40 supersteps)."
        ),
        metric="ms to first superstep",
        higher_is_better=False,
        baseline=AF_FILE,
        extra_columns=[("find_ms", "find ms"), ("start_ms", "start ms")],
        # One run per case at 100,000: a steplog resume there takes a minute (see the docs).
        max_repeat=1 if large else None,
        cases=[
            case(SL_SQLITE, _steplog_sqlite, True),
            case(
                "steplog sqlite, resume() of the last run",
                lambda cfg, lg: _steplog_sqlite(cfg, lg, by_checkpoint=False),
                True,
            ),
            case("steplog memory", _steplog_memory, True),
            case("steplog postgres", _steplog_postgres, True),
            case(AF_FILE, lambda cfg, lg: _af_case(cfg, lg, known=False), False),
            case(AF_KNOWN, lambda cfg, lg: _af_case(cfg, lg, known=True), False),
            case(LG_SQLITE, _lg_case, False),
        ],
    )


BENCHMARK_SMALL = _benchmark(large=False)
BENCHMARK_LARGE = _benchmark(large=True)
