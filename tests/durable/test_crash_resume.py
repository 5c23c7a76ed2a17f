"""A run killed with SIGKILL, resumed in a new process, ends exactly as an uninterrupted run.

Each case starts ``crash_worker`` in a process of its own, which kills itself at a chosen point of
a chosen superstep: inside a handler (before its first write, between two writes, after its last
one), or around the append of the batch that holds the superstep's commit marker (before it, inside
its database transaction before COMMIT, right after it landed). Another new process then resumes
the instance (``wf.resume()``). The result (status, supersteps, outputs) and the committed state
must equal an uninterrupted run's, computed in this process on a memory store; and the log must
show what happened: the killed superstep aborted as ``crashed``, the continuation naming the killed
run and its last checkpoint, one marker per superstep, and no write of an aborted superstep
counting.

Every combination of store (SQLite, PostgreSQL), durability ("superstep", "write") and kill point
is killed at five or six supersteps (``KILLED_IN``, ``MARKER_SUPERSTEPS``), ``REPEATS`` times each:
132 kills by default, plus one through the worker's command line per store. The processes are
forked from a fork server that has imported the worker once, ``PARALLEL`` cases at a time (the
cases wait on fsync and the server more than on the CPU).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import multiprocessing.connection
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kernel import EventBase, open_store
from tests.durable import crash_worker
from tests.durable.crash_worker import (
    EXIT_NOT_REACHED,
    HANDLER_POINTS,
    POINTS,
    SUPERSTEPS,
    uninterrupted,
)

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
REPEATS = int(os.environ.get("STEPLOG_CRASH_REPEATS", "1"))
"""How many times each (store, durability, point, superstep) is killed and resumed."""
PARALLEL = int(os.environ.get("STEPLOG_CRASH_PARALLEL", "4"))
"""Cases run at once (each a worker process, then a resuming process)."""
TIMEOUT = 60.0
"""Seconds a worker or resumer may take before the case fails."""

PRELOAD = ["tests.durable.crash_worker", "kernel._store._sqlite", "kernel._store._postgres"]
"""What the fork server imports (``open_store`` imports an adapter when it is first used)."""

KILLED_IN = {1: "dispatch", 2: "right", 3: "right2", 4: "join", 7: "right2", 12: "join"}
"""Handler kill points: superstep -> the executor that dies in it. Superstep 1 has no checkpoint
before it; in 2, ``right`` dies after its sibling ``left`` finished; in 3 the fan-in holds
``left``'s message; 4 is the fan-in's target; 7 is in the loop's second round; 12 is the last."""

MARKER_SUPERSTEPS = {
    "before_marker_append": (1, 3, 4, 8, 12),
    "inside_marker_transaction": (1, 3, 4, 8, 12),
    "after_marker_append": (1, 3, 4, 8, 11),  # after 12's marker the run is over
}
"""Store kill points: the supersteps whose commit batch the worker dies around."""


def case_supersteps(point: str) -> tuple[int, ...]:
    return tuple(KILLED_IN) if point in HANDLER_POINTS else MARKER_SUPERSTEPS[point]


@dataclass(frozen=True)
class Case:
    """One kill: where, and on which store and instance."""

    url: str
    instance_id: str
    durability: str
    point: str
    superstep: int

    @property
    def executor_id(self) -> str | None:
        return KILLED_IN[self.superstep] if self.point in HANDLER_POINTS else None

    @property
    def marker_landed(self) -> bool:
        """Whether the killed superstep's commit marker was in the log when the process died."""
        return self.point == "after_marker_append"

    def __str__(self) -> str:
        return f"{self.point}@{self.superstep} ({self.durability}, {self.instance_id})"


@dataclass
class Outcome:
    """How a case's two processes ended: the worker's exit code and what it said if it did not
    die; the resumer's report (None if the worker did not die by SIGKILL)."""

    case: Case
    exitcode: int | None
    said: str
    report: dict[str, Any] | None


def forkserver() -> Any:
    """Processes forked from a server that has imported the worker module and the store adapters
    once (no store is opened there): each case's two processes are real, separate processes,
    without paying for the imports again."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


class Launcher:
    """Runs the cases' processes, ``PARALLEL`` cases at a time, all from the calling thread
    (``multiprocessing`` reaps processes of one thread safely, not of several at once): each
    case's worker, then, once it has died of SIGKILL, its resumer."""

    def __init__(self, where: Path) -> None:
        self.context = forkserver()
        self.where = where
        self.running: dict[Any, tuple[Case, str, Any]] = {}  # sentinel -> (case, stage, process)
        self.exitcodes: dict[Case, int | None] = {}

    def run(self, cases: list[Case]) -> list[Outcome]:
        waiting = list(reversed(cases))
        outcomes: dict[Case, Outcome] = {}
        try:
            while waiting or self.running:
                while waiting and len(self.running) < PARALLEL:
                    self.crash(waiting.pop())
                ready = multiprocessing.connection.wait(list(self.running), TIMEOUT)
                if not ready:
                    stuck = ", ".join(
                        f"{stage} of {case}" for case, stage, _ in self.running.values()
                    )
                    pytest.fail(f"still running after {TIMEOUT} s: {stuck}")
                for sentinel in ready:
                    case, stage, process = self.running.pop(sentinel)
                    process.join()
                    outcome = self.finished(case, stage, process.exitcode)
                    if outcome is not None:
                        outcomes[case] = outcome
        finally:
            for _, _, process in self.running.values():
                process.kill()
                process.join()
        return [outcomes[case] for case in cases]

    def start(self, case: Case, stage: str, target: Callable[..., None], *args: Any) -> None:
        process = self.context.Process(target=target, args=args, name=f"{stage} {case}")
        process.start()
        self.running[process.sentinel] = (case, stage, process)

    def said(self, case: Case) -> Path:
        return self.where / f"{case.instance_id}.said"

    def report(self, case: Case) -> Path:
        return self.where / f"{case.instance_id}.json"

    def crash(self, case: Case) -> None:
        args = (case.url, case.instance_id, case.durability, case.point, case.superstep)
        self.start(
            case, "crash", crash_worker.crash_child, str(self.said(case)), *args, case.executor_id
        )

    def finished(self, case: Case, stage: str, exitcode: int | None) -> Outcome | None:
        """The case's outcome once its last process ended; None while it has one to run."""
        said = self.said(case)
        words = said.read_text() if said.exists() else ""
        if stage == "crash":
            self.exitcodes[case] = exitcode
            if exitcode != -signal.SIGKILL:
                return Outcome(case, exitcode, words, None)
            args = (str(self.report(case)), case.url, case.instance_id, case.durability)
            self.start(case, "resume", crash_worker.resume_child, *args)
            return None
        report = self.report(case)
        found = json.loads(report.read_text()) if report.exists() else {"error": f"exit {exitcode}"}
        return Outcome(case, self.exitcodes[case], words, found)


# -- reading the log ----------------------------------------------------------------------------


def replayed_state(events: list[Any]) -> dict[str, Any]:
    """The committed state by the rule stated plainly, independently of the kernel's fold: the
    writes of supersteps with a ``SuperstepCommitted`` marker, in log order; nothing else."""
    committed = {e.superstep_id for e in events if e.type == "superstep_committed"}
    state: dict[str, Any] = {}
    for event in events:
        if event.type == "state_staged" and event.superstep_id in committed:
            if event.op == "set":
                state[event.key] = event.value
            else:
                state.pop(event.key, None)
    return state


def check_log(case: Case, events: list[Any]) -> None:
    """What the log of a killed and resumed run must say."""

    def of(kind: str) -> list[Any]:
        return [e for e in events if e.type == kind]

    started = of("run_started")
    assert len(started) == 2, f"{case}: runs {[e.run_id for e in started]}"
    killed, resumed = started
    index = {e.superstep_id: e.index for e in of("superstep_started")}
    markers = of("superstep_committed") + of("superstep_aborted")

    # Exactly one marker per superstep; every index committed once, in order.
    assert sorted(e.superstep_id for e in markers) == sorted(index), case
    committed = [e for e in events if e.type == "superstep_committed"]
    assert [index[e.superstep_id] for e in committed] == list(range(1, SUPERSTEPS + 1)), case

    # The superstep open when the process died, and only it, aborted as crashed; then the run
    # closed as crashed by the continuation, which starts right after. (In "write" durability a
    # process killed right after its marker landed had not opened the next superstep yet.)
    aborted = of("superstep_aborted")
    (closed,) = of("run_abandoned")
    assert (closed.reason, closed.run_id, closed.closed_by) == (
        "crashed",
        killed.run_id,
        resumed.run_id,
    ), case
    if case.marker_landed and case.durability.startswith("write"):
        assert (aborted, closed.superstep_id) == ([], None), case
        assert resumed.position == closed.position + 1, case
    else:
        (step,) = aborted
        open_index = case.superstep + 1 if case.marker_landed else case.superstep
        assert (index[step.superstep_id], step.reason, step.run_id) == (
            open_index,
            "crashed",
            killed.run_id,
        ), case
        assert closed.superstep_id == step.superstep_id, case
        closing = [step.position, closed.position, resumed.position]
        assert closing == list(range(step.position, step.position + 3)), case

    # The continuation goes on from the killed run's last committed superstep.
    last_before = case.superstep if case.marker_landed else case.superstep - 1
    checkpoint = next(
        (e.superstep_id for e in committed if index[e.superstep_id] == last_before), None
    )
    assert (resumed.continues, resumed.checkpoint) == (killed.run_id, checkpoint), case
    assert [index[e.superstep_id] for e in committed if e.run_id == killed.run_id] == list(
        range(1, last_before + 1)
    ), case

    # What reached the log of the aborted superstep before the kill.
    if not aborted:
        return
    inert = [e for e in of("state_staged") if e.superstep_id == aborted[0].superstep_id]
    if case.durability.startswith("superstep") or case.marker_landed:
        assert inert == [], f"{case}: {len(inert)} writes of the aborted superstep in the log"
    elif case.point in ("before_marker_append", "inside_marker_transaction"):
        # "write": every write of the superstep was in before its marker was due.
        retried = next(e for e in committed if index[e.superstep_id] == case.superstep)
        again = [e for e in of("state_staged") if e.superstep_id == retried.superstep_id]
        assert [(e.key, e.value) for e in inert] == [(e.key, e.value) for e in again], case
    else:
        own = [e for e in inert if e.executor_id == case.executor_id]
        assert len(own) == HANDLER_POINTS.index(case.point), case


def read_log(url: str, instance_id: str, durability: str) -> tuple[list[EventBase], Any, Any]:
    """The instance's events, its committed state as the kernel folds it, and the replay's
    (decoded the same way), read in this process."""
    store = open_store(url, create=False)
    try:
        events = store.read(instance_id)
        state = crash_worker.crashy(store, instance_id, durability).committed_state()
        replayed = {k: store.codec.decode(v) for k, v in replayed_state(events).items()}
        return events, state, replayed
    finally:
        store.close()


# -- the tests ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    """An uninterrupted run on a memory store, as the resumer reports it (the same in both
    durability modes). Its log pins the workflow's shape the cases rely on: ``left`` runs a
    superstep before ``right2``, so the fan-in holds its message across superstep 3."""
    store = open_store("memory://")
    expected: dict[str, Any] = asyncio.run(uninterrupted(store, "reference", "superstep"))
    assert asyncio.run(uninterrupted(open_store("memory://"), "reference", "write")) == expected
    assert expected["status"] == "completed"
    assert expected["supersteps"] == SUPERSTEPS
    events: list[Any] = store.read("reference")
    index = {e.superstep_id: e.index for e in events if e.type == "superstep_started"}
    ran: dict[int, list[str]] = {}
    for event in events:
        if event.type == "executor_invoked":
            ran.setdefault(index[event.superstep_id], []).append(event.executor_id)
    a_round = [["dispatch"], ["left", "right"], ["right2"], ["join"]]
    assert list(ran.values()) == a_round * crash_worker.ROUNDS
    as_json: dict[str, Any] = json.loads(json.dumps(expected))
    return as_json  # as it comes back from the resumer's JSON


STORES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=STORES)
def store_url_for(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], str]:
    """A store URL per instance: a SQLite file each, or one PostgreSQL schema shared by all."""
    if request.param == "sqlite":
        return lambda instance_id: f"sqlite:///{tmp_path / instance_id}.db"
    url: str = request.getfixturevalue("postgres_url")
    return lambda instance_id: url


@pytest.mark.parametrize(
    # "+snapshots": a snapshot at every committed superstep, so every kill point has one
    "durability",
    ["superstep", "write", "superstep+snapshots", "write+snapshots"],
)
@pytest.mark.parametrize("point", POINTS)
def test_a_run_killed_at_any_point_resumes_in_a_new_process_to_the_uninterrupted_result(
    store_url_for: Callable[[str], str],
    durability: str,
    point: str,
    reference: dict[str, Any],
    tmp_path: Path,
) -> None:
    cases = [
        Case(store_url_for(name), name, durability, point, superstep)
        for superstep in case_supersteps(point)
        for repeat in range(REPEATS)
        for name in [f"{point}-{superstep}-{durability}-{repeat}"]
    ]
    for outcome in Launcher(tmp_path).run(cases):
        case = outcome.case
        assert outcome.exitcode == -signal.SIGKILL, (
            f"{case}: worker ended {outcome.exitcode}: {outcome.said}"
        )
        assert outcome.report is not None
        assert "error" not in outcome.report, f"{case}: resume failed:\n{outcome.report['error']}"
        assert outcome.report == reference, case
        events, state, replayed = read_log(case.url, case.instance_id, case.durability)
        check_log(case, events)
        # No write of an aborted superstep counts: the kernel's committed state is the replay of
        # the committed supersteps' writes alone, and the uninterrupted run's.
        assert state == replayed == reference["state"], case


def test_the_worker_and_resumer_run_as_scripts(
    store_url_for: Callable[[str], str], reference: dict[str, Any]
) -> None:
    """The worker's command line, as a person would run it: killed inside the transaction of
    superstep 3's commit, in "write" durability, and resumed by a second command."""
    case = Case(store_url_for("script"), "script", "write", "inside_marker_transaction", 3)
    killed = script("crash", case.url, case.instance_id, case.durability, case.point, "3")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    resumed = script("resume", case.url, case.instance_id, case.durability)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout) == reference
    check_log(case, read_log(case.url, case.instance_id, case.durability)[0])


def test_a_kill_point_the_run_never_reaches_is_reported_not_passed(tmp_path: Path) -> None:
    """The harness can fail: a worker whose kill point does not exist ends the run normally and
    exits ``EXIT_NOT_REACHED``, and no resumer is started."""
    url = f"sqlite:///{tmp_path / 'never.db'}"
    case = Case(url, "never", "superstep", "before_marker_append", SUPERSTEPS + 1)
    (outcome,) = Launcher(tmp_path).run([case])
    assert (outcome.exitcode, outcome.report) == (EXIT_NOT_REACHED, None)
    assert "never reached" in outcome.said


def script(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m tests.durable.crash_worker ARGS`` from the repository root."""
    return subprocess.run(
        [sys.executable, "-m", "tests.durable.crash_worker", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
