"""The ``steplog`` command: the demo on SQLite, and the audit commands' output and exit codes."""

from __future__ import annotations

import json

import pytest

from kernel import open_store
from projections.cli import main


def test_demo_runs_the_bug_scenario_on_sqlite_and_finds_no_leak(sqlite_url, capsys):
    assert main(["--store", sqlite_url, "demo", "--instance", "orders-42"]) == 0

    out = capsys.readouterr().out
    assert "nothing leaked" in out
    assert "payment provider timed out" in out
    with open_store(sqlite_url) as store:
        events = store.read("orders-42")
    staged = [e for e in events if e.type == "state_staged" and e.key == "secret"]
    aborted = [e for e in events if e.type == "superstep_aborted"]
    assert len(staged) == 1
    assert aborted[0].superstep_id == staged[0].superstep_id
    assert aborted[0].reason == "failed"


def test_log_state_and_instances_read_what_the_demo_wrote(sqlite_url, capsys):
    main(["--store", sqlite_url, "demo", "--instance", "orders-7"])
    capsys.readouterr()

    assert main(["--store", sqlite_url, "instances"]) == 0
    assert capsys.readouterr().out.split() == ["orders-7"]

    assert main(["--store", sqlite_url, "state", "orders-7"]) == 0
    state_out = capsys.readouterr().out
    assert "charged" in state_out
    assert "secret" not in state_out

    assert main(["--store", sqlite_url, "log", "orders-7", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["position"] for line in lines] == list(range(1, len(lines) + 1))
    assert lines[-1]["type"] == "run_completed"


def test_unknown_instance_and_bad_store_url_exit_2_with_a_message(sqlite_url, capsys):
    assert main(["--store", sqlite_url, "state", "nope"]) == 2
    assert "no instance 'nope'" in capsys.readouterr().err
    assert main(["--store", "ftp://x", "instances"]) == 2
    assert "unknown store URL" in capsys.readouterr().err


def test_the_cli_default_store_is_steplog_db_in_the_working_directory(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("STEPLOG_STORE", raising=False)
    assert main(["instances"]) == 0
    assert (tmp_path / "steplog.db").exists()


def test_help_lists_the_commands(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("demo", "instances", "log", "state"))


@pytest.fixture
def demo_store(sqlite_url, capsys, monkeypatch):
    """A SQLite store holding the demo's two runs on instance ``o1``; a wide terminal."""
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["--store", sqlite_url, "demo", "--instance", "o1"]) == 0
    capsys.readouterr()
    return sqlite_url


def run_cli(capsys, *args: str) -> tuple[int, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_blame_shows_the_leaked_key_aborted_and_why(demo_store, capsys):
    code, out = run_cli(capsys, "--store", demo_store, "blame", "o1", "secret")
    assert code == 0
    assert "aborted (failed)" in out
    assert "card-token-for-A-1" in out


def test_history_lists_both_runs_and_their_supersteps(demo_store, capsys):
    code, out = run_cli(capsys, "--store", demo_store, "history", "o1")
    assert code == 0
    assert "failed" in out
    assert "completed" in out
    assert "ConnectionError" in out


def test_state_at_a_point_and_diff_between_points(demo_store, capsys):
    code, out = run_cli(capsys, "--store", demo_store, "state", "o1", "pos:7")
    assert code == 0
    assert "charged" not in out
    code, out = run_cli(capsys, "--store", demo_store, "diff", "o1", "pos:7", "pos:15")
    assert code == 0
    assert "added" in out
    assert "A-1" in out


def test_bisect_finds_the_first_commit_and_reports_never_for_the_leaked_key(demo_store, capsys):
    code, out = run_cli(capsys, "--store", demo_store, "bisect", "o1", "--key", "charged")
    assert (code, "log position 14" in out) == (0, True)
    code, out = run_cli(capsys, "--store", demo_store, "bisect", "o1", "--key", "secret")
    assert (code, "never" in out) == (1, True)


def test_project_verify_and_rebuild_views(demo_store, capsys):
    assert run_cli(capsys, "--store", demo_store, "project")[0] == 0
    code, out = run_cli(capsys, "--store", demo_store, "verify", "state")
    assert (code, "equals a rebuild" in out) == (0, True)
    code, out = run_cli(capsys, "--store", demo_store, "rebuild", "blame")
    assert (code, "rebuilt up to global position 15" in out) == (0, True)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["state", "o1", "step:zz"], "superstep 'zz' must name exactly one"),
        (["state", "o1", "when:now"], "bad point 'when:now'"),
        (["diff", "o1", "pos:x", "pos:1"], "bad point 'pos:x'"),
        (["blame", "o1", "nothing"], "key 'nothing' was never written"),
        (["bisect", "o1", "--key", "k", "--equals", "{oops"], "--equals must be JSON"),
        (["project", "--views", "state,bogus"], "unknown views ['bogus']"),
    ],
)
def test_bad_input_exits_2_and_names_what_was_wrong(demo_store, capsys, args, message):
    code, out = run_cli(capsys, "--store", demo_store, *args)
    assert code == 2
    assert message in out
