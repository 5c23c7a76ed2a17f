"""Store errors: every failure is a ``StoreError`` subclass whose message says what to do."""

from __future__ import annotations

import ctypes
import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import psycopg_pool
import pytest
from eventsourcing.persistence import PersistenceError, StoredEvent
from psycopg import sql

import kernel
from kernel import (
    ConcurrencyConflictError,
    DecodeError,
    EncodingError,
    ErrorInfo,
    EventBase,
    EventStore,
    InvalidBatchError,
    LogIntegrityError,
    SchemaVersionError,
    StateStaged,
    StepLogError,
    StoreBusyError,
    StoreConfigError,
    StoreDamagedError,
    StoreError,
    StoreNotFoundError,
    StoreUnavailableError,
    open_store,
)
from kernel._store._postgres import postgres_params
from kernel._store._sqlite import sqlite_path
from kernel.testing import LogBuilder


def staged(position: int = 1, value: Any = 1) -> StateStaged:
    log = LogBuilder("a", clock=lambda: datetime(2024, 1, 1, tzinfo=UTC), version=position - 1)
    return log.write("k", value, executor_id="e", superstep="s", run="r")


EXCEPTIONS = [
    value
    for value in map(kernel.__dict__.get, kernel.__all__)
    if isinstance(value, type) and issubclass(value, BaseException)
]


def test_every_error_class_derives_from_steplog_error() -> None:
    assert len(EXCEPTIONS) >= 18
    assert [c for c in EXCEPTIONS if not issubclass(c, StepLogError)] == []
    store_errors = [ConcurrencyConflictError, DecodeError, SchemaVersionError, StoreConfigError,
                    StoreUnavailableError, StoreNotFoundError, InvalidBatchError]  # fmt: skip
    assert all(issubclass(c, StoreError) for c in store_errors)
    assert issubclass(StoreNotFoundError, StoreUnavailableError)
    assert not issubclass(InvalidBatchError, StoreConfigError)


def test_public_classes_report_the_package_not_a_private_module() -> None:
    public = [value for value in map(kernel.__dict__.get, kernel.__all__)
              if isinstance(value, type) and (issubclass(value, (BaseException, EventBase))
                                              or value is ErrorInfo)]  # fmt: skip
    assert len(public) >= 35
    assert {c.__qualname__: c.__module__ for c in public} == {
        c.__qualname__: "kernel" for c in public
    }
    assert ErrorInfo.of(StoreNotFoundError("gone")).type == "kernel.StoreNotFoundError"


# -- URLs and options -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://localhost/db", "unknown store URL 'mysql://localhost/db'"),
        ("events.db", "unknown store URL"),
        ("", "non-empty string"),
        ("sqlite://server/events.db", "names a host ('server')"),
        ("sqlite:///", "names no file"),
        ("sqlite:////tmp/", "names no file"),
        ("sqlite:///:memory:", "use memory://"),
        ("sqlite:////tmp/x.db?cache=shared", "takes no query parameter but mode=ro"),
        ("postgresql://postgres@127.0.0.1:5432", "names no database"),
        ("postgresql://postgres@127.0.0.1:5432/", "names no database"),
        ("postgresql://postgres@127.0.0.1:5432/test?schema=bad-name", "'bad-name' is not a plain"),
        (
            "postgresql://postgres@127.0.0.1:5432/test?schema=x;drop",
            "is not a plain SQL identifier",
        ),
        ("postgresql://postgres@127.0.0.1:5432/test?sslmode=require", "['sslmode'] (only schema)"),
        ("postgresql://postgres@127.0.0.1:99999/test", "has a bad port"),
    ],
)
def test_a_wrong_url_is_a_config_error(url: str, message: str) -> None:
    with pytest.raises(StoreConfigError) as caught:
        open_store(url)
    assert message in str(caught.value)


def test_a_url_that_is_not_a_string_is_a_config_error() -> None:
    with pytest.raises(StoreConfigError, match="non-empty string"):
        open_store(42)  # type: ignore[arg-type]


def test_an_unknown_option_is_a_config_error(store_url: str) -> None:
    with pytest.raises(StoreConfigError, match="bogus"):
        open_store(store_url, bogus=1)


# -- SQLite files ---------------------------------------------------------------------------


def test_a_missing_directory_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(StoreUnavailableError, match="does not exist; create it"):
        open_store(f"sqlite:///{tmp_path}/missing/steplog.db")


def test_a_parent_that_is_a_file_is_unavailable(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("not a directory")
    with pytest.raises(StoreUnavailableError, match="does not exist"):
        open_store(f"sqlite:///{tmp_path}/plain/steplog.db")


def test_a_path_that_is_a_directory_is_unavailable(tmp_path: Path) -> None:
    (tmp_path / "adir").mkdir()
    with pytest.raises(StoreUnavailableError, match="unable to open database file; check"):
        open_store(f"sqlite:///{tmp_path}/adir")


def test_a_file_that_is_not_a_database_is_damaged(tmp_path: Path) -> None:
    (tmp_path / "junk.db").write_bytes(b"this is not a SQLite file\n" * 200)
    with pytest.raises(StoreDamagedError, match=r"junk\.db is damaged: it is not"):
        open_store(f"sqlite:///{tmp_path}/junk.db")


def test_damage_is_told_by_the_driver_code_for_both_drivers() -> None:
    """``StoreDamagedError.detects`` is the one rule (the kernel's adapters and the view
    backends ask it): SQLite's SQLITE_CORRUPT and SQLITE_NOTADB (extended codes too) and
    PostgreSQL's data_corrupted and index_corrupted, through the causes eventsourcing wraps."""
    corrupt = sqlite3.DatabaseError("database disk image is malformed")
    corrupt.sqlite_errorcode = 11 | (1 << 8)  # type: ignore[attr-defined]  # SQLITE_CORRUPT_VTAB
    wrapped = RuntimeError("wrapped")
    wrapped.__cause__ = corrupt
    assert StoreDamagedError.detects(wrapped)
    assert StoreDamagedError.detects(psycopg.errors.DataCorrupted("x"))
    assert StoreDamagedError.detects(psycopg.errors.IndexCorrupted("x"))
    assert not StoreDamagedError.detects(psycopg.errors.SerializationFailure("x"))
    busy = sqlite3.OperationalError("database is locked")
    busy.sqlite_errorcode = 5  # type: ignore[attr-defined]
    assert not StoreDamagedError.detects(busy)
    assert issubclass(StoreDamagedError, StoreUnavailableError)


def _without_file_permission_override() -> None:  # pragma: no cover - runs in the child
    """Drop the capabilities that let root ignore file modes (CAP_DAC_OVERRIDE, ...)."""
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2, 3):  # DAC_OVERRIDE, DAC_READ_SEARCH, FOWNER
        if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")


_TRY_TO_APPEND = """
import json, sys
from kernel import StepLogError, open_store
from kernel.testing import LogBuilder
log = LogBuilder("a")
log.write("k", None, executor_id="e", superstep="s", run="r")
try:
    with open_store(sys.argv[1]) as store:
        log.append_to(store)
    print(json.dumps(["ok", ""]))
except StepLogError as error:
    print(json.dumps([type(error).__name__, str(error)]))
"""


def append_in_a_child(url: str) -> tuple[str, str]:
    """Try to append from a child process that, even as root, cannot write read-only files."""
    as_root = os.geteuid() == 0
    try:
        done = subprocess.run(
            [sys.executable, "-c", _TRY_TO_APPEND, url],
            preexec_fn=_without_file_permission_override if as_root else None,
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    except subprocess.SubprocessError as error:
        if as_root:
            pytest.skip(f"running as root and cannot drop CAP_DAC_OVERRIDE in a child: {error}")
        raise
    assert done.returncode == 0, done.stderr
    kind, message = json.loads(done.stdout)
    return kind, message


def test_a_read_only_file_is_unavailable(sqlite_url: str) -> None:
    open_store(sqlite_url).close()
    Path(sqlite_path(sqlite_url)).chmod(0o444)
    kind, message = append_in_a_child(sqlite_url)
    assert kind == "StoreUnavailableError"
    assert "readonly database; check that the file and its directory" in message


def test_a_read_only_directory_is_unavailable(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    kind, message = append_in_a_child(f"sqlite:///{locked}/steplog.db")
    assert kind == "StoreUnavailableError"
    assert "unable to open database file; check" in message


# -- schema versions ------------------------------------------------------------------------


def stamp_schema_version(url: str, version: int | str) -> None:
    """Write ``version`` into the store's ``steplog_meta`` table, as a newer steplog would."""
    if url.startswith("sqlite:"):
        with closing(sqlite3.connect(sqlite_path(url))) as db, db:
            db.execute(
                "UPDATE steplog_meta SET value=? WHERE key='schema_version'", (str(version),)
            )
        return
    p = postgres_params(url)
    table = sql.Identifier(p["schema"], "steplog_meta")
    with psycopg.connect(dbname=p["dbname"], host=p["host"], port=p["port"], user=p["user"],
                         password=p["password"] or None, autocommit=True) as conn:  # fmt: skip
        conn.execute(
            sql.SQL("UPDATE {} SET value=%s WHERE key='schema_version'").format(table),
            (str(version),),
        )


def test_a_store_written_by_a_newer_steplog_is_refused(durable_store_url: str) -> None:
    open_store(durable_store_url).close()
    stamp_schema_version(durable_store_url, 999)
    with pytest.raises(SchemaVersionError) as caught:
        open_store(durable_store_url)
    assert "schema version 999" in str(caught.value)
    assert "upgrade steplog" in str(caught.value)


@pytest.mark.parametrize("stamp", ["2.0", "²", "seven"])
def test_a_malformed_schema_version_is_a_store_error(durable_store_url: str, stamp: str) -> None:
    open_store(durable_store_url).close()
    stamp_schema_version(durable_store_url, stamp)
    with pytest.raises(StoreError, match="malformed schema version"):
        open_store(durable_store_url)


# -- PostgreSQL servers ---------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_an_unreachable_server_is_unavailable() -> None:
    with pytest.raises(StoreUnavailableError) as caught:
        open_store("postgresql://postgres@127.0.0.1:1/test", connect_timeout=2)
    assert "cannot reach PostgreSQL for postgresql://postgres@127.0.0.1:1/test" in str(caught.value)
    assert "check that the server is running" in str(caught.value)
    assert isinstance(caught.value.__cause__, psycopg.OperationalError)


@pytest.mark.timeout(30)
def test_a_password_never_appears_in_an_error() -> None:
    with pytest.raises(StoreUnavailableError) as caught:
        open_store("postgresql://postgres:s3cret@127.0.0.1:1/test", connect_timeout=2)
    assert "s3cret" not in str(caught.value)
    assert "postgres:***@127.0.0.1:1" in str(caught.value)


# -- closed stores --------------------------------------------------------------------------

USES: dict[str, Callable[[EventStore], object]] = {
    "append": lambda s: s.append("a", [staged()], expected_version=0),
    "read": lambda s: s.read("a"),
    "version": lambda s: s.version("a"),
    "read_all": lambda s: s.read_all(),
    "iter_all": lambda s: list(s.iter_all()),
    "last_position": lambda s: s.last_position(),
    "instances": lambda s: s.instances(),
    "follow": lambda s: next(s.follow()),
}


def test_a_closed_store_is_unavailable(store: EventStore) -> None:
    store.append("a", [staged()], expected_version=0)
    store.close()
    store.close()  # closing twice is harmless
    failures = {}
    for name, use in USES.items():
        with pytest.raises(StoreUnavailableError) as caught:
            use(store)
        failures[name] = "is closed" in str(caught.value)
    assert failures == dict.fromkeys(USES, True)


# -- events that cannot be written or read --------------------------------------------------


@pytest.mark.parametrize("value", [object(), {"nested": [2**64]}], ids=["object", "huge-int"])
def test_a_value_that_is_not_a_json_tree_is_an_encoding_error(
    store: EventStore, value: Any
) -> None:
    with pytest.raises(EncodingError, match="encode them with ValueCodec first"):
        store.append("a", [staged(value=value)], expected_version=0)
    assert store.read_all() == []


def plant(store: EventStore, topic: str, state: bytes) -> None:
    stored = StoredEvent(originator_id="a", originator_version=1, topic=topic, state=state)
    store.recorder.insert_events([stored])


def row(**fields: Any) -> bytes:
    """A ``state_staged@1`` payload as the mapper writes it, with ``fields`` changed."""
    payload = {"timestamp": "2024-01-01T00:00:00+00:00", "run_id": "r", "superstep_id": "s",
               "executor_id": "e", "key": "k", "op": "set", "value": 1, **fields}  # fmt: skip
    return json.dumps(payload).encode()


UNREADABLE = {
    "unknown-type": ("state_forgotten@1", b"{}", DecodeError, "unknown type 'state_forgotten'"),
    "newer-schema": ("state_staged@7", b"{}", SchemaVersionError, "schema version 7, newer than"),
    "malformed-topic": ("state_staged@x", row(), DecodeError, "malformed topic 'state_staged@x'"),
    "not-json": ("state_staged@1", b"{not json", DecodeError, "is not valid JSON"),
    "wrong-shape": ("state_staged@1", b'{"key": 1}', DecodeError, "does not fit its schema"),
    "a-list": ("state_staged@1", b"[1, 2]", DecodeError, "is not a JSON object but a list"),
    "a-string": ("state_staged@1", b'"k"', DecodeError, "is not a JSON object but a str"),
    "null": ("state_staged@1", b"null", DecodeError, "is not a JSON object but a NoneType"),
    "int-for-str": ("state_staged@1", row(key=5), DecodeError, "field 'key' is a int"),
    "str-for-int": ("superstep_started@1", row(index="5"), DecodeError, "field 'index' is a str"),
    "below-minimum": ("superstep_started@1", row(index=0), DecodeError, "less than 1"),
    "bad-literal": ("state_staged@1", row(op="exec"), DecodeError, "field 'op' is 'exec'"),
    "other-type": ("state_staged@1", row(type="run_completed"), DecodeError, "field 'type'"),
    "bad-list-item": ("message_staged@1", row(source="e", targets=["a", 1]), DecodeError,
                      "'targets' holds an item that is not a str"),
    "bad-error": ("executor_failed@1", row(error={"type": 1, "message": "m"}), DecodeError,
                  "field 'error'"),
    "error-not-object": ("state_staged@1", row(error="x"), DecodeError, "field 'error' is 'x'"),
    "unicode-digit-version": ("state_staged@²", row(), DecodeError, "malformed topic"),
    "bad-timestamp": ("state_staged@1", row(timestamp="yesterday"), DecodeError,
                      "timestamp 'yesterday' is not an ISO 8601"),
    "naive-timestamp": ("state_staged@1", row(timestamp="2024-01-01T00:00:00"), DecodeError,
                        "has no time zone"),
    "number-timestamp": ("state_staged@1", row(timestamp=1704067200), DecodeError,
                         "timestamp is 1704067200, not an ISO 8601 string"),
}  # fmt: skip


@pytest.mark.parametrize("case", UNREADABLE, ids=list(UNREADABLE))
def test_an_unreadable_event_is_a_decode_error_naming_its_position(
    store: EventStore, case: str
) -> None:
    topic, state, error, message = UNREADABLE[case]
    plant(store, topic, state)
    for read in (lambda: store.read("a"), lambda: store.read_all(), lambda: list(store.follow())):
        with pytest.raises(error) as caught:
            read()
        assert "'a'#1" in str(caught.value)
        assert message in str(caught.value)


def test_a_row_of_the_first_format_planted_in_a_chained_store_is_refused(
    store: EventStore,
) -> None:
    """A well-formed row of the format before the chain (as the mapper wrote it), planted in a
    store stamped as chained, is refused: it could only have been written around steplog (issue
    21). Such rows in a store written before the chain read back (``test_format1.py``)."""
    plant(store, "state_staged@1", row())
    assert store._mapper.decode("a", 1, "state_staged@1", row()) == staged()
    for read in (lambda: store.read("a"), lambda: store.read_all()):
        with pytest.raises(LogIntegrityError) as caught:
            read()
        assert (caught.value.instance_id, caught.value.position) == ("a", 1)
        assert caught.value.kind == "unchained"


# -- driver errors are all translated -------------------------------------------------------


def subclasses(root: type[BaseException]) -> set[type[BaseException]]:
    found = {root}
    for sub in root.__subclasses__():
        found |= subclasses(sub)
    return found


def translated(store: EventStore, error: BaseException) -> BaseException:
    """What ``error`` becomes when the store's recorder raises it (reading the last position)."""

    def fail() -> None:
        raise error

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(store.recorder, "max_notification_id", fail)
        try:
            store.last_position()
        except BaseException as caught:
            return caught
    raise AssertionError("the store did not raise")


def untranslated(store: EventStore, roots: list[type[BaseException]]) -> list[str]:
    """The error classes under ``roots`` that do not become a StoreError caused by them."""
    missed = []
    for cls in sorted(set().union(*map(subclasses, roots)), key=lambda c: c.__qualname__):
        error = cls("probe failure")
        result = translated(store, error)
        if not isinstance(result, StoreError) or result.__cause__ is not error:
            missed.append(f"{cls.__module__}.{cls.__qualname__} -> {type(result).__name__}")
    return missed


def test_every_eventsourcing_persistence_error_is_translated(store: EventStore) -> None:
    assert untranslated(store, [PersistenceError]) == []


def test_every_driver_error_is_translated(durable_store_url: str) -> None:
    roots: list[type[BaseException]] = (
        [sqlite3.Error] if durable_store_url.startswith("sqlite:") else [psycopg.Error]
    )
    with open_store(durable_store_url) as store:
        assert untranslated(store, roots) == []


_PG = pytest.mark.postgres


@pytest.mark.parametrize(
    ("backend", "make"),
    [
        pytest.param("sqlite", lambda: sqlite3.OperationalError("database is locked"),
                     id="sqlite-locked"),
        pytest.param("sqlite", lambda: sqlite3.OperationalError("attempt to write a readonly db"),
                     id="sqlite-readonly"),
        pytest.param("postgres", lambda: psycopg.OperationalError("server closed the connection"),
                     id="pg-connection-lost", marks=_PG),
        pytest.param("postgres", lambda: psycopg_pool.PoolTimeout("couldn't get a connection"),
                     id="pg-pool-timeout", marks=_PG),
    ],
)  # fmt: skip
def test_lost_connections_and_locks_mean_unavailable(
    request: pytest.FixtureRequest, backend: str, make: Callable[[], BaseException]
) -> None:
    with open_store(request.getfixturevalue(f"{backend}_url")) as store:
        error = translated(store, make())
    assert isinstance(error, StoreUnavailableError)
    assert str(error).startswith("cannot read the global log in ")


# -- hints come from error codes, never from messages ----------------------------------------


def coded(code: int, message: str) -> sqlite3.OperationalError:
    """A sqlite3 error with result code ``code`` (as SQLite sets it) and any message."""
    error = sqlite3.OperationalError(message)
    error.sqlite_errorcode = code
    return error


@pytest.mark.parametrize(
    ("error", "hint"),
    [
        pytest.param(coded(8, "database is locked"), "writable by this user", id="readonly-code"),
        pytest.param(coded(5, "attempt to write a readonly database"), "holds the database lock",
                     id="busy-code"),
        pytest.param(coded(26, "no such thing"), "is damaged: it is not a SQLite database",
                     id="notadb-code"),
        pytest.param(coded(8 | (4 << 8), "moved"), "writable by this user", id="extended-code"),
    ],
)  # fmt: skip
def test_sqlite_hints_follow_the_error_code_not_the_message(
    sqlite_url: str, error: sqlite3.Error, hint: str
) -> None:
    with open_store(sqlite_url) as store:
        result = translated(store, error)
    assert isinstance(result, StoreUnavailableError)
    assert result.__cause__ is error
    _, _, given = str(result).partition(f"{error}; ")
    assert hint in given  # in the hint, not in the driver's message


def test_a_missing_table_in_sqlite_is_a_store_error_not_unavailable(sqlite_url: str) -> None:
    with open_store(sqlite_url) as store:
        with closing(sqlite3.connect(sqlite_path(sqlite_url))) as db, db:
            db.execute("DROP TABLE steplog_events")
        with pytest.raises(StoreError, match="no such table") as caught:
            store.read("a")
    assert not isinstance(caught.value, StoreUnavailableError)


def test_a_database_held_by_another_process_is_unavailable(sqlite_url: str) -> None:
    open_store(sqlite_url).close()
    with closing(sqlite3.connect(sqlite_path(sqlite_url), isolation_level=None)) as holder:
        holder.execute("BEGIN EXCLUSIVE")
        with (
            open_store(sqlite_url, lock_timeout=1) as store,
            pytest.raises(StoreUnavailableError, match="another process holds the database lock"),
        ):
            store.append("a", [staged()], expected_version=0)
        holder.execute("ROLLBACK")


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("error", "kind", "hint"),
    [
        pytest.param(psycopg.errors.InsufficientPrivilege("denied"), StoreUnavailableError,
                     "lacks a privilege", id="42501"),
        pytest.param(psycopg.errors.AdminShutdown("bye"), StoreUnavailableError,
                     "check that the server is running", id="57P01"),
        pytest.param(psycopg.errors.LockNotAvailable("busy"), StoreBusyError,
                     "another session holds a lock", id="55P03"),
        pytest.param(psycopg.errors.SerializationFailure("again"), StoreBusyError,
                     "serialization failure", id="40001"),
        pytest.param(psycopg.errors.UndefinedTable("gone"), StoreError, "gone", id="42P01"),
    ],
)  # fmt: skip
def test_postgres_hints_follow_the_sqlstate(
    postgres_url: str, error: psycopg.Error, kind: type[StoreError], hint: str
) -> None:
    with open_store(postgres_url) as store:
        result = translated(store, error)
    assert type(result) is kind
    assert hint in str(result)
