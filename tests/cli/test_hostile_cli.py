"""Hostile and broken input to the ``steplog`` command: one line on standard error, no traceback,
the usual exit status, and nothing overwritten.

- No output of the command ever holds a store URL's password.
- A malformed URL, a bad instance id, another application's SQLite file, a corrupted row: exit
  2, and a database or a row written by a newer steplog: exit 5, with one line naming the
  problem (and, for a row, its position); the file's bytes are unchanged.
- Every reading command works on a read-only SQLite store (file, or file and directory).
- Every command is linear in what it shows: a 5 MB value is shown cut, with its size, in the
  ``state`` table, and whole with ``state --json``.
"""

from __future__ import annotations

import asyncio
import io
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from contextlib import closing, redirect_stdout
from pathlib import Path
from typing import Any
from unittest.mock import patch

import orjson
import pytest

from kernel import Executor, WorkflowBuilder, WorkflowContext, handler, open_store
from kernel._store import _sqlite as _store_sqlite
from projections.cli import EXIT_BAD_INPUT, EXIT_NEWER_SCHEMA, EXIT_STORE, READING_COMMANDS, main
from tests.store.test_hostile_store import (
    REFUSED_URLS,
    SECRET,
    foreign_file,
    in_a_child_without_write_permission,
)

INSTANCE = "orders-1"
BIG = 5_000_000


class Writer(Executor):
    """Commits ``n`` (the message) and ``big`` (``size`` characters) in one superstep."""

    def __init__(self, id: str, size: int = 10) -> None:
        super().__init__(id)
        self.size = size

    @handler
    async def run(self, message: int, ctx: WorkflowContext[int, int]) -> None:
        ctx.set_state("n", message)
        ctx.set_state("big", "x" * (self.size - 1) + "y")


def logged(path: Path, size: int = 10) -> str:
    """A SQLite store at ``path`` holding one committed run of ``Writer`` on ``INSTANCE``."""
    url = f"sqlite:///{path}"

    async def run() -> None:
        with open_store(url) as store:
            builder = WorkflowBuilder(
                start_executor=Writer("w", size), store=store, instance_id=INSTANCE
            )
            await builder.build().run(1)

    asyncio.run(run())
    return url


def one_line_complaint(err: str) -> str:
    """The complaint, checked to be one line and no traceback."""
    assert err.count("\n") == 1, err
    assert err.startswith("steplog: ")
    assert "Traceback" not in err
    return err


# -- URLs -------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("url", [*REFUSED_URLS, f"postgresql://postgres:{SECRET}@127.0.0.1:1/test"])
def test_no_output_shows_the_password_of_the_store_url(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["--store", url, "instances"])
    out, err = capsys.readouterr()
    assert status in (EXIT_BAD_INPUT, EXIT_STORE)
    assert SECRET not in out + err
    assert "Se/cr3t" not in out + err
    one_line_complaint(err)


def test_a_malformed_url_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--store", "sqlite://[::1/x.db", "instances"]) == EXIT_BAD_INPUT
    err = one_line_complaint(capsys.readouterr().err)
    assert "store URL 'sqlite://[::1/x.db' is malformed: Invalid IPv6 URL" in err


# -- ids --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("instance", "why"),
    [
        ("a\udc80", "must be valid Unicode text"),  # what a non-UTF-8 argument decodes to
        ("", "must be a non-empty str"),
        ("x" * 10_000, "no instance 'xxxx"),  # read at any length: an older id stays readable
    ],
    ids=["lone-surrogate", "empty", "ten-kilobytes"],
)
@pytest.mark.parametrize("command", [["state"], ["log"], ["history"], ["blame", "@", "n"]])
def test_a_bad_instance_id_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], instance: str, why: str, command: list[str]
) -> None:
    url = logged(tmp_path / "s.db")
    argv = [instance if part == "@" else part for part in command]
    if "@" not in command:
        argv.append(instance)
    assert main(["--store", url, *argv]) == EXIT_BAD_INPUT
    err = " ".join(one_line_complaint(capsys.readouterr().err).split())
    assert why in err if why.startswith("no instance") else f"instance id {why}" in err


# -- files that are not ours, or newer than us, or damaged ------------------------------------


def test_another_applications_file_is_refused_by_a_writing_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = foreign_file(tmp_path / "app.db")
    before = path.read_bytes()
    assert main(["--store", f"sqlite:///{path}", "project"]) == EXIT_BAD_INPUT
    assert "another application's SQLite database" in one_line_complaint(capsys.readouterr().err)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]


def rewrite_row(path: Path, change: Any) -> None:
    """Replace the stored body of the instance's first row by ``change(body bytes)``."""
    with closing(sqlite3.connect(path)) as db, db:
        first = "SELECT rowid, state FROM steplog_events ORDER BY rowid"
        rowid, state = db.execute(first).fetchone()
        db.execute("UPDATE steplog_events SET state = ? WHERE rowid = ?", (change(state), rowid))


def newer_batch_format(state: bytes) -> bytes:
    return orjson.dumps([99, *orjson.loads(state)[1:]])


def unknown_event_type(state: bytes) -> bytes:
    body = orjson.loads(state)
    body[-1][0] = 500  # the type code of the row's last event
    return orjson.dumps(body)


DAMAGE = {
    "corrupted-row": (lambda state: b"\xff\x00 not a row", r"row 'orders-1'#1..\d+ is not valid"),
    "newer-batch-format": (newer_batch_format, "in batch format 99, newer than this steplog's"),
    "unknown-event-type": (unknown_event_type, "has unknown type code 500"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
@pytest.mark.parametrize(
    "command", [["log", INSTANCE], ["log", INSTANCE, "--json"], ["state", INSTANCE],
                ["history", INSTANCE], ["blame", INSTANCE, "n"],
                ["diff", INSTANCE, "pos:1", "pos:2"], ["bisect", INSTANCE, "--key", "n"]],
    ids=lambda c: " ".join(c),
)  # fmt: skip
def test_a_damaged_or_newer_row_is_one_line_naming_it_and_nothing_is_overwritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str, command: list[str]
) -> None:
    change, problem = DAMAGE[damage]
    url = logged(tmp_path / "s.db")
    rewrite_row(tmp_path / "s.db", change)
    before = (tmp_path / "s.db").read_bytes()
    expected = EXIT_NEWER_SCHEMA if damage == "newer-batch-format" else EXIT_BAD_INPUT
    assert main(["--store", url, *command]) == expected
    err = " ".join(one_line_complaint(capsys.readouterr().err).split())
    assert re.search(problem, err), err
    assert "'orders-1'#" in err
    assert (tmp_path / "s.db").read_bytes() == before


@pytest.mark.parametrize("command", [["instances"], ["log", INSTANCE], ["project"], ["recover"]])
def test_a_database_written_by_a_newer_steplog_is_one_line_and_left_as_it_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    url = logged(tmp_path / "s.db")
    with closing(sqlite3.connect(tmp_path / "s.db")) as db, db:
        db.execute("UPDATE steplog_meta SET value = '99' WHERE key = 'schema_version'")
    before = (tmp_path / "s.db").read_bytes()
    assert main(["--store", url, *command]) == EXIT_NEWER_SCHEMA == 5
    err = one_line_complaint(capsys.readouterr().err)
    assert "was written by a newer steplog (store schema version 99" in err
    assert "upgrade steplog" in err
    assert (tmp_path / "s.db").read_bytes() == before


# -- read-only stores -------------------------------------------------------------------------

READING = [
    ["instances"],
    ["log", INSTANCE],
    ["log", INSTANCE, "--json"],
    ["state", INSTANCE],
    ["state", INSTANCE, "pos:1"],
    ["history", INSTANCE],
    ["blame", INSTANCE, "n"],
    ["diff", INSTANCE, "pos:1", "pos:8"],
    ["bisect", INSTANCE, "--key", "n"],
    ["bisect", INSTANCE, "--key", "n", "--json"],
    ["runs"],
    ["runs", INSTANCE, "--json"],
    ["checkpoints", INSTANCE],
    ["checkpoints", INSTANCE, "--json"],
    ["requests"],
    ["requests", INSTANCE, "--json"],
    ["log", INSTANCE, "--type", "state_staged", "--from", "2", "--limit", "3"],
    ["history", INSTANCE, "--json"],
    ["blame", INSTANCE, "n", "--json"],
    ["diff", INSTANCE, "pos:1", "pos:8", "--json"],
    ["instances", "--json"],
]
_RUN_ALL = """
import contextlib, io, json, sys
from projections.cli import main
results = []
for command in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(command)
    results.append([status, out.getvalue(), err.getvalue()])
print(json.dumps(results))
"""


def run_all(commands: list[list[str]], *, child: bool) -> list[list[Any]]:
    """``[status, stdout, stderr]`` of each command, run here or in one child process that, even
    as root, cannot write read-only files."""
    argv = orjson.dumps(commands).decode()
    if not child:
        with patch.object(sys, "argv", ["-c", argv]), redirect_stdout(io.StringIO()) as out:
            exec(_RUN_ALL, {"__name__": "run_all"})
        return list(orjson.loads(out.getvalue()))
    done = in_a_child_without_write_permission(["-c", _RUN_ALL, argv])
    assert done.returncode == 0, done.stderr
    return list(orjson.loads(done.stdout))


@pytest.mark.parametrize("locked", ["file", "file-and-directory"])
def test_every_reading_command_works_on_a_read_only_store(tmp_path: Path, locked: str) -> None:
    directory = tmp_path / "ro"
    directory.mkdir()
    url = logged(directory / "s.db")
    with open_store(url) as store:
        run = store.read(INSTANCE, upto=1)[0].run_id
    by_run = [
        ["show", "--", run[:6]],
        ["replay", "--", run],
        ["replay", "--json", "--", run],
        ["steps", "--", run],
    ]
    commands = [["--store", url, *command] for command in [*READING, *by_run]]
    expected = run_all(commands, child=False)  # what each prints while the store is writable
    assert [status for status, _, _ in expected] == [0] * len(commands)
    before = (directory / "s.db").read_bytes()
    (directory / "s.db").chmod(0o444)
    if locked == "file-and-directory":
        directory.chmod(0o555)
    try:
        assert run_all(commands, child=True) == expected
        ((status, _, err),) = run_all([["--store", url, "project"]], child=True)
    finally:
        directory.chmod(0o755)
    assert status in (EXIT_BAD_INPUT, EXIT_STORE)
    assert "readonly" in one_line_complaint(err) or "read-only" in err
    assert (directory / "s.db").read_bytes() == before


_MOUNT_READ_ONLY = (
    'mount --bind "$1" "$1" && mount -o remount,ro,bind "$1" || exit 97; shift; exec "$@"'
)


def in_a_read_only_mount(directory: Path, args: list[str]) -> subprocess.CompletedProcess[str]:
    """Run Python with ``args`` in a child that sees ``directory`` as a read-only mount (a bind
    mount remounted read-only, in a mount namespace of its own: the test's files are untouched,
    and not even root can write there). Skips where mount namespaces cannot be made."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1) to make a read-only mount")
    as_user = [] if os.geteuid() == 0 else ["--map-root-user"]
    done = subprocess.run(
        [unshare, *as_user, "--mount", "--propagation", "private", "sh", "-c", _MOUNT_READ_ONLY,
         "sh", str(directory), sys.executable, *args],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    if done.returncode == 97 or (done.returncode != 0 and "unshare:" in done.stderr):
        pytest.skip(f"cannot make a read-only mount here: {done.stderr.strip()}")
    return done


def test_every_reading_command_works_on_a_read_only_mount(tmp_path: Path) -> None:
    """On a read-only file system SQLite cannot create the ``-shm`` file it reads a WAL-mode
    file through (``SQLITE_CANTOPEN``): every reading command failed with exit status 3."""
    directory = tmp_path / "ro"
    directory.mkdir()
    url = logged(directory / "s.db")
    with open_store(url) as store:
        run = store.read(INSTANCE, upto=1)[0].run_id
    by_run = [
        ["show", "--", run[:6]],
        ["replay", "--", run],
        ["replay", "--json", "--", run],
        ["steps", "--", run],
    ]
    commands = [["--store", url, *command] for command in [*READING, *by_run]]
    expected = run_all(commands, child=False)
    assert [status for status, _, _ in expected] == [0] * len(commands)
    before = sorted(p.name for p in directory.iterdir())
    done = in_a_read_only_mount(directory, ["-c", _RUN_ALL, orjson.dumps(commands).decode()])
    assert done.returncode == 0, done.stderr
    assert orjson.loads(done.stdout) == expected
    writing = [["--store", url, "project"]]
    done = in_a_read_only_mount(directory, ["-c", _RUN_ALL, orjson.dumps(writing).decode()])
    ((status, _, err),) = orjson.loads(done.stdout)
    assert status == EXIT_STORE
    assert "steplog:" in err
    assert sorted(p.name for p in directory.iterdir()) == before


def test_a_read_only_mount_with_commits_in_its_wal_is_refused_not_read_without_them(
    tmp_path: Path,
) -> None:
    """Read alone (``immutable=1``), a file whose ``-wal`` holds commits would show the log
    without them: it is refused, naming the write-ahead log."""
    directory = tmp_path / "ro"
    directory.mkdir()
    logged(directory / "s.db")
    copy = tmp_path / "copy"
    copy.mkdir()
    with closing(sqlite3.connect(directory / "s.db")) as db:
        db.execute("PRAGMA wal_autocheckpoint=0")
        db.execute("CREATE TABLE steplog_later (x)")
        db.commit()
        for name in ("s.db", "s.db-wal"):  # a copy taken while the writer had the file open
            shutil.copyfile(directory / name, copy / name)
    assert (copy / "s.db-wal").stat().st_size > 0
    commands = [["--store", f"sqlite:///{copy}/s.db", "instances"]]
    done = in_a_read_only_mount(copy, ["-c", _RUN_ALL, orjson.dumps(commands).decode()])
    assert done.returncode == 0, done.stderr
    ((status, out, err),) = orjson.loads(done.stdout)
    assert status == EXIT_STORE
    assert out == ""
    assert "write-ahead log s.db-wal holds commits" in one_line_complaint(err)


# -- reading never writes ----------------------------------------------------------------------


def sqlite_opens(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The URIs (or paths) ``sqlite3.connect`` is called with from now on, in this process, but
    for those of the lock-only connection that removes a reader's files (recorded as
    ``"cleaner"``: it reads nothing, and writes nothing to the file)."""
    opened: list[str] = []
    connect = sqlite3.connect
    remove = getattr(_store_sqlite, "remove_reader_files", None)

    def recording(database: Any, *args: Any, **kwargs: Any) -> sqlite3.Connection:
        opened.append(str(database))
        return connect(database, *args, **kwargs)

    def cleaner(path: Path) -> None:
        opened.append("cleaner")
        with patch.object(sqlite3, "connect", connect):
            assert remove is not None
            remove(path)

    monkeypatch.setattr(sqlite3, "connect", recording)
    monkeypatch.setattr(_store_sqlite, "remove_reader_files", cleaner, raising=False)
    return opened


def files_of(directory: Path) -> dict[str, tuple[bytes, int]]:
    """Each file in ``directory``: its bytes and modification time."""
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(directory.iterdir())}


def test_every_reading_command_opens_sqlite_read_only_and_leaves_the_directory_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every reading command opened ``steplog.db`` read-write (``mode=rw``): SQLite made its
    ``-wal`` and ``-shm``, and the last connection's close folded the log into the file and
    deleted them. A reader now reads through ``mode=ro`` connections only; the empty ``-wal``
    and ``-shm`` SQLite makes for them are removed at the end by one lock-only connection, and
    the file's bytes and modification time never change."""
    directory = tmp_path / "store"
    directory.mkdir()
    url = logged(directory / "s.db")
    with open_store(url) as store:
        run = store.read(INSTANCE, upto=1)[0].run_id
    by_run = [
        ["show", "--", run[:6]],
        ["replay", "--", run],
        ["replay", "--json", "--", run],
        ["steps", "--", run],
    ]
    others = [["verify"], ["verify", "--json"], ["head", INSTANCE]]
    commands = [["--store", url, *command] for command in [*READING, *by_run, *others]]
    assert {c[2] for c in commands} == set(READING_COMMANDS)
    before = files_of(directory)
    assert list(before) == ["s.db"]
    path = str((directory / "s.db").resolve())
    for command in commands:
        opened = sqlite_opens(monkeypatch)
        ((status, _, err),) = run_all([command], child=False)
        assert status == 0, (command, err)
        assert files_of(directory) == before, command
        reads = [uri for uri in opened if path in uri]
        assert reads, command
        assert all(uri.endswith("?mode=ro") for uri in reads), (command, reads)
        assert opened[-1] == "cleaner", command  # after every connection closed


def test_steplog_ui_serves_a_store_opened_read_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``steplog ui`` (not in ``READING_COMMANDS``: it serves until stopped) reads its store
    through the same read-only path as the reading commands."""
    pytest.importorskip("starlette")
    import projections.ui

    url = logged(tmp_path / "s.db")
    served: list[Any] = []

    def serve(store: Any, **options: Any) -> None:
        served.append((store.read_only, store.instances()))

    monkeypatch.setattr(projections.ui, "serve", serve)
    opened = sqlite_opens(monkeypatch)
    assert main(["--store", url, "ui"]) == 0
    assert served == [(True, [INSTANCE])]
    reads = [uri for uri in opened if uri != "cleaner"]
    assert reads
    assert all(uri.endswith("?mode=ro") for uri in reads), reads
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.db"]


def killed_writer(url: str, instance: str) -> None:
    """Commit a run of ``Writer`` on ``instance`` in a child process that is then killed before
    it closes the store: its commits are in the ``-wal`` file only (not folded into the file)."""
    code = f"""
import asyncio, os, signal
from kernel import WorkflowBuilder, open_store
from tests.cli.test_hostile_cli import Writer

async def main():
    store = open_store({url!r})
    builder = WorkflowBuilder(start_executor=Writer("w"), store=store, instance_id={instance!r})
    await builder.build().run(2)
    os.kill(os.getpid(), signal.SIGKILL)

asyncio.run(main())
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == -9, done.stderr


def test_a_reading_command_reads_a_killed_writers_wal_and_leaves_it_and_the_file_unchanged(
    tmp_path: Path,
) -> None:
    """With a ``-wal`` left by a killed writer, ``steplog instances`` checkpointed it into the
    database file (its bytes changed) and deleted the ``-wal`` and ``-shm``. A reader shows the
    commits in the ``-wal`` and changes neither file (only SQLite's ``-shm`` index may be
    rebuilt)."""
    directory = tmp_path / "store"
    directory.mkdir()
    url = logged(directory / "s.db")
    killed_writer(url, "orders-2")
    wal = directory / "s.db-wal"
    assert wal.stat().st_size > 0
    alone = f"{(directory / 's.db').as_uri()}?mode=ro&immutable=1"  # the file without its -wal
    with closing(sqlite3.connect(alone, uri=True)) as db:
        folded = {row[0] for row in db.execute("SELECT originator_id FROM steplog_events")}
    assert "orders-2" not in folded  # the run is in the -wal only
    before = {name: data for name, data in files_of(directory).items() if name != "s.db-shm"}
    assert list(before) == ["s.db", "s.db-wal"]
    commands = [
        ["--store", url, "instances", "--json"],
        ["--store", url, "state", "orders-2", "--json"],
        ["--store", url, "verify"],
    ]
    (instances, state, verify) = run_all(commands, child=False)
    assert instances[0] == 0, instances[2]
    listed = [row["instance_id"] for row in orjson.loads(instances[1])["instances"]]
    assert listed == [INSTANCE, "orders-2"]
    assert state[0] == 0, state
    assert orjson.loads(state[1])["n"] == 2
    assert verify[0] == 0, verify
    after = {name: data for name, data in files_of(directory).items() if name != "s.db-shm"}
    assert after == before
    assert (directory / "s.db-shm").exists()


# -- a damaged file -----------------------------------------------------------------------------


def damage_table(path: Path, table: str) -> None:
    """Overwrite every page of ``table`` in the SQLite file at ``path`` with bytes that are no
    b-tree page (SQLite then reports ``SQLITE_CORRUPT``); the rest of the file is left as it is,
    so the store still opens."""
    with closing(sqlite3.connect(path)) as db:
        try:
            pages = [row[0] for row in db.execute("SELECT pageno FROM dbstat WHERE name = ?",
                                                  (table,))]  # fmt: skip
        except sqlite3.OperationalError as error:
            pytest.skip(f"this SQLite has no dbstat table to find the pages of a table: {error}")
        size = db.execute("PRAGMA page_size").fetchone()[0]
    assert pages
    with path.open("r+b") as file:
        for page in pages:
            file.seek((page - 1) * size)
            file.write(b"\xff" * size)


def test_project_follow_stops_on_a_damaged_file_instead_of_retrying_it(tmp_path: Path) -> None:
    """A structurally corrupt file was "unavailable", so ``project --follow`` retried it
    forever; it stops at once, saying that the file is damaged."""
    path = tmp_path / "s.db"
    url = logged(path)
    damage_table(path, "steplog_events")
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from projections.cli import main; sys.exit(main())",
         "--store", url, "project", "--follow"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == EXIT_STORE, done.stderr
    complaint = one_line_complaint(done.stderr)
    assert f"the file {path} is damaged" in complaint
    assert "retrying" not in done.stderr


# -- big values -------------------------------------------------------------------------------


def test_a_5_mb_value_is_shown_cut_with_its_size_and_whole_with_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = logged(tmp_path / "s.db", size=BIG)
    assert main(["--store", url, "state", INSTANCE]) == 0
    shown = capsys.readouterr().out
    squeezed = re.sub(r"[\s│]", "", shown)  # the cell is folded over several lines
    assert f"({BIG + 2:,}charactersinall;--jsonshowsitwhole)" in squeezed
    assert '"xxxxxxxx' in shown
    assert len(shown) < 10_000
    assert main(["--store", url, "state", INSTANCE, "--json"]) == 0
    whole = orjson.loads(capsys.readouterr().out)
    assert whole == {"big": "x" * (BIG - 1) + "y", "n": 1}
    others = (["log", INSTANCE], ["blame", INSTANCE, "big"], ["diff", INSTANCE, "pos:1", "pos:8"])
    for command in others:
        assert main(["--store", url, *command]) == 0, command
        assert len(capsys.readouterr().out) < 20_000, command
