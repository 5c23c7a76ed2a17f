"""The ``steplog`` command: the demo on SQLite, and the audit commands' output and exit codes."""

from __future__ import annotations

import json

import pytest

from kernel import open_store
from kernel.cli import main


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
