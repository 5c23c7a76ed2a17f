"""Benchmark 6c: reopen and resume against the length of an instance's history (issue 25).

Each case runs in a fresh interpreter (``bench._child``), on a fresh copy of a SQLite log of the
A -> B -> A loop stopped by its superstep limit after ``N`` committed supersteps (the resume
benchmark's cached histories, ``bench/.cache/resume-steplog-s<N>-*.db``), at ``N`` = 20, 1,000,
20,000 and 100,000 (smoke: 4, 10, 20 and 40). The clock starts before ``open_store`` and
includes building the workflow: what a server pays on a request to an instance no process has
open.

* reopen: open the store, build the workflow and run one new message that takes one superstep
  (the message is past the loop's end, so the first executor yields it and the run ends). Checks:
  the output is the message, committed state is still ``a == b == N - 1``.
* resume: open the store, build the workflow and ``resume(stream=True)`` the run stopped by its
  limit, until its first ``superstep_started``; the run then goes on to its end off the clock.
  Checks: the first superstep is ``N + 1``, the output is ``N + 2``, state ``a == b == N + 1``.
* LangGraph's SQLite checkpointer resuming its own history of the same loop at the largest size
  (``graph.stream(None, thread)`` until the first task; the resume benchmark's case, connection
  opened off the clock).
"""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from typing import Any

from bench import resume
from bench._child import run_in_child
from bench._core import Benchmark, Case, Config, Measurement, Target, expect
from bench._db import remove_sqlite

__all__ = ["BENCHMARK", "child_reopen", "child_resume"]

SIZES = (20, 1000, 20_000, 100_000)
SMOKE_SIZES = (4, 10, 20, 40)
BIG_MESSAGE = 10**9
"""The reopen case's new message: past every loop's end, so it takes one superstep."""


def _sizes(cfg: Config) -> tuple[int, ...]:
    return SMOKE_SIZES if cfg.smoke else SIZES


def _label(i: int) -> str:
    return ("20", "1,000", "20,000", "100,000")[i]


def _reopen_name(i: int) -> str:
    return f"steplog sqlite, reopen + 1 superstep, {_label(i)}"


def _resume_name(i: int) -> str:
    return f"steplog sqlite, resume(), {_label(i)}"


LG_NAME = "langgraph sqlite checkpointer, resume, 100,000"


# -- what runs in the child ---------------------------------------------------------------------


def child_reopen(path: str, steps: int) -> dict[str, Any]:
    """Open ``path``, build the loop and run ``BIG_MESSAGE`` (one superstep), timed."""
    from kernel import open_store

    clock = time.perf_counter
    start = clock()
    store = open_store(f"sqlite:///{path}")
    try:
        opened = clock()
        wf = resume._steplog_workflow(store, steps + resume.TAIL, max_supersteps=10)
        result = asyncio.run(wf.run(BIG_MESSAGE))
        end = clock()
        expect(result.get_outputs(), [BIG_MESSAGE], "reopen: outputs of the new run")
        expect(
            dict(wf.committed_state()),
            {"a": steps - 1, "b": steps - 1},
            "reopen: committed state after the new run",
        )
    finally:
        store.close()
    return {"ms": (end - start) * 1000, "open_ms": (opened - start) * 1000}


def child_resume(path: str, steps: int) -> dict[str, Any]:
    """Open ``path``, build the loop and ``resume()`` until the first superstep, timed."""
    from kernel import open_store

    n = steps + resume.TAIL
    clock = time.perf_counter
    start = clock()
    store = open_store(f"sqlite:///{path}")
    try:
        opened = clock()
        wf = resume._steplog_workflow(store, n, max_supersteps=n + 10)

        async def work() -> tuple[float, int | None, list[Any]]:
            return await resume._first_superstep(wf.resume(stream=True))

        first, index, outputs = asyncio.run(work())
        resume._check_end("steplog", n, index, outputs)
        expect(dict(wf.committed_state()), {"a": n - 1, "b": n - 1}, "resume: state after")
    finally:
        store.close()
    return {"ms": (first - start) * 1000, "open_ms": (opened - start) * 1000}


# -- cases --------------------------------------------------------------------------------------


def _child_case(cfg: Config, fn: str, i: int) -> Measurement:
    steps = _sizes(cfg)[i]
    history = resume._steplog_history(cfg, steps)
    path = cfg.workdir / f"reopen-{uuid.uuid4().hex[:8]}.db"
    shutil.copyfile(history, path)
    try:
        result = run_in_child(f"bench.reopen:{fn}", {"path": str(path), "steps": steps})
    finally:
        remove_sqlite(path)
    return Measurement(result["ms"], extra={"open_ms": result["open_ms"]})


def _lg_largest(cfg: Config) -> Measurement:
    return resume._lg_case(cfg, large=True)


def _case(name: str, fn: str, i: int) -> Case:
    return Case(name, lambda cfg: _child_case(cfg, fn, i), steplog=True)


BENCHMARK = Benchmark(
    name="reopen",
    title="6c. Reopen and resume against history (20 to 100,000 supersteps), fresh processes",
    description=(
        "Each case in a fresh interpreter on a copy of the loop's SQLite history stopped by its "
        "superstep limit (smoke: 4, 10, 20, 40 supersteps). ms: from before open_store to the "
        "end of a new one-superstep run (reopen), or to the first superstep_started of "
        "resume(stream=True) (resume); open ms: open_store alone. LangGraph: the resume "
        "benchmark's case at its largest size (connection opened off the clock)."
    ),
    metric="ms",
    higher_is_better=False,
    baseline=_reopen_name(0),
    extra_columns=[("open_ms", "open ms")],
    max_repeat=3,
    cases=[
        *(_case(_reopen_name(i), "child_reopen", i) for i in range(4)),
        *(_case(_resume_name(i), "child_resume", i) for i in range(4)),
        Case(LG_NAME, _lg_largest, steplog=False),
    ],
    targets=[
        Target(
            "reopen + 1 superstep, 20,000 vs 20 <= 3x",
            _reopen_name(2),
            "<=",
            3.0,
            _reopen_name(0),
        ),
        Target("resume, 20,000 vs 20 <= 3x", _resume_name(2), "<=", 3.0, _resume_name(0)),
        Target("resume at 100,000 <= 50 ms", _resume_name(3), "<=", 50.0),
    ],
)
