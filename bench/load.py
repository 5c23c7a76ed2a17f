"""Load test: writer processes, a follower and a verify loop on one store, then every check.

    python -m bench.load --seconds 60                  # SQLite, then PostgreSQL
    python -m bench.load --seconds 5 --backend sqlite  # one backend
    python -m bench.load --workers 4 --pg postgresql://postgres@127.0.0.1:5432/test

For each backend (a fresh SQLite file in a temporary directory; a fresh PostgreSQL schema, dropped
afterwards), for ``--seconds``:

* ``--workers`` writer processes (``bench._load_worker``) run fresh instances, two at a time each,
  and report what they wrote: each instance's stream version, supersteps committed and aborted,
  and the committed state their own model expects;
* one follower process, ``steplog project --follow`` (every view), keeps the views caught up;
* this process samples the log's last position and the views' positions every 0.1 s, until the
  follower has caught up after the writers stopped (follower lag: how long until the views
  reach a position the log had), and runs a verify loop: ``verify`` of each view in turn (every
  third turn after a ``rebuild`` of it, swapped in under the follower's feet) and, once per
  round of the views, ``verify_chain()`` when the store has it.

Then the follower is given time to catch up and is stopped (SIGTERM), and everything is checked:
every reported instance's stream holds positions 1..version exactly once, with one marker per
superstep as reported and no instance nobody reported; the global log holds each event exactly
once; every view equals a rebuild (``verify``); the ``state`` view equals each worker's model. A
failed check, a verify that differs, a worker error, a follower that died or wrote anything but
"retrying" to stderr, or any other exception is an error. Exit status 1 if any backend had one.

Every wait is bounded. A writer has its own watchdog (``bench._load_worker.HANG_GRACE``: it
prints its stacks and exits) and is killed if it is still running ``WRITER_GRACE`` s after
``--seconds``; the follower is given ``SETTLE`` s to catch up and ``STOP_GRACE`` s to stop, and
exits by itself (with its stacks) ``budget(seconds)`` after it started; each is an error naming
the process, with its stderr. Writers report through files, never pipes (a 60 s run's report
overflows a pipe's buffer: the writer then blocks on its last write and never exits, which is
how the first PostgreSQL run of 60 s hung). The command line, finally, prints its own stacks and
exits if it is still running after the sum of the budgets.

``run_load(url, seconds=...)`` does one backend and returns a ``LoadReport``;
``tests/projections/test_contention.py`` runs it for a few seconds per backend.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._core import DEFAULT_PG_URL
from bench._db import pg_connect, pg_reachable, url_with_query
from bench._load_worker import HANG_GRACE
from kernel import EventStore, open_store
from projections import VIEW_NAMES, Projector

__all__ = ["LoadReport", "main", "run_load"]

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_EVERY = 0.1
"""Seconds between samples of the log's and the views' positions."""
SETTLE = 120.0
"""Seconds the follower is given, after the writers stop, to reach the end of the log."""
WRITER_GRACE = HANG_GRACE + 30.0
"""Seconds past ``--seconds`` the writers are waited for (their own watchdog fires before)."""
STOP_GRACE = 60.0
"""Seconds the follower (and the sampler thread) are given to stop."""
CHECK_GRACE = 600.0
"""Seconds the final checks may take (a follower outlives the run by no more than this)."""
RETRYING = "steplog: retrying in"
"""How the follower's stderr lines about contention begin (``steplog project --follow``)."""
_FOLLOW = (
    "import faulthandler, sys; faulthandler.dump_traceback_later(float(sys.argv[1]), exit=True); "
    "from projections.cli import main; sys.exit(main(sys.argv[2:]))"
)
"""The follower: ``steplog project --follow``, which prints its stacks and exits if it is still
running ``budget(seconds)`` after it started (the parent stops it long before)."""


@dataclass
class LoadReport:
    """What one backend's load run did and found. ``ok`` when ``errors`` is empty."""

    backend: str
    seconds: float
    workers: int
    instances: int = 0
    events: int = 0
    write_seconds: float = 0.0
    lags: list[float] = field(default_factory=list)
    verify_passes: int = 0
    rebuilds: int = 0
    chain_checks: int = 0
    follower_retries: int = 0
    settle_seconds: float = 0.0
    """How long the follower took, after the last writer stopped, to reach the end of the log."""
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def events_per_second(self) -> float:
        return self.events / self.write_seconds if self.write_seconds else 0.0

    def lag(self, quantile: float) -> float:
        """The follower's lag (seconds) at ``quantile`` of the samples (0.5: median, 1: max)."""
        if not self.lags:
            return 0.0
        ordered = sorted(self.lags)
        return ordered[min(int(quantile * len(ordered)), len(ordered) - 1)]


def run_load(url: str, *, seconds: float, workers: int = 3, backend: str = "") -> LoadReport:
    """Run the load on the (empty) store at ``url`` for ``seconds``; see the module docstring.

    Bounded: it returns within about ``budget(seconds)`` seconds plus the final checks, whatever
    the processes do (a writer or a follower that hangs is an error, with its stacks)."""
    report = LoadReport(backend or url.split(":", 1)[0], seconds, workers)
    with open_store(url) as store:  # creates the tables before anyone else opens the store
        Projector(store).catch_up()  # and the views' tables
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    with tempfile.TemporaryDirectory(prefix="steplog-load-") as scratch:
        follower_err = Path(scratch, "follower.err")
        follow = [sys.executable, "-c", _FOLLOW, str(budget(seconds))]
        with follower_err.open("wb") as err:
            follower = subprocess.Popen(
                [*follow, "--store", url, "project", "--follow"],
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=env,
                cwd=ROOT,
            )
        writers = [
            _Writer.start(url, f"w{n}", seconds, n, Path(scratch), env) for n in range(workers)
        ]
        deadline = time.monotonic() + seconds + WRITER_GRACE
        try:
            with open_store(url) as store:
                sampler = _Sampler(store)
                try:
                    _watch(store, report, writers, follower, deadline)
                    expected = _collect(writers, report, deadline)
                    _settle(store, report, follower)
                finally:
                    sampler.stop(report)
                _stop(follower, follower_err, report)
                _check(store, expected, report)
        finally:
            for process in [*(w.process for w in writers), follower]:
                if process.poll() is None:
                    process.kill()
                    process.wait()
    return report


def budget(seconds: float) -> float:
    """Seconds after which a load run of ``seconds`` is taken to hang (a process's own limit)."""
    return seconds + WRITER_GRACE + SETTLE + STOP_GRACE + CHECK_GRACE


@dataclass
class _Writer:
    """One writer process; it writes its report to ``out`` (never to a pipe: a report of a long
    run is larger than a pipe's buffer, and a child blocked writing it would never exit)."""

    tag: str
    process: subprocess.Popen[bytes]
    out: Path
    err: Path

    @classmethod
    def start(
        cls, url: str, tag: str, seconds: float, seed: int, scratch: Path, env: dict[str, str]
    ) -> _Writer:
        out, err = scratch / f"{tag}.json", scratch / f"{tag}.err"
        with err.open("wb") as stderr:
            command = [sys.executable, "-m", "bench._load_worker", url, tag, str(seconds)]
            process = subprocess.Popen(
                [*command, str(seed), str(out)],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env=env,
                cwd=ROOT,
            )
        return cls(tag, process, out, err)

    def stderr_tail(self, size: int = 1500) -> str:
        return self.err.read_text(errors="replace").strip()[-size:]


def _watch(
    store: EventStore,
    report: LoadReport,
    writers: list[_Writer],
    follower: subprocess.Popen[bytes],
    deadline: float,
) -> None:
    """While the writers run (until ``deadline`` at most): the verify loop."""
    projector = Projector(store)
    views = list(VIEW_NAMES)
    turn = 0
    while any(w.process.poll() is None for w in writers) and time.monotonic() < deadline:
        if follower.poll() is not None:
            report.errors.append(f"the follower exited with status {follower.returncode}")
            break
        name = views[turn % len(views)]
        turn += 1
        try:
            if turn % 3 == 0:
                projector.rebuild(name)
                report.rebuilds += 1
            verdict = projector.verify(name)
            if verdict.ok:
                report.verify_passes += 1
            else:
                report.errors.append(f"verify {name} differs under load: {verdict}")
            checker = getattr(store, "verify_chain", None)
            if checker is not None and turn % len(views) == 0:
                chain = checker()
                report.chain_checks += 1
                if not chain.ok:
                    report.errors.append(f"verify_chain under load: {chain}")
        except Exception as error:
            report.errors.append(f"verify loop: {type(error).__name__}: {error}")


class _Sampler:
    """Samples the log's last position, then the views' lowest, every ``SAMPLE_EVERY`` s in a
    thread (which shares the interpreter with the verify loop, so samples can be further apart),
    from the writers' start until the follower has caught up (``stop``)."""

    def __init__(self, store: EventStore) -> None:
        self.samples: list[tuple[float, int, int]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(store,), daemon=True)
        self.thread.start()

    def _run(self, store: EventStore) -> None:
        projector = Projector(store)
        while not self.done.wait(SAMPLE_EVERY):
            log = store.last_position()
            views = min(projector.position(name) for name in VIEW_NAMES)
            self.samples.append((time.monotonic(), log, views))

    def stop(self, report: LoadReport) -> None:
        self.done.set()
        self.thread.join(timeout=STOP_GRACE)
        if self.thread.is_alive():
            report.errors.append(f"the position sampler did not stop within {STOP_GRACE:g} s")
        report.lags += _lags(list(self.samples))


def _lags(samples: list[tuple[float, int, int]]) -> list[float]:
    """For each sample, the seconds until a later sample's views reached its log position (a
    sample the views never reached is left out: then ``_settle`` reports an error)."""
    lags = []
    for i, (at, log, _) in enumerate(samples):
        reached = next((t for t, _, views in samples[i:] if views >= log), None)
        if reached is not None:
            lags.append(reached - at)
    return lags


def _collect(writers: list[_Writer], report: LoadReport, deadline: float) -> dict[str, Any]:
    """Each writer's report, waiting for it until ``deadline``; a writer still running then is
    killed and is an error, with the stacks it printed (its own watchdog fires before)."""
    expected: dict[str, Any] = {}
    for writer in writers:
        try:
            writer.process.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            writer.process.kill()
            writer.process.wait()
            report.errors.append(
                f"writer {writer.tag} did not finish {WRITER_GRACE:g} s after its "
                f"{report.seconds:g} s and was killed; stderr: {writer.stderr_tail()}"
            )
            continue
        try:
            result = json.loads(writer.out.read_text())
        except (OSError, json.JSONDecodeError) as error:
            report.errors.append(
                f"writer {writer.tag} exited with status {writer.process.returncode} and no "
                f"report ({type(error).__name__}); stderr: {writer.stderr_tail()}"
            )
            continue
        if result.get("error"):
            report.errors.append(f"writer {writer.tag} failed: {result['error']}")
            continue
        expected.update(result["instances"])
        report.write_seconds = max(report.write_seconds, float(result["elapsed"]))
    report.instances = len(expected)
    report.events = sum(int(i["version"]) for i in expected.values())
    return expected


def _settle(store: EventStore, report: LoadReport, follower: subprocess.Popen[bytes]) -> None:
    """Give the follower time to reach the end of the log (the writers have stopped)."""
    end = store.last_position()
    projector = Projector(store)
    started = time.monotonic()
    while min(projector.position(name) for name in VIEW_NAMES) < end:
        if follower.poll() is not None or time.monotonic() - started > SETTLE:
            report.errors.append(f"the follower did not reach the end of the log in {SETTLE:g} s")
            return
        time.sleep(SAMPLE_EVERY)
    report.settle_seconds = time.monotonic() - started


def _stop(follower: subprocess.Popen[bytes], stderr: Path, report: LoadReport) -> None:
    if follower.poll() is None:
        follower.send_signal(signal.SIGTERM)
    try:
        status = follower.wait(timeout=STOP_GRACE)
    except subprocess.TimeoutExpired:
        report.errors.append(f"the follower did not stop within {STOP_GRACE:g} s of SIGTERM")
        return
    if status != 0:
        report.errors.append(f"the follower exited with status {status}")
    lines = stderr.read_text(errors="replace").splitlines()
    report.follower_retries = sum(line.startswith(RETRYING) for line in lines)
    other = [line for line in lines if line.strip() and not line.startswith(RETRYING)]
    if other:
        report.errors.append(f"the follower wrote to stderr: {other[:5]}")


def _check(store: EventStore, expected: dict[str, Any], report: LoadReport) -> None:
    """Nothing lost, nothing duplicated, every superstep closed once, views equal a rebuild."""
    errors = report.errors
    unknown = sorted(set(store.instances()) - expected.keys())
    if unknown:
        errors.append(f"instances nobody reported: {unknown[:5]}")
    for instance_id, want in expected.items():
        events = store.read(instance_id)
        positions = [e.position for e in events]
        if positions != list(range(1, int(want["version"]) + 1)):
            errors.append(f"{instance_id}: positions {positions[:3]}.. not 1..{want['version']}")
        kinds = Counter(e.type for e in events)
        markers = (kinds["superstep_committed"], kinds["superstep_aborted"])
        if markers != (want["committed"], want["aborted"]):
            errors.append(f"{instance_id}: markers {markers}, reported {want}")
    seen = Counter((r.event.instance_id, r.event.position) for r in store.iter_all())
    duplicated = [key for key, count in seen.items() if count > 1]
    if duplicated:
        errors.append(f"events read more than once in the global log: {duplicated[:5]}")
    if sum(seen.values()) != report.events:
        errors.append(f"the global log holds {sum(seen.values())} events, reported {report.events}")
    projector = Projector(store)
    projector.catch_up()  # nothing to do if the follower reached the end
    for name in VIEW_NAMES:
        verdict = projector.verify(name)
        report.verify_passes += verdict.ok
        if not verdict.ok:
            errors.append(f"view {name} differs from a rebuild: {verdict}")
    for instance_id, want in expected.items():
        if projector.state(instance_id) != want["state"]:
            errors.append(f"{instance_id}: state view {projector.state(instance_id)}, model {want}")
    checker = getattr(store, "verify_chain", None)
    if checker is not None:
        chain = checker()
        report.chain_checks += 1
        if not chain.ok:
            errors.append(f"verify_chain after the load: {chain}")


# -- command line ---------------------------------------------------------------------------------


def _run_backend(backend: str, args: argparse.Namespace) -> LoadReport:
    if backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="steplog-load-db-") as directory:
            url = f"sqlite:///{Path(directory, 'load.db')}"
            return run_load(url, seconds=args.seconds, workers=args.workers, backend="sqlite")
    why = pg_reachable(args.pg)
    if why is not None:
        report = LoadReport("postgresql", args.seconds, args.workers)
        report.errors.append(f"PostgreSQL unreachable at {args.pg}: {why}")
        return report
    schema = f"steplog_load_{uuid.uuid4().hex[:10]}"
    try:
        url = url_with_query(args.pg, schema=schema)
        return run_load(url, seconds=args.seconds, workers=args.workers, backend="postgresql")
    finally:
        with pg_connect(args.pg, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _show(report: LoadReport) -> str:
    return (
        f"{report.backend}: {report.seconds:g} s, {report.workers} writer processes: "
        f"{report.events} events in {report.instances} instances, "
        f"{report.events_per_second:,.0f} events/s written; follower lag median "
        f"{report.lag(0.5):.2f} s, max {report.lag(1.0):.2f} s ({len(report.lags)} samples), "
        f"caught up {report.settle_seconds:.1f} s after the writers stopped, "
        f"{report.follower_retries} follower retries; {report.verify_passes} verify passes, "
        f"{report.rebuilds} rebuilds, "
        f"{report.chain_checks} chain checks; {len(report.errors)} errors"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.load", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the writers run")
    parser.add_argument("--workers", type=int, default=3, help="writer processes")
    parser.add_argument(
        "--backend", choices=["sqlite", "postgresql", "both"], default="both", help="which stores"
    )
    parser.add_argument("--pg", default=DEFAULT_PG_URL, metavar="URL", help="PostgreSQL server")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.workers < 1:
        parser.error("--seconds must be > 0 and --workers >= 1")
    backends = ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]
    # The last resort: every wait below has its own deadline, and each child process its own
    # watchdog; should this process still hang, it prints its stacks and exits (status 1).
    faulthandler.dump_traceback_later(len(backends) * (budget(args.seconds) + 60), exit=True)
    failed = False
    for backend in backends:
        report = _run_backend(backend, args)
        print(_show(report), flush=True)
        for error in report.errors:
            print(f"  error: {error}", flush=True)
        failed = failed or not report.ok
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
