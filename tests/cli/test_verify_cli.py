"""``steplog verify``, ``steplog head`` and ``--allow-broken-chain`` on logs altered in their rows
(the alterations of ``tests/store/test_tamper.py``), through ``projections.cli.main``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from projections.cli import EXIT_BAD_INPUT, EXIT_BROKEN_CHAIN, EXIT_PROBLEM, main
from tests.store.test_tamper import (
    CLEAN,
    INSTANCE,
    SECRET,
    Log,
    rewrite_marker,
    sqlite_template,
    written_log,
)


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sqlite_template(tmp_path_factory.mktemp("verify-cli"))


@pytest.fixture
def log(sqlite_url: str, template: Path) -> Log:
    return written_log(sqlite_url, template)


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_verify_passes_an_untouched_log_and_compares_the_views_built(log: Log, capsys) -> None:
    code, out, err = cli(capsys, "--store", log.url, "verify")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "chain ok: 2 instances, 46 events (0 before the chain)",
        "no materialized views to compare ('steplog project' builds them)",
    ]
    assert cli(capsys, "--store", log.url, "project", "--views", "state,blame")[0] == 0
    code, out, _ = cli(capsys, "--store", log.url, "verify")
    assert code == 0
    assert "state: the live view equals a rebuild from the log" in out
    assert "blame: the live view equals a rebuild from the log" in out
    assert "history:" not in out  # never built, so not compared unless named
    code, out, _ = cli(capsys, "--store", log.url, "verify", "history", "--instance", INSTANCE)
    assert code == 0
    assert out.splitlines() == [
        "chain ok: 1 instances, 23 events (0 before the chain)",
        "history: the live view equals a rebuild from the log",
    ]


def test_verify_json_is_one_document(log: Log, capsys) -> None:
    cli(capsys, "--store", log.url, "project", "--views", "state")
    code, out, err = cli(capsys, "--store", log.url, "verify", "--json")
    assert (code, err) == (0, "")
    document = json.loads(out)
    assert document["chain"] == {
        "ok": True,
        "verified": True,
        "instances": 2,
        "rows": 12,
        "events": 46,
        "unchained_events": 0,
        "problems": [],
        "heads": [],
    }
    assert list(document["views"]) == ["state"]
    assert document["views"]["state"]["ok"] is True


def test_a_rewritten_marker_fails_verify_naming_instance_position_and_kind(log: Log, capsys):
    rewrite_marker(log)
    code, out, _ = cli(capsys, "--store", log.url, "verify")
    assert code == EXIT_BROKEN_CHAIN == 4
    assert "hash chain broken: 1 problem(s) in 1 of 2 instances" in out
    row = next(line for line in out.splitlines() if "marker rewritten" in line)
    assert row.split("│")[1:4] == [f" {INSTANCE:<8} ", " 6        ", " marker rewritten "]
    code, out, _ = cli(capsys, "--store", log.url, "verify", "--json")
    document = json.loads(out)
    assert code == EXIT_BROKEN_CHAIN
    assert document["views"] is None  # not compared on a broken chain
    assert [
        (p["instance_id"], p["position"], p["kind"]) for p in document["chain"]["problems"]
    ] == [(INSTANCE, 6, "marker rewritten")]
    code, out, _ = cli(capsys, "--store", log.url, "verify", "--instance", "clean")
    assert (code, out.splitlines()[0]) == (
        0,
        "chain ok: 1 instances, 23 events (0 before the chain)",
    )


@pytest.mark.parametrize(
    "args",
    [
        ["log", INSTANCE],
        ["log", INSTANCE, "--json"],
        ["state", INSTANCE, "--json"],
        ["history", INSTANCE],
        ["diff", INSTANCE, "pos:0", "pos:9"],
        ["bisect", INSTANCE, "--key", "secret"],
        ["project"],
    ],
    ids=" ".join,
)
def test_a_command_refuses_a_broken_chain_in_one_line(log: Log, capsys, args) -> None:
    rewrite_marker(log)
    code, out, err = cli(capsys, "--store", log.url, *args)
    assert code == EXIT_BROKEN_CHAIN
    assert SECRET not in out
    line = _one_line(err)
    assert f"the hash chain is broken at '{INSTANCE}'#6 (marker rewritten)" in line
    assert "--allow-broken-chain" in line


def test_allow_broken_chain_reads_it_and_labels_it_on_stderr(log: Log, capsys) -> None:
    rewrite_marker(log)
    args = ("--store", log.url, "--allow-broken-chain", "state", INSTANCE, "--json")
    code, out, err = cli(capsys, *args)
    assert code == 0
    assert json.loads(out) == {"secret": SECRET, "token": "tok-A-2"}  # stdout: the document only
    line = _one_line(err)
    assert line.startswith(f"WARNING: this log's hash chain is broken at '{INSTANCE}'#6")
    assert "what was shown may have been altered" in line
    code, out, err = cli(capsys, "--store", log.url, "--allow-broken-chain", "state", "clean")
    assert (code, err) == (0, "")  # an intact instance read with the flag: no label


@pytest.mark.parametrize("unchain", [False, True], ids=["edited", "stripped of its chain"])
def test_a_rebuild_of_the_views_on_a_tampered_log_never_makes_verify_pass(
    durable_store_url: str, capsys, unchain: bool
) -> None:
    log = written_log(durable_store_url)
    assert cli(capsys, "--store", log.url, "project")[0] == 0
    rewrite_marker(log, unchain=unchain)
    if not unchain:  # (a row without hashes passes the views' read: see test_tamper's xfails)
        code, _, err = cli(capsys, "--store", log.url, "rebuild", "state")
        assert code == EXIT_BROKEN_CHAIN
        assert f"'{INSTANCE}'#6 (marker rewritten)" in _one_line(err)
    code, out, err = cli(capsys, "--store", log.url, "--allow-broken-chain", "rebuild", "state")
    assert code == 0
    assert cli(capsys, "--store", log.url, "--allow-broken-chain", "state", INSTANCE)[0] == 0
    kind = "unchained" if unchain else "marker rewritten"
    for args in (["verify"], ["verify", "state"], ["--allow-broken-chain", "verify", "state"]):
        code, out, _ = cli(capsys, "--store", log.url, *args, "--json")
        document = json.loads(out)
        assert code == EXIT_BROKEN_CHAIN, args
        assert document["chain"]["problems"][0]["kind"] == kind
    assert document["views"]["state"]["ok"] is True  # the view agrees with the altered log


def test_verify_exits_1_when_only_a_view_differs(log: Log, capsys, tmp_path: Path) -> None:
    import sqlite3
    from contextlib import closing

    cli(capsys, "--store", log.url, "project", "--views", "state")
    with closing(sqlite3.connect(log.url.removeprefix("sqlite:///"))) as db, db:
        assert db.execute("DELETE FROM steplog_view_state_v2").rowcount > 0
    code, out, _ = cli(capsys, "--store", log.url, "verify")
    assert code == EXIT_PROBLEM
    assert "chain ok" in out
    assert "state: the live view differs from a rebuild" in out


def test_head_is_json_to_keep_and_verify_checks_it(log: Log, capsys, tmp_path: Path) -> None:
    key_file, other_key = tmp_path / "key", tmp_path / "other"
    key_file.write_text("auditor key\n")
    other_key.write_bytes(b"\x00another")
    code, out, err = cli(capsys, "--store", log.url, "head", INSTANCE)
    assert (code, err) == (0, "")
    unsigned = json.loads(out)
    assert (unsigned["instance_id"], unsigned["position"], unsigned["signature"]) == (
        INSTANCE,
        23,
        "",
    )
    code, out, _ = cli(
        capsys, "--store", log.url, "head", INSTANCE, "--json", "--sign-key-file", str(key_file)
    )
    assert len(out.splitlines()) == 1
    signed = json.loads(out)
    assert signed["hash"] == unsigned["hash"]
    assert len(signed["signature"]) == 64
    assert "auditor key" not in out
    saved, plain = tmp_path / "head.json", tmp_path / "plain.json"
    saved.write_text(out)
    plain.write_text(json.dumps(unsigned))

    code, out, _ = cli(
        capsys, "--store", log.url, "verify", "--head", str(saved), "--sign-key-file", str(key_file)
    )
    assert code == 0
    assert out.splitlines()[0] == f"saved head '{INSTANCE}'#23 from {saved} (signature checked)"
    code, out, err = cli(
        capsys,
        "--store",
        log.url,
        "verify",
        "--head",
        str(saved),
        "--sign-key-file",
        str(other_key),
    )
    assert (code, out) == (EXIT_BROKEN_CHAIN, "")
    assert "has a signature that does not match the key in" in _one_line(err)
    code, _, err = cli(
        capsys, "--store", log.url, "verify", "--head", str(plain), "--sign-key-file", str(key_file)
    )
    assert code == EXIT_BROKEN_CHAIN
    assert "carries no signature" in _one_line(err)
    edited = dict(signed, position=22)
    saved.write_text(json.dumps(edited))
    code, _, err = cli(
        capsys, "--store", log.url, "verify", "--head", str(saved), "--sign-key-file", str(key_file)
    )
    assert code == EXIT_BROKEN_CHAIN
    assert "does not match the key" in _one_line(err)


def test_a_saved_head_finds_an_instance_deleted_whole(log: Log, capsys, tmp_path: Path) -> None:
    saved = tmp_path / "head.json"
    code, out, _ = cli(capsys, "--store", log.url, "head", INSTANCE)
    saved.write_text(out)
    for row in log.rows.all():
        log.rows.delete(row.last)
    log.rows.drop_head()
    assert cli(capsys, "--store", log.url, "verify")[0] == 0  # nothing left to say it existed
    code, out, _ = cli(capsys, "--store", log.url, "verify", "--head", str(saved), "--json")
    problems = json.loads(out)["chain"]["problems"]
    assert code == EXIT_BROKEN_CHAIN
    assert [(p["instance_id"], p["position"], p["kind"]) for p in problems] == [
        (INSTANCE, 23, "truncated")
    ]


def test_head_refuses_a_broken_chain(log: Log, capsys) -> None:
    rewrite_marker(log)
    code, out, err = cli(capsys, "--store", log.url, "head", INSTANCE)
    assert (code, out) == (EXIT_BROKEN_CHAIN, "")
    assert f"'{INSTANCE}'#6 (marker rewritten)" in _one_line(err)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["verify", "bogus"], "unknown views ['bogus']"),
        (["verify", "--instance", "nope"], "no instance 'nope'"),
        (["verify", "--head", "{missing}"], "cannot read the chain head file"),
        (["verify", "--head", "{not_json}"], "is not JSON"),
        (["verify", "--head", "{not_head}"], "needs its position"),
        (["verify", "--head", "{head}", "--instance", "clean"], "not of --instance 'clean'"),
        (["verify", "--head", "{head}", "--sign-key-file", "{empty}"], "is empty"),
        (["head", "nope"], "no instance 'nope'"),
        (["head", INSTANCE, "--sign-key-file", "{missing}"], "cannot read the signing key file"),
    ],
)
def test_bad_input_exits_2_in_one_line(log: Log, capsys, tmp_path: Path, args, message) -> None:
    files = {
        "missing": tmp_path / "missing",
        "not_json": tmp_path / "not.json",
        "not_head": tmp_path / "not-head.json",
        "head": tmp_path / "head.json",
        "empty": tmp_path / "empty",
    }
    files["not_json"].write_text("{oops")
    files["not_head"].write_text(json.dumps({"instance_id": INSTANCE, "hash": "00" * 16}))
    files["head"].write_text(
        json.dumps({"instance_id": INSTANCE, "position": 1, "hash": "00" * 16})
    )
    files["empty"].write_text("\n")
    filled = [a.format(**{k: str(v) for k, v in files.items()}) for a in args]
    code, out, err = cli(capsys, "--store", log.url, *filled)
    assert (code, out) == (EXIT_BAD_INPUT, "")
    assert message in _one_line(err)


@pytest.mark.parametrize("name", ["format1", "batch1"])
def test_verify_says_a_log_before_the_chain_is_unchecked(name: str, tmp_path: Path, capsys) -> None:
    """A log written before the hash chain is legitimate, but nothing vouches for its events:
    ``verify`` says how many it could not check, not that they are bad, and does not pass."""
    import shutil

    path = tmp_path / f"{name}.db"
    shutil.copyfile(Path(__file__).parent.parent / "data" / f"{name}.db", path)
    before = path.read_bytes()
    code, out, err = cli(capsys, "--store", f"sqlite:///{path}", "verify")
    assert (code, err) == (EXIT_PROBLEM, "")
    first = out.splitlines()[0]
    assert first.startswith("chain unchecked: ")
    assert "chain ok" not in out
    assert " could not be checked" in first
    assert "broken" not in out
    code, out, _ = cli(capsys, "--store", f"sqlite:///{path}", "verify", "--json")
    assert code == EXIT_PROBLEM
    chain = json.loads(out)["chain"]
    assert (chain["ok"], chain["verified"], chain["problems"]) == (True, False, [])
    assert chain["unchained_events"] == chain["events"] > 0
    assert path.read_bytes() == before  # reading never writes


def test_rebuild_and_verify_leave_no_file_beside_the_store(log: Log, capsys) -> None:
    # Issue 21: they left ten ``steplog.db.steplog_view_*.lock`` files in the working directory.
    directory = Path(log.url.removeprefix("sqlite:///")).parent
    assert cli(capsys, "--store", log.url, "project")[0] == 0
    before = sorted(p.name for p in directory.iterdir())
    assert cli(capsys, "--store", log.url, "rebuild")[0] == 0
    assert sorted(p.name for p in directory.iterdir()) == before
    assert cli(capsys, "--store", log.url, "verify")[0] == 0
    assert sorted(p.name for p in directory.iterdir()) == before


def test_verify_names_a_truncated_tail_and_reports_the_chain_and_the_views(
    log: Log, capsys
) -> None:
    # Issue 21: after the log's tail was cut and its head rolled back, verify said only "view
    # 'state' kept moving" (exit 2), with no chain report. Now both reports come out, and the
    # views' says where the log ends before what the views folded.
    assert cli(capsys, "--store", log.url, "project", "--views", "state,blame")[0] == 0
    import sqlite3
    from contextlib import closing

    from kernel import open_store

    with open_store(log.url, create=False) as store:  # CLEAN, written last, ends the log
        rows = store.backend.select_stream(CLEAN, after=9, upto=15)  # the row holding #10..15
        last, topic, state = rows[-1]
        head = store._mapper.row_link(CLEAN, last, topic, state).head
        end = store.last_position()
    assert (last, head is not None) == (15, True)
    with closing(sqlite3.connect(log.url.removeprefix("sqlite:///"))) as db, db:
        db.execute(
            "DELETE FROM steplog_events WHERE originator_id = ? AND originator_version > 15",
            (CLEAN,),
        )
        db.execute(
            "UPDATE steplog_chain SET position = 15, head = ? WHERE instance_id = ?", (head, CLEAN)
        )
    code, out, err = cli(capsys, "--store", log.url, "verify")
    assert err == ""
    assert code == EXIT_PROBLEM, out
    assert out.startswith("chain ok: 2 instances, 38 events")
    assert "state: the live view differs from a rebuild" in out
    assert "blame: the live view differs from a rebuild" in out
    assert f"up to global position {end}, but the log now ends at" in out
    assert "a truncated tail" in out
    code, out, _ = cli(capsys, "--store", log.url, "verify", "--json")
    document = json.loads(out)
    assert code == EXIT_PROBLEM
    assert document["chain"]["ok"] is True
    assert document["views"]["state"]["ok"] is False
    assert document["views"]["state"]["position"] == end
    assert 0 < document["views"]["state"]["log_end"] < end


def test_blame_refuses_a_key_index_that_lost_a_row_and_verify_names_it(log: Log, capsys) -> None:
    # Issue 21: deleting the key index's row of a key made 'steplog blame' say the key was never
    # written. It now refuses in one line saying to rebuild the view; verify names the row.
    import sqlite3
    from contextlib import closing

    assert cli(capsys, "--store", log.url, "project", "--views", "keyindex")[0] == 0
    with closing(sqlite3.connect(log.url.removeprefix("sqlite:///"))) as db, db:
        db.execute(
            "DELETE FROM steplog_view_keyindex_v2 WHERE instance_id = ? AND key = 'k:secret'",
            (INSTANCE,),
        )
    code, out, err = cli(capsys, "--store", log.url, "blame", INSTANCE, "secret")
    assert code == EXIT_BROKEN_CHAIN
    assert "never written" not in out + err
    line = _one_line(err)
    assert f"the keyindex view of {INSTANCE!r} does not match the log" in line
    assert "steplog rebuild keyindex" in line
    code, out, _ = cli(capsys, "--store", log.url, "verify", "keyindex", "--json")
    assert code == EXIT_PROBLEM
    assert [INSTANCE, "k:secret"] in json.loads(out)["views"]["keyindex"]["only_rebuilt"]
    assert cli(capsys, "--store", log.url, "rebuild", "keyindex")[0] == 0
    code, out, _ = cli(capsys, "--store", log.url, "blame", INSTANCE, "secret")
    assert code == 0
    assert "aborted" in out


def test_a_view_document_that_is_not_json_is_a_view_difference_not_a_crash(
    log: Log, capsys
) -> None:
    # Review of issue 21: 'UPDATE steplog_view_state_v2 SET doc = ...' with text that is not JSON
    # made 'steplog verify' exit 70 ("unexpected JSONDecodeError"). It is a view that differs
    # from the log: verify exits 1 naming the view, instance and row; blame through the key
    # index refuses in one line.
    import sqlite3
    from contextlib import closing

    assert cli(capsys, "--store", log.url, "project", "--views", "state,keyindex")[0] == 0
    with closing(sqlite3.connect(log.url.removeprefix("sqlite:///"))) as db, db:
        db.execute("UPDATE steplog_view_state_v2 SET doc = 'not json' WHERE key != '#'")
        db.execute(
            "UPDATE steplog_view_keyindex_v2 SET doc = 'not json' WHERE instance_id = ? "
            "AND key = 'k:secret'",
            (INSTANCE,),
        )
    code, out, err = cli(capsys, "--store", log.url, "verify")
    assert (code, err) == (EXIT_PROBLEM, "")
    assert "state: the live view differs from a rebuild" in out
    assert "keyindex: the live view differs from a rebuild" in out
    code, out, err = cli(capsys, "--store", log.url, "verify", "--json")
    assert code == EXIT_PROBLEM
    views = json.loads(out)["views"]
    assert {tuple(row) for row in views["state"]["different"]} == {
        (INSTANCE, "view"),
        (CLEAN, "view"),
    }
    assert [INSTANCE, "k:secret"] in views["keyindex"]["different"]
    code, out, err = cli(capsys, "--store", log.url, "blame", INSTANCE, "secret")
    assert code == EXIT_BROKEN_CHAIN
    line = _one_line(err)
    assert f"steplog_view_keyindex_v2 {INSTANCE!r}/'k:secret' is not JSON" in line
    assert "steplog rebuild" in line
