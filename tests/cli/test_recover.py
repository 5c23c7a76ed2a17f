"""``steplog recover``: runs left open by dead processes are closed as crashed and reported; a
live run is left alone; a missing store is refused and not created."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kernel import open_store
from kernel._store._owner import process_owner
from projections import fold_blame, fold_history
from projections.cli import EXIT_BAD_INPUT, EXIT_STORE, main

WORKER = Path(__file__).with_name("recover_worker.py")
ROOT = Path(__file__).resolve().parents[2]


def spawn(url: str, instance_id: str, mode: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, str(WORKER), url, instance_id, mode],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


def died_mid_superstep(url: str, instance_id: str) -> None:
    """A process that starts a run and SIGKILLs itself inside its first superstep (reaped)."""
    worker = spawn(url, instance_id, "die")
    assert worker.wait(timeout=60) == -signal.SIGKILL
    assert worker.stdout is not None
    worker.stdout.close()


@pytest.fixture
def live_worker(sqlite_url):
    """A process blocked inside a superstep of a run on instance ``live``: alive until killed."""
    worker = spawn(sqlite_url, "live", "hang")
    assert worker.stdout is not None
    line = worker.stdout.readline()
    assert line.strip() == "READY", f"worker said {line!r}"
    yield worker
    if worker.poll() is None:
        worker.kill()
    worker.wait(timeout=60)
    worker.stdout.close()


def cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_recover_closes_a_dead_process_run_as_crashed_and_says_so(sqlite_url, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    died_mid_superstep(sqlite_url, "doomed")
    with open_store(sqlite_url) as store:
        before = store.read("doomed")
    (started,) = [e for e in before if e.type == "run_started"]
    (opened,) = [e for e in before if e.type == "superstep_started"]
    assert before[-1].type == "state_staged"  # the log stops mid-superstep

    code, out, _ = cli(capsys, "--store", sqlite_url, "recover", "doomed", "--json")

    assert code == 0
    assert json.loads(out) == [
        {
            "instance_id": "doomed",
            "run_id": started.run_id,
            "superstep_id": opened.superstep_id,
            "owner": started.owner,
        }
    ]
    with open_store(sqlite_url) as store:
        after = store.read("doomed")
    assert after[: len(before)] == before
    aborted, abandoned = after[len(before) :]
    assert (aborted.type, aborted.reason, aborted.superstep_id) == (
        "superstep_aborted",
        "crashed",
        opened.superstep_id,
    )
    assert (abandoned.type, abandoned.reason, abandoned.run_id) == (
        "run_abandoned",
        "crashed",
        started.run_id,
    )
    assert fold_history(after).run(started.run_id).status == "crashed"
    (attempt,) = fold_blame(after).writes("attempted")
    assert (attempt.status, attempt.reason) == ("aborted", "crashed")

    code, out, _ = cli(capsys, "--store", sqlite_url, "recover")
    assert (code, out.strip()) == (0, "nothing to recover")
    code, out, _ = cli(capsys, "--store", sqlite_url, "recover", "--json")
    assert (code, json.loads(out)) == (0, [])
    with open_store(sqlite_url) as store:
        assert store.read("doomed") == after


def test_a_run_closed_by_recover_says_what_happened_and_who_closed_it(sqlite_url, capsys):
    """Issue 21: the crashed run's record had an empty error and a null ``closed_by``. The log
    now names the closer (``recover@`` and the lease holder it took the instance as), and the
    record says why the run ended, which superstep was aborted, who closed it and when."""
    died_mid_superstep(sqlite_url, "doomed")
    code, _, _ = cli(capsys, "--store", sqlite_url, "recover", "doomed")
    assert code == 0
    with open_store(sqlite_url) as store:
        events = store.read("doomed")
    abandoned = events[-1]
    assert abandoned.type == "run_abandoned"
    assert abandoned.closed_by.startswith("recover@")
    owner, _, token = abandoned.closed_by.removeprefix("recover@").rpartition("/")
    assert owner == process_owner()
    assert token
    opened = next(e for e in events if e.type == "superstep_started")

    code, out, _ = cli(capsys, "--store", sqlite_url, "runs", "doomed", "--json")
    assert code == 0
    (run,) = json.loads(out)["runs"]
    assert run["status"] == "crashed"
    assert run["closed_by"] == abandoned.closed_by
    assert run["error"]["type"] == "crashed"
    message = run["error"]["message"]
    assert message.startswith("its process died")
    assert f"its open superstep {opened.superstep_id} was aborted" in message
    assert f"closed by {abandoned.closed_by} at {abandoned.timestamp.isoformat()}" in message
    assert fold_history(events).runs()[0].error.message == message  # the fold says the same


def test_recover_without_an_instance_reports_every_closed_run_in_a_table(
    sqlite_url, capsys, monkeypatch
):
    monkeypatch.setenv("COLUMNS", "200")
    died_mid_superstep(sqlite_url, "first")
    died_mid_superstep(sqlite_url, "second")
    code, out, _ = cli(capsys, "--store", sqlite_url, "recover")
    assert code == 0
    assert "closed as crashed" in out
    assert "first" in out
    assert "second" in out
    with open_store(sqlite_url) as store:
        for name in ("first", "second"):
            assert store.read(name)[-1].type == "run_abandoned"


def test_recover_leaves_a_live_run_alone(sqlite_url, capsys, live_worker):
    died_mid_superstep(sqlite_url, "doomed")
    with open_store(sqlite_url) as store:
        live_before = store.read("live")
    assert live_before[-1].type == "state_staged"

    code, out, _ = cli(capsys, "--store", sqlite_url, "recover", "--json")

    assert code == 0
    assert [closed["instance_id"] for closed in json.loads(out)] == ["doomed"]
    assert live_worker.poll() is None  # still running, still in its superstep
    with open_store(sqlite_url) as store:
        assert store.read("live") == live_before
    code, out, _ = cli(capsys, "--store", sqlite_url, "recover", "live")
    assert (code, out.strip()) == (0, "nothing to recover")

    live_worker.kill()
    live_worker.wait(timeout=60)
    code, out, _ = cli(capsys, "--store", sqlite_url, "recover", "live", "--json")
    assert code == 0
    assert [closed["instance_id"] for closed in json.loads(out)] == ["live"]


def test_recover_refuses_a_missing_store_and_creates_nothing(tmp_path, capsys):
    missing = tmp_path / "missing.db"
    code, _out, err = cli(capsys, "--store", f"sqlite:///{missing}", "recover")
    assert code == EXIT_STORE
    assert str(missing) in err
    assert list(tmp_path.iterdir()) == []


def test_recover_of_an_unknown_instance_is_bad_input(sqlite_url, capsys):
    died_mid_superstep(sqlite_url, "doomed")
    code, _, err = cli(capsys, "--store", sqlite_url, "recover", "nope")
    assert code == EXIT_BAD_INPUT
    assert "no instance 'nope'" in err
    with open_store(sqlite_url) as store:
        assert store.read("doomed")[-1].type == "state_staged"  # nothing else was touched
