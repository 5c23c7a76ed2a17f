"""The ``steplog`` command: the demo on SQLite, and the audit commands' output and exit codes."""

from __future__ import annotations

import asyncio
import json

import psycopg
import pytest

from kernel import EventBase, WorkflowBuilder, fold_committed, open_store
from projections import fold_blame
from projections.cli import EXIT_BAD_INPUT, EXIT_STORE, READING_COMMANDS, main
from projections.cli._demo import run_demo
from tests.durable.helpers import Counter, Tick
from tests.projections.helpers import raw_events


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


def test_the_demos_second_act_kills_recovers_resumes_and_forks(sqlite_url, capsys):
    assert main(["--store", sqlite_url, "demo", "--instance", "orders-9"]) == 0

    out = capsys.readouterr().out
    assert "child process killed by signal 9" in out
    assert "aborted (crashed)" in out
    assert "same result as an uninterrupted run" in out
    with open_store(sqlite_url) as store:
        events = store.read("orders-9-recovery")
        fork = store.read("orders-9-recovery-fork")
    crashed = [e for e in events if e.type == "superstep_aborted"]
    assert [e.reason for e in crashed] == ["crashed"]
    resumed = [e for e in events if e.type == "run_started"][1]
    assert resumed.continues == crashed[0].run_id
    assert [e.type for e in events][-1] == "run_completed"
    assert fork[0].type == "instance_forked"
    assert fork[0].origin_instance == "orders-9-recovery"


def test_the_demo_run_twice_writes_fresh_instances_and_says_so(sqlite_url, capsys):
    assert main(["--store", sqlite_url, "demo", "--instance", "o1"]) == 0
    with open_store(sqlite_url) as store:
        first = {name: store.read(name) for name in store.instances()}
    capsys.readouterr()

    assert main(["--store", sqlite_url, "demo", "--instance", "o1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True
    assert report["kept"] == ["o1", "o1-recovery", "o1-recovery-fork"]
    assert report["wrote"] == ["o1-2", "o1-2-recovery", "o1-2-recovery-fork"]
    assert main(["--store", sqlite_url, "demo", "--instance", "o1"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # as wrapped to the terminal's width
    assert "already have events" in out
    assert "this demo writes to fresh instances o1-3, o1-3-recovery, o1-3-recovery-fork" in out
    with open_store(sqlite_url) as store:
        assert {name: store.read(name) for name in first} == first  # not one event appended
        assert len(store.instances()) == 9


def test_the_demo_leaves_an_older_demos_instances_as_they_were(sqlite_url, capsys):
    """An older steplog's demo: its checkout on o1, no recovery act, and a fork instance with
    other content. Nothing is appended to them, and the demo runs whole on fresh instances."""
    with open_store(sqlite_url, create=True) as store:
        asyncio.run(run_demo(store, "o1"))
        counter = Counter("counter", 2)
        asyncio.run(
            WorkflowBuilder(start_executor=counter, store=store, instance_id="o1-recovery-fork")
            .add_edge(counter, counter)
            .build()
            .run(Tick(1))
        )
        before = {name: store.read(name) for name in store.instances()}

    assert main(["--store", sqlite_url, "demo", "--instance", "o1"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "o1, o1-recovery-fork already have events" in out
    assert "wrote instances: o1-2, o1-2-recovery, o1-2-recovery-fork" in out
    with open_store(sqlite_url) as store:
        assert {name: store.read(name) for name in before} == before
        assert store.version("o1-recovery") == 0  # the older demo had no second act
        assert store.read("o1-2-recovery-fork")[0].origin_instance == "o1-2-recovery"


def test_log_state_and_instances_read_what_the_demo_wrote(sqlite_url, capsys):
    main(["--store", sqlite_url, "demo", "--instance", "orders-7"])
    capsys.readouterr()

    assert main(["--store", sqlite_url, "instances"]) == 0
    assert capsys.readouterr().out.split() == [
        "orders-7",
        "orders-7-recovery",
        "orders-7-recovery-fork",
    ]

    assert main(["--store", sqlite_url, "state", "orders-7"]) == 0
    state_out = capsys.readouterr().out
    assert "charged" in state_out
    assert "secret" not in state_out

    assert main(["--store", sqlite_url, "log", "orders-7", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["position"] for line in lines] == list(range(1, len(lines) + 1))
    assert lines[-1]["type"] == "run_completed"


def test_unknown_instance_and_bad_store_url_exit_2_with_a_message(sqlite_url, capsys):
    assert main(["--store", sqlite_url, "demo", "--instance", "o1"]) == 0
    capsys.readouterr()
    assert main(["--store", sqlite_url, "state", "nope"]) == EXIT_BAD_INPUT == 2
    assert "no instance 'nope'" in capsys.readouterr().err
    assert main(["--store", "ftp://x", "instances"]) == 2
    assert "unknown store URL" in capsys.readouterr().err


def test_the_cli_default_store_is_steplog_db_in_the_working_directory(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("STEPLOG_STORE", raising=False)
    assert main(["instances"]) == EXIT_STORE
    assert not (tmp_path / "steplog.db").exists()
    assert main(["demo", "--instance", "o1"]) == 0
    assert (tmp_path / "steplog.db").exists()
    capsys.readouterr()
    assert main(["instances"]) == 0
    assert capsys.readouterr().out.split() == ["o1", "o1-recovery", "o1-recovery-fork"]


READING = [
    ["instances"],
    ["log", "o1"],
    ["log", "o1", "--json"],
    ["state", "o1"],
    ["history", "o1"],
    ["blame", "o1", "secret"],
    ["diff", "o1", "pos:0", "pos:1"],
    ["bisect", "o1", "--key", "secret"],
    ["verify", "state"],
    ["verify"],
    ["runs"],
    ["runs", "o1", "--json"],
    ["show", "abc"],
    ["checkpoints", "o1"],
    ["requests"],
    ["requests", "o1", "--json"],
    ["replay", "abc", "--json"],
    ["steps", "abc"],
    ["head", "o1"],
    ["log", "o1", "--type", "state_staged", "--limit", "1"],
    ["state", "o1", "--key", "charged", "--json"],
]


def test_the_reading_commands_are_the_ones_tested_here():
    assert {args[0] for args in READING} == set(READING_COMMANDS)


@pytest.mark.parametrize("args", READING, ids=lambda a: " ".join(a))
def test_a_reading_command_refuses_a_missing_sqlite_store_and_creates_no_file(
    tmp_path, capsys, args
):
    missing = tmp_path / "missing.db"
    code, out = run_cli(capsys, "--store", f"sqlite:///{missing}", *args)
    assert code == EXIT_STORE == 3
    assert str(missing) in out
    assert len(out.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.postgres
@pytest.mark.parametrize("args", READING, ids=lambda a: " ".join(a))
def test_a_reading_command_refuses_a_missing_postgres_schema_and_creates_none(
    postgres_url, postgres_server_url, capsys, args
):
    schema = postgres_url.rpartition("schema=")[2]
    code, out = run_cli(capsys, "--store", postgres_url, *args)
    assert code == EXIT_STORE
    assert len(out.strip().splitlines()) == 1
    with psycopg.connect(postgres_server_url) as conn:
        found = conn.execute(
            "SELECT count(*) FROM information_schema.schemata WHERE schema_name = %s", (schema,)
        ).fetchone()
    assert found == (0,)


def test_an_unreachable_store_exits_3_not_2(capsys):
    url = "postgresql://postgres@127.0.0.1:1/test"  # nothing listens on port 1
    code, out = run_cli(capsys, "--store", url, "instances")
    assert code == EXIT_STORE
    assert len(out.strip().splitlines()) == 1


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
    last = open_store(demo_store).last_position()
    assert (code, f"rebuilt up to global position {last} " in out) == (0, True)


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


def _disorderly_log(instance_id: str) -> list[EventBase]:
    """A write staged after its superstep's commit (late), and two supersteps with two markers
    each: commit then abort, abort then commit. Only the first marker decides."""
    s1, s2, s3 = ("r1", 1), ("r1", 2), ("r1", 3)
    return raw_events(
        instance_id,
        [
            ("run", "r1"),  # 1
            ("start", s1),  # 2
            ("write", s1, "a", "set"),  # 3: counts
            ("commit", s1),  # 4
            ("write", s1, "a", "set"),  # 5: late, never counts
            ("start", s2),  # 6
            ("write", s2, "b", "set"),  # 7: counts (committed first)
            ("commit", s2),  # 8
            ("abort", s2),  # 9: ignored
            ("start", s3),  # 10
            ("write", s3, "c", "set"),  # 11: never counts (aborted first)
            ("abort", s3),  # 12
            ("commit", s3),  # 13: ignored
            ("end", "r1", "completed"),  # 14
        ],
    )


EXPECTED_VERDICTS = {3: "committed", 5: "late", 7: "committed", 11: "aborted"}


@pytest.fixture
def disorderly_store(sqlite_url, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    with open_store(sqlite_url) as store:
        store.append("odd", _disorderly_log("odd"), expected_version=0)
    return sqlite_url


def test_log_json_says_a_late_write_and_a_second_marker_count_as_the_fold_says(
    disorderly_store, capsys
):
    code, out = run_cli(capsys, "--store", disorderly_store, "log", "odd", "--json")
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines()]
    writes = {line["position"]: line for line in lines if line["type"] == "state_staged"}
    assert {p: w["write_status"] for p, w in writes.items()} == EXPECTED_VERDICTS
    assert {p: w["counts"] for p, w in writes.items()} == {3: True, 5: False, 7: True, 11: False}
    assert "counts" not in next(line for line in lines if line["type"] != "state_staged")
    with open_store(disorderly_store) as store:
        events = store.read("odd")
    assert fold_committed(events).values == {"a": {"written_at": 3}, "b": {"written_at": 7}}
    blame = fold_blame(events)
    assert {w.position: w.status for k in "abc" for w in blame.writes(k)} == EXPECTED_VERDICTS


def test_the_log_table_shows_the_same_verdicts(disorderly_store, capsys):
    code, out = run_cli(capsys, "--store", disorderly_store, "log", "odd")
    assert code == 0
    rows = [[cell.strip() for cell in line.split("│")] for line in out.splitlines()]
    column = {int(row[1]): row[-2] for row in rows if len(row) > 3 and row[1].isdigit()}
    assert {p: column[p] for p in EXPECTED_VERDICTS} == {
        3: "yes",
        5: "no (late)",
        7: "yes",
        11: "no (aborted)",
    }
    assert column[4] == ""
