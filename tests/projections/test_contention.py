"""Views beside writers and beside each other: busy waits, retries, rebuild locks, a load run.

SQLite: a view transaction that writes takes the write lock first (``BEGIN IMMEDIATE``) and so
waits under the store's busy timeout; past it, the error is ``StoreUnavailableError``, which a
follower waits out. Every backend: rebuilds (and verifies) of one view take turns; one that waits
too long says that another rebuild is running. The load test runs writer processes, a
``steplog project --follow`` process and a verify loop, then checks that nothing was lost or
duplicated and that every view equals a rebuild (``bench.load``).

The load test runs ``STEPLOG_LOAD_SECONDS`` seconds per backend (default 2); the long version,
with its figures, is ``python -m bench.load --seconds 60``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from bench.load import LoadReport, _collect, _Writer, run_load
from kernel import ProjectionError, StoreUnavailableError, open_store
from projections import Projector, StateView
from tests.projections.helpers import populate
from tests.projections.logs import fixed_plans
from tests.projections.reference import Reference

ROOT = Path(__file__).resolve().parents[2]
CLI = "import sys; from projections.cli import main; sys.exit(main(sys.argv[1:]))"
SHADOW = f"{StateView().table}__shadow"  # the lock a rebuild of the state view takes


@contextmanager
def write_lock(url: str) -> Iterator[threading.Event]:
    """Hold the SQLite file's write lock from a connection of its own until the yielded event is
    set (or the block ends), as a writer in another process would."""
    path = url.removeprefix("sqlite:///")
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("CREATE TABLE IF NOT EXISTS contention_probe (n INTEGER)")
    release = threading.Event()
    released = threading.Event()

    def hold() -> None:
        release.wait()
        holder.execute("ROLLBACK")
        holder.close()
        released.set()

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        yield release
    finally:
        release.set()
        thread.join()


def _cli(url: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CLI, "--store", url, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


# -- SQLite: view writes wait for the write lock ------------------------------------------------


def test_view_maintenance_waits_for_a_writer_instead_of_failing_at_once(sqlite_url):
    with open_store(sqlite_url) as store:
        logs = populate(store, fixed_plans())
        projector = Projector(store, ["state"])
        projector.catch_up()
        with write_lock(sqlite_url) as release:
            # Released from another thread while the rebuild waits in SQLite's busy handler:
            # a transaction that read first would have failed at once ("database is locked").
            threading.Timer(0.3, release.set).start()
            projector.rebuild("state")
        with write_lock(sqlite_url) as release:
            threading.Timer(0.3, release.set).start()
            assert projector.verify("state").ok
        for instance_id, events in logs.items():
            assert projector.state(instance_id) == Reference(events).state()


def test_a_lock_held_past_the_busy_timeout_is_store_unavailable_and_says_so(sqlite_url):
    with open_store(sqlite_url, lock_timeout=1) as store:
        populate(store, fixed_plans())
        projector = Projector(store, ["state"])
        with write_lock(sqlite_url), pytest.raises(StoreUnavailableError) as caught:
            projector.catch_up()
        assert "database is locked" in str(caught.value)
        assert "another process held a lock" in str(caught.value)
        assert projector.position("state") == 0  # nothing half-done
        projector.catch_up()  # and the view goes on once the lock is gone
        assert projector.position("state") == store.last_position()


def test_a_follower_waits_out_contention_and_catches_up(sqlite_url):
    with open_store(sqlite_url, lock_timeout=1) as store:
        logs = populate(store, fixed_plans())
        projector = Projector(store, ["state", "history"], page_size=4)
        retries: list[tuple[StoreUnavailableError, float]] = []
        retried = threading.Event()
        stop = threading.Event()
        failures: list[BaseException] = []

        def told(error: StoreUnavailableError, delay: float) -> None:
            retries.append((error, delay))
            retried.set()

        def follow() -> None:
            try:
                projector.follow(stop, poll_interval=0.02, on_retry=told)
            except BaseException as error:  # the test fails on any
                failures.append(error)

        with write_lock(sqlite_url):
            follower = threading.Thread(target=follow)
            follower.start()
            assert retried.wait(60), "the follower never met the lock"
        try:
            assert follower.is_alive()
            for _ in range(3000):
                if projector.position("history") == store.last_position():
                    break
                stop.wait(0.02)
        finally:
            stop.set()
            follower.join(30)
        assert not follower.is_alive()
        assert failures == []
        assert all("database is locked" in str(error) for error, _ in retries)
        for instance_id, events in logs.items():
            assert projector.state(instance_id) == Reference(events).state()
        assert projector.verify("history").ok


# -- rebuilds take turns ------------------------------------------------------------------------


def test_a_rebuild_waits_for_another_then_says_that_one_is_running(store_url):
    with open_store(store_url) as store, open_store(store_url) as other:
        if store_url.startswith("memory"):
            other = store  # a memory store is one process's: the second projector shares it
        logs = populate(store, fixed_plans())
        first = Projector(store, ["state"])
        first.catch_up()
        second = Projector(other, ["state"], lock_wait=0.2)
        with first.backend.lock(SHADOW, 5) as held:
            assert held
            with pytest.raises(ProjectionError, match="another rebuild of view 'state' is running"):
                second.rebuild("state")
            assert second.verify("state").ok  # a verify refolds in memory: it takes no lock
        second.rebuild("state")  # free again
        assert second.verify("state").ok
        for instance_id, events in logs.items():
            assert second.state(instance_id) == Reference(events).state()


def test_a_sqlite_lock_file_exists_only_while_the_lock_is_held(sqlite_url):
    # Issue 21: rebuild and verify left ten ``steplog.db.steplog_view_*.lock`` files beside the
    # database. The lock's file is hidden, and removed by its holder when it is done.
    with open_store(sqlite_url) as store:
        backend = Projector(store, ["state"]).backend
        directory = store.path.parent
        before = sorted(p.name for p in directory.iterdir())
        with backend.lock(SHADOW, 5) as held:
            assert held
            during = sorted(set(p.name for p in directory.iterdir()) - set(before))
            assert during == [f".{store.path.name}.{SHADOW}.lock"]
            with backend.lock(SHADOW, 0.05) as again:
                assert not again  # taken: the second holder gives up after its wait
        assert sorted(p.name for p in directory.iterdir()) == before
        # A file left by a holder that died (the OS released its lock) is taken, then removed.
        stale = directory / during[0]
        stale.write_bytes(b"")
        with backend.lock(SHADOW, 5) as held:
            assert held
        assert not stale.exists()


def test_a_waiter_never_holds_a_lock_file_its_holder_removed(sqlite_url):
    # The holder removes the file as it releases it: a waiter that had opened that file must
    # not count it as held, or it and a newcomer (who creates a new file) would both hold it.
    with open_store(sqlite_url) as store:
        backend = Projector(store, ["state"]).backend
        holders: list[int] = []
        most: list[int] = []
        lock = threading.Lock()
        start = threading.Barrier(6)

        def take() -> None:
            start.wait()
            for _ in range(20):
                with backend.lock(SHADOW, 30) as held:
                    assert held
                    with lock:
                        holders.append(1)
                        most.append(len(holders))
                    time.sleep(0.001)
                    with lock:
                        holders.pop()

        threads = [threading.Thread(target=take) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert len(most) == 120
        assert max(most) == 1
        assert not any(p.name.endswith(".lock") for p in store.path.parent.iterdir())


def test_four_rebuild_processes_beside_a_writer_all_succeed(durable_store_url, tmp_path):
    url = durable_store_url
    report = tmp_path / "writer.json"
    with open_store(url) as store:
        populate(store, fixed_plans(4))
        Projector(store, ["state"]).catch_up()
    writer = subprocess.Popen(
        [sys.executable, "-m", "bench._load_worker", url, "writer", "2", "7", str(report)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    commands = [_cli(url, "rebuild", "state") for _ in range(4)] + [_cli(url, "verify", "state")]
    outcomes = [command.communicate(timeout=240) for command in commands]
    written, problems = writer.communicate(timeout=240)
    for command, (out, err) in zip(commands, outcomes, strict=True):
        assert command.returncode == 0, (out, err)
        assert err == ""
    assert sum("rebuilt up to global position" in out for out, _ in outcomes) == 4
    assert writer.returncode == 0, (written, problems)
    assert json.loads(report.read_text())["error"] is None
    with open_store(url) as store:
        projector = Projector(store, ["state"])
        projector.catch_up()
        assert projector.verify("state").ok
        assert not projector.backend.exists(SHADOW)
        for instance_id in store.instances():
            assert projector.state(instance_id) == Reference(store.read(instance_id)).state()


# -- load ---------------------------------------------------------------------------------------


def test_load_nothing_lost_or_duplicated_views_equal_a_rebuild(durable_store_url):
    seconds = float(os.environ.get("STEPLOG_LOAD_SECONDS", "2"))
    report = run_load(durable_store_url, seconds=seconds, workers=2)
    assert report.errors == []
    assert report.instances > 0
    assert report.events > 0
    assert report.verify_passes >= 5  # at least the final verify of every view
    assert report.lags  # the follower was seen to reach the log's positions


def _writer(tmp_path: Path, code: str) -> _Writer:
    """A stand-in writer process running ``code`` (``OUT`` is its report's path)."""
    out, err = tmp_path / "w.json", tmp_path / "w.err"
    with err.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-c", f"OUT = {str(out)!r}\n{code}"], stderr=stderr
        )
    return _Writer("w0", process, out, err)


def test_load_reads_a_writer_report_larger_than_a_pipe_buffer(tmp_path):
    # The first 60 s PostgreSQL run hung: each writer printed its report to a pipe the parent
    # read only once the writer had exited, and a report past the pipe's 64 KiB never got out.
    one = {"version": 3, "committed": 1, "aborted": 0, "state": {"count": 1}}
    big = {f"w0-{n}": one for n in range(9999)}
    code = (
        f"import json; one = {one!r}; big = {{f'w0-{{n}}': one for n in range(9999)}}\n"
        "open(OUT, 'w').write(json.dumps({'instances': big, 'elapsed': 1.0}))"
    )
    report = LoadReport("sqlite", 1.0, 1)
    expected = _collect([_writer(tmp_path, code)], report, time.monotonic() + 60)
    assert report.errors == []
    assert expected == big
    assert report.events == 3 * 9999


def test_load_kills_a_writer_that_hangs_and_says_so(tmp_path):
    writer = _writer(
        tmp_path,
        "import sys, time; print('stuck here', file=sys.stderr, flush=True); time.sleep(600)",
    )
    waited = time.monotonic() + 60
    while "stuck here" not in writer.stderr_tail() and time.monotonic() < waited:
        time.sleep(0.05)  # (until it has started and written its line)
    report = LoadReport("sqlite", 1.0, 1)
    assert _collect([writer], report, time.monotonic() + 0.5) == {}
    assert writer.process.poll() is not None  # killed, not left behind
    (error,) = report.errors
    assert "writer w0 did not finish" in error
    assert "was killed" in error
    assert "stuck here" in error


def test_load_names_a_writer_that_exits_without_a_report(tmp_path):
    writer = _writer(tmp_path, "import sys; print('Traceback: boom', file=sys.stderr); sys.exit(3)")
    report = LoadReport("sqlite", 1.0, 1)
    assert _collect([writer], report, time.monotonic() + 60) == {}
    (error,) = report.errors
    assert "writer w0 exited with status 3 and no report" in error
    assert "Traceback: boom" in error
