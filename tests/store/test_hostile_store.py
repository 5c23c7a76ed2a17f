"""Hostile and broken input to the kernel: one clear error from the library's tree, nothing lost.

Each input is accepted exactly or refused with a ``StepLogError`` naming what was wrong, before
anything is appended; the instance then runs normally, and its log holds no partial superstep.

- A store URL's password never appears in an error, ``store.url``, ``repr`` or a log line,
  whatever is wrong with the URL or the server (unreachable port, unknown database or user).
- A malformed URL is a ``StoreConfigError`` naming the problem.
- Instance ids and state keys have the same limits on every backend (``kernel._base._ids``): the
  largest allowed ones work on each, PostgreSQL's indexes and the materialized views included.
- Cyclic and 5,000-deep values are ``EncodingError``s wherever they enter (state, messages,
  outputs, the run's input), recorded as the executor's failure like any other.
- Another application's SQLite file is refused untouched unless ``adopt=True``; a read-only
  SQLite store can be read (``?mode=ro``, a read-only file, a read-only directory).
"""

from __future__ import annotations

import logging
import os
import re
import sqlite3
import subprocess
import sys
import traceback
from contextlib import closing
from pathlib import Path
from typing import Any

import orjson
import pytest

from kernel import (
    DecodeError,
    DefinitionError,
    EncodingError,
    EventStore,
    ExecutionError,
    Executor,
    InvalidBatchError,
    StoreConfigError,
    StoreError,
    StoreUnavailableError,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    handler,
    open_store,
)
from kernel._base._ids import MAX_ID_BYTES, MAX_KEY_BYTES
from kernel._base._urls import mask_url, url_secrets
from kernel._codec._mapper import RowMapper
from kernel._store._sqlite import sqlite_path
from kernel.testing import LogBuilder
from tests.kernel.helpers import kinds
from tests.store.test_errors import _without_file_permission_override

SECRET = "Secr3t"


def everything_said(error: BaseException) -> str:
    """Every text an error carries: its message, repr and the whole formatted chain."""
    return "\n".join([str(error), repr(error), *traceback.format_exception(error)])


# -- passwords --------------------------------------------------------------------------------

REFUSED_URLS = [
    f"postgresql+psycopg://postgres:{SECRET}@127.0.0.1/db",
    f"postgress://u:{SECRET}@h/db",
    f"sqlite://user:{SECRET}@host/x.db",
    f"sqlite://user:{SECRET}@/x.db",
    f"postgresql://u:{SECRET}@[::1/db",
    f"postgresql://postgres:{SECRET}@127.0.0.1:99999/test",
    f"postgresql://postgres:{SECRET}@127.0.0.1:port/test",
    f"postgresql://postgres:Se/cr3t{SECRET}@127.0.0.1/test",  # an unencoded "/" in it
    f"postgresql://postgres:{SECRET}@127.0.0.1:5432",
    f"postgresql://postgres:{SECRET}@127.0.0.1:5432/test?sslmode=require",
    f"postgresql://postgres:{SECRET}@127.0.0.1:5432/test?schema=no-such;thing",
    "postgresql://postgres:Secr%33t@127.0.0.1:5432/test?x=1",  # percent-encoded "Secr3t"
]


@pytest.mark.parametrize("url", REFUSED_URLS)
def test_a_refused_url_never_shows_its_password(url: str) -> None:
    with pytest.raises(StoreConfigError) as caught:
        open_store(url)
    said = everything_said(caught.value)
    assert SECRET not in said
    assert "Se/cr3t" not in said
    if "://" in str(caught.value):  # the message quotes the URL: masked, the user kept
        assert ":***@" in str(caught.value)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://postgres:{SECRET}@127.0.0.1:1/test",  # nothing listens on port 1
        f"postgresql://postgres:{SECRET}@127.0.0.1:5432/no_such_db_steplog",
        f"postgresql://no_such_user_steplog:{SECRET}@127.0.0.1:5432/test",
    ],
    ids=["unreachable", "unknown-database", "unknown-user"],
)
def test_a_failed_connection_never_shows_the_password(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(StoreUnavailableError) as caught:
        open_store(url, connect_timeout=2)
    assert SECRET not in everything_said(caught.value)
    assert ":***@127.0.0.1" in str(caught.value)
    assert SECRET not in caplog.text
    assert all(SECRET not in str(record.args) for record in caplog.records)


@pytest.mark.postgres
def test_an_open_store_shows_its_url_masked(postgres_url: str) -> None:
    with_password = postgres_url.replace("postgres@", f"postgres:{SECRET}@", 1)
    assert SECRET in with_password  # trust authentication: any password is accepted
    with open_store(with_password) as store:
        assert SECRET not in store.url
        assert SECRET not in repr(store)
        assert store.url == mask_url(with_password)
        assert ":***@" in store.url


def test_masking_keeps_the_user_and_hides_every_form_of_the_password() -> None:
    assert mask_url("postgresql://app:pa%40ss@db:5432/x") == "postgresql://app:***@db:5432/x"
    assert mask_url("postgresql://app:p@ss@db/x") == "postgresql://app:***@db/x"
    assert mask_url("postgresql://app@db/x") == "postgresql://app@db/x"
    assert mask_url("sqlite:////srv/a@b.db") == "sqlite:////srv/a@b.db"
    assert mask_url("memory://") == "memory://"
    assert set(url_secrets("postgresql://app:pa%40ss@db/x")) == {"pa%40ss", "pa@ss"}
    assert url_secrets("postgresql://app@db/x") == ()


# -- malformed URLs ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("sqlite://[::1/x.db", "is malformed: Invalid IPv6 URL (a '[' or ']' without its pair"),
        ("postgresql://u@h]/db", "is malformed: Invalid IPv6 URL"),
        ("postgresql://u@h:port/db", "has a bad port: Port could not be cast"),
        ("postgresql://u:a/b@h/db", "its password is cut short by a '/'"),
    ],
)
def test_a_malformed_url_is_a_config_error_naming_the_problem(url: str, problem: str) -> None:
    with pytest.raises(StoreConfigError) as caught:
        open_store(url)
    assert problem in str(caught.value)
    assert caught.value.__cause__ is None  # urllib's ValueError is not dragged along


# -- ids and keys: the same limits on every backend -----------------------------------------------


def cyclic() -> list[Any]:
    value: list[Any] = []
    value.append(value)
    return value


def deep(depth: int) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = {"down": value}
    return value


MADE: dict[str, Any] = {
    # Made inside the handler: the run's input could not carry them.
    "cyclic": cyclic,
    "5000-deep": lambda: deep(5000),
    "empty": lambda: "",
    "not-text": lambda: 7,
    "lone-surrogate": lambda: "k\ud800",
    "nul": lambda: "k\x00",
    "too-long": lambda: "k" * (MAX_KEY_BYTES + 1),
}


class Writes(Executor):
    """Stages ``before = 1``, then does what the message says: ``("set", key, value)``,
    ``("delete", key)``, ``("send", value)`` or ``("output", value)``, where a key or value named
    in ``MADE`` is made in the handler."""

    @handler
    async def act(self, order: tuple[Any, ...], ctx: WorkflowContext[Any, Any]) -> None:
        ctx.set_state("before", 1)
        verb, *args = (MADE[a]() if isinstance(a, str) and a in MADE else a for a in order)
        if verb == "set":
            ctx.set_state(args[0], args[1])
        elif verb == "delete":
            ctx.delete_state(args[0])
        elif verb == "send":
            await ctx.send_message(args[0])
        elif verb == "output":
            await ctx.yield_output(args[0])


class Takes(Executor):
    @handler
    async def take(self, message: Any, ctx: WorkflowContext[Any, Any]) -> None:
        ctx.set_state("taken", True)


def workflow(store: EventStore, instance_id: str = "hostile") -> Workflow:
    builder = WorkflowBuilder(start_executor=Writes("w"), store=store, instance_id=instance_id)
    return builder.add_edge("w", Takes("t")).build()


async def assert_still_usable(store: EventStore, instance_id: str = "hostile") -> None:
    """A normal run on the instance succeeds, and every superstep in its log is closed."""
    wf = workflow(store, instance_id)
    await wf.run(("set", "fine", "yes"))
    assert wf.committed_state()["fine"] == "yes"
    started = [e for e in wf.events() if e.type == "superstep_started"]
    closed = [e for e in wf.events() if e.type in ("superstep_committed", "superstep_aborted")]
    assert len(started) == len(closed)


BAD_IDS = {
    "empty": "",
    "not-text": 42,
    "lone-surrogate": "a\udc80",
    "nul": "a\x00b",
    "too-long": "é" * (MAX_ID_BYTES // 2 + 1),  # 202 bytes in UTF-8, 101 characters
    "ten-kilobytes": "x" * 10_000,
}
WHY = {
    "empty": "must be a non-empty str",
    "not-text": "must be a str, not int",
    "lone-surrogate": "must be valid Unicode text",
    "nul": "must not hold a NUL character",
    "too-long": f"must be at most {MAX_ID_BYTES} bytes in UTF-8 (it is 202)",
    "ten-kilobytes": f"must be at most {MAX_ID_BYTES} bytes in UTF-8 (it is 10000)",
}


@pytest.mark.parametrize("name", list(BAD_IDS))
async def test_a_bad_instance_id_is_refused_the_same_way_on_every_backend(
    store_url: str, name: str
) -> None:
    bad = BAD_IDS[name]
    with open_store(store_url) as store:
        why = re.escape(WHY[name])
        with pytest.raises(DefinitionError, match=f"instance_id {why}"):
            workflow(store, bad)
        with pytest.raises(InvalidBatchError, match=why):
            store.append(bad, one_event("x").events(), expected_version=0)  # type: ignore[arg-type]
        for read in (store.read, store.version, lambda i: store.read_ranges(i, [(0, 1)])):
            if "bytes in UTF-8" in WHY[name]:  # read at any length: older ids stay readable
                assert not read(bad)
                continue
            with pytest.raises(StoreConfigError, match=why):
                read(bad)
        origin = workflow(store)
        await origin.run(("set", "k", 1))
        with pytest.raises(ExecutionError, match=f"a fork's instance id {why}"):
            origin.fork(at=origin.events()[-1].position, instance_id=bad)  # type: ignore[arg-type]
        assert store.instances() == ["hostile"]
        await assert_still_usable(store)


async def test_the_longest_ids_and_keys_work_on_every_backend_views_included(
    store_url: str,
) -> None:
    from projections import VIEW_NAMES, Projector

    instance_id = "\u4e00" * (MAX_ID_BYTES // 3) + "ab"  # 200 bytes in UTF-8
    key = os.urandom(MAX_KEY_BYTES // 2).hex()  # 1,000 bytes that do not compress
    assert len(instance_id.encode()) == MAX_ID_BYTES
    with open_store(store_url) as store:
        wf = workflow(store, instance_id)
        await wf.run(("set", key, "v"))
        assert wf.committed_state()[key] == "v"
        fork = wf.fork(at=wf.events()[-1].position, instance_id=instance_id[:-1] + "c")
        assert fork.committed_state()[key] == "v"
        projector = Projector(store, list(VIEW_NAMES))
        projector.catch_up()
        assert all(projector.position(name) > 0 for name in VIEW_NAMES)


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("empty", "must be a non-empty str"),
        ("not-text", "must be a str, not int"),
        ("lone-surrogate", "must be valid Unicode text"),
        ("nul", "must not hold a NUL character"),
        ("too-long", f"must be at most {MAX_KEY_BYTES} bytes"),
    ],
)
@pytest.mark.parametrize("verb", ["set", "delete"])
async def test_a_bad_state_key_fails_the_executor_and_stages_nothing(
    store_url: str, key: Any, why: str, verb: str
) -> None:
    with open_store(store_url) as store:
        wf = workflow(store)
        with pytest.raises(EncodingError, match=f"state key {re.escape(why)}"):
            await wf.run((verb, key, 1))
        assert kinds(wf.events())[-3:] == ["executor_failed", "superstep_aborted", "run_failed"]
        assert [e.key for e in wf.events() if e.type == "state_staged"] == ["before"]
        await assert_still_usable(store)


# -- values that cannot be stored ---------------------------------------------------------------


@pytest.mark.parametrize("make", ["cyclic", "5000-deep"])
@pytest.mark.parametrize(
    ("verb", "what"),
    [("set", "state key 'k'"), ("send", "message from 'w'"), ("output", "output of 'w'")],
)
async def test_an_unstorable_value_is_recorded_as_the_executors_failure(
    store_url: str, make: Any, verb: str, what: str
) -> None:
    with open_store(store_url) as store:
        wf = workflow(store)
        order = ("set", "k", make) if verb == "set" else (verb, make)
        with pytest.raises(EncodingError) as caught:
            await wf.run(order)
        message = str(caught.value)
        assert message.startswith(f"cannot encode {what}")
        assert "nests more than 200 levels deep (or contains itself)" in message
        assert len(message) < 400  # the path down is cut short, not 200 steps long
        assert kinds(wf.events())[-3:] == ["executor_failed", "superstep_aborted", "run_failed"]
        failed = next(e for e in wf.events() if e.type == "executor_failed")
        assert failed.error.type == "kernel.EncodingError"
        assert "taken" not in wf.committed_state()
        await assert_still_usable(store)


@pytest.mark.parametrize("make", [cyclic, lambda: deep(5000)], ids=["cyclic", "5000-deep"])
async def test_an_unstorable_run_input_is_refused_before_anything_is_appended(
    store_url: str, make: Any
) -> None:
    with open_store(store_url) as store:
        wf = workflow(store)
        with pytest.raises(EncodingError, match="cannot encode the run's input message"):
            await wf.run(("send", make()))
        assert store.version("hostile") == 0
        await assert_still_usable(store)


def test_a_stored_row_nested_deeper_than_json_readers_go_is_a_decode_error() -> None:
    state = b"[" * 5000 + b"]" * 5000
    with pytest.raises(DecodeError, match=r"'i'#1\.\.2 is not valid JSON"):
        RowMapper().decode_row("i", 2, "2", state)


# -- another application's SQLite file ----------------------------------------------------------


def foreign_file(path: Path) -> Path:
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
        db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, customer INTEGER)")
        db.execute("INSERT INTO customers (name) VALUES ('Ada')")
    return path


def journal_mode(path: Path) -> str:
    with closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)) as db:
        return str(db.execute("PRAGMA journal_mode").fetchone()[0])


def test_another_applications_file_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = foreign_file(tmp_path / "app.db")
    before, mode = path.read_bytes(), journal_mode(path)
    with pytest.raises(StoreConfigError) as caught:
        open_store(f"sqlite:///{path}")
    assert "another application's SQLite database" in str(caught.value)
    assert "'customers', 'orders'" in str(caught.value)
    assert "adopt=True" in str(caught.value)
    assert path.read_bytes() == before
    assert journal_mode(path) == mode == "delete"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]  # no -wal, -shm or .lock


async def test_another_applications_file_is_shared_when_adopted(tmp_path: Path) -> None:
    path = foreign_file(tmp_path / "app.db")
    with open_store(f"sqlite:///{path}", adopt=True) as store:
        await assert_still_usable(store)
    with open_store(f"sqlite:///{path}") as store:  # a steplog store now: no adopt needed
        assert store.instances() == ["hostile"]
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT name FROM customers").fetchall() == [("Ada",)]


# -- read-only SQLite stores ----------------------------------------------------------------


def one_event(instance_id: str) -> LogBuilder:
    log = LogBuilder(instance_id)
    log.write("k", None, executor_id="e", superstep="s", run="r")
    return log


async def make_store(url: str) -> None:
    with open_store(url) as store:
        await assert_still_usable(store)


async def test_a_store_opened_with_mode_ro_reads_and_refuses_writes(sqlite_url: str) -> None:
    await make_store(sqlite_url)
    path = Path(sqlite_path(sqlite_url))
    before = path.read_bytes()  # noqa: ASYNC240 - a test's own small file
    with open_store(f"{sqlite_url}?mode=ro") as store:
        assert store.read_only
        assert store.instances() == ["hostile"]
        assert store.version("hostile") == len(store.read("hostile")) > 0
        assert store.read_all()
        with pytest.raises(StoreUnavailableError, match="opened read-only"):
            one_event("other").append_to(store)
    assert path.read_bytes() == before  # noqa: ASYNC240


async def test_read_only_opens_sqlite_with_mode_ro_and_leaves_no_file_behind(
    sqlite_url: str,
) -> None:
    """``open_store(url, read_only=True)`` reads through ``mode=ro`` connections: writes are
    refused, the file's bytes and time never change, and the empty ``-wal`` and ``-shm`` SQLite
    makes to read a WAL-mode file are gone after ``close``."""
    await make_store(sqlite_url)
    path = Path(sqlite_path(sqlite_url))
    before = (path.read_bytes(), path.stat().st_mtime_ns)  # noqa: ASYNC240
    with open_store(sqlite_url, read_only=True) as store:
        assert store.read_only
        assert store.instances() == ["hostile"]
        with pytest.raises(StoreUnavailableError, match="opened read-only"):
            one_event("other").append_to(store)
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before  # noqa: ASYNC240
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


async def test_a_reader_leaves_its_wal_files_to_a_connection_that_opened_after_it(
    sqlite_url: str,
) -> None:
    """The ``-wal`` and ``-shm`` a reader made are used by a connection opened after it (here
    in the same process, where POSIX locks do not conflict): the reader's close leaves them to
    it, and that connection's writes and close work as usual."""
    await make_store(sqlite_url)
    path = Path(sqlite_path(sqlite_url))
    shm = path.with_name(f"{path.name}-shm")
    reader = open_store(sqlite_url, read_only=True)
    assert reader.instances() == ["hostile"]
    assert shm.exists()  # made by SQLite for the mode=ro reader
    with closing(sqlite3.connect(path, isolation_level=None)) as other:
        assert other.execute("SELECT count(*) FROM steplog_events").fetchone()[0] > 0
        reader.close()
        assert shm.exists()  # in use by the other connection: left
        other.execute("CREATE TABLE steplog_later (x)")
        other.execute("INSERT INTO steplog_later VALUES (1)")
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT x FROM steplog_later").fetchall() == [(1,)]


def test_a_missing_store_opened_with_mode_ro_is_not_created(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="does not exist"):
        open_store(f"sqlite:///{tmp_path}/none.db?mode=ro")
    assert list(tmp_path.iterdir()) == []


_READ_IN_CHILD = """
import json, sys
from kernel import StepLogError, open_store
from kernel.testing import LogBuilder
out = {}
try:
    with open_store(sys.argv[1], create=False) as store:
        out["read_only"] = store.read_only
        out["instances"] = store.instances()
        out["events"] = len(store.read("hostile"))
        out["version"] = store.version("hostile")
        out["all"] = len(store.read_all())
        try:
            log = LogBuilder("other")
            log.write("k", None, executor_id="e", superstep="s", run="r")
            log.append_to(store)
            out["write"] = "written"
        except StepLogError as error:
            out["write"] = type(error).__name__ + ": " + str(error)
except StepLogError as error:
    out["error"] = type(error).__name__ + ": " + str(error)
print(json.dumps(out))
"""


def in_a_child_without_write_permission(args: list[str]) -> subprocess.CompletedProcess[str]:
    """Run Python with ``args`` in a child that, even as root, cannot write read-only files."""
    as_root = os.geteuid() == 0
    try:
        return subprocess.run(
            [sys.executable, *args],
            preexec_fn=_without_file_permission_override if as_root else None,
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    except subprocess.SubprocessError as error:
        if as_root:
            pytest.skip(f"running as root and cannot drop CAP_DAC_OVERRIDE in a child: {error}")
        raise


@pytest.mark.parametrize("locked", ["file", "file-and-directory"])
async def test_a_read_only_store_can_be_read_and_refuses_writes(
    tmp_path: Path, locked: str
) -> None:
    directory = tmp_path / "ro"
    directory.mkdir()
    url = f"sqlite:///{directory}/steplog.db"
    await make_store(url)
    path = directory / "steplog.db"
    before = path.read_bytes()
    path.chmod(0o444)
    if locked == "file-and-directory":
        directory.chmod(0o555)
    try:
        done = in_a_child_without_write_permission(["-c", _READ_IN_CHILD, url])
    finally:
        directory.chmod(0o755)
    assert done.returncode == 0, done.stderr
    out = orjson.loads(done.stdout)
    assert "error" not in out, out
    assert out["read_only"] is True
    assert out["instances"] == ["hostile"]
    assert out["events"] == out["version"] == out["all"] > 0
    assert out["write"].startswith("StoreUnavailableError: ")
    assert "opened read-only" in out["write"]
    assert path.read_bytes() == before
