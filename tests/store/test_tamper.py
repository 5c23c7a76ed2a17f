"""Tamper evidence on real rows (issue 11): real workflows are run on SQLite and PostgreSQL, their
rows are then altered with sqlite3 / psycopg directly, the way someone with write access to the
database would, and the hash chain must say where and what.

Each instance's log (``run_orders``) is six batch rows::

    #1..2    run 1 started, superstep started
    #3..7    run 1's superstep stages "secret", fails: #6 is its abort marker, #7 the run failing
    #8..9    run 2 started, superstep started
    #10..15  run 2 stages "token" (#11), yields, commits (#14), completes
    #16..17  run 3 started, superstep started
    #18..23  run 3 stages "token" again, yields, commits, completes

Two instances are written and only ``orders`` is altered: the report must name it, not ``clean``.
For every alteration: ``verify_chain`` names the first bad position and its kind; ``read`` raises
``LogIntegrityError`` there, when a read can tell (an altered or removed end of the log is seen
only by ``verify_chain``, which compares it with the recorded head); ``allow_broken_chain=True``
reads it anyway and lists the problem in ``store.chain_problems``.
"""

from __future__ import annotations

import asyncio
import sqlite3
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import orjson
import psycopg
import pytest
from psycopg import sql

from kernel import (
    ChainHead,
    ConcurrencyConflictError,
    EventBase,
    EventStore,
    Executor,
    LogIntegrityError,
    StateStaged,
    SuperstepCommitted,
    WorkflowBuilder,
    WorkflowContext,
    counter_ids,
    fold_committed,
    handler,
    open_store,
)
from kernel._codec._mapper import RowMapper
from kernel._codec._rows import BATCH_CODES
from kernel.testing import ticking_clock
from projections import Projector, history_of

INSTANCE = "orders"
CLEAN = "clean"
SECRET = "s3cr3t"
CODE = {name: code for code, (name, _) in enumerate(BATCH_CODES)}
"""Each event type's current batch code (a later code of a type replaces an earlier one)."""
HEADER = 5
"""A batch row of format 2 is ``[2, base_us, offsets, strings, chain, event, ...]``."""


class Checkout(Executor):
    """Stages ``secret`` and fails for the order ``bad``; stages ``token`` for any other."""

    @handler
    async def charge(self, order: str, ctx: WorkflowContext[str, str]) -> None:
        if order == "bad":
            ctx.set_state("secret", SECRET)
            raise ConnectionError("payment provider timed out")
        ctx.set_state("token", f"tok-{order}")
        await ctx.yield_output(f"charged {order}")


async def run_orders(url: str) -> None:
    with open_store(url) as store:
        await write_orders(store)


async def write_orders(store: EventStore) -> None:
    """The two instances (run 1 of ``orders`` stages the secret at #3..7 and fails)."""
    from datetime import UTC, datetime

    for instance in (INSTANCE, CLEAN):
        wf = WorkflowBuilder(
            start_executor=Checkout(id="checkout"),
            store=store,
            instance_id=instance,
            clock=ticking_clock(datetime(2026, 12, 1, 9, 0, tzinfo=UTC)),
            id_factory=counter_ids(instance),
        ).build()
        await asyncio.gather(wf.run("bad"), return_exceptions=True)
        await wf.run("A-1")
        await wf.run("A-2")


@dataclass
class Row:
    """One batch row as stored: its last position, count (``topic``) and decoded JSON body."""

    last: int
    topic: str
    body: list[Any]

    @property
    def first(self) -> int:
        return self.last - int(self.topic) + 1


class Rows(Protocol):
    """Direct access to a store's tables, bypassing steplog."""

    def all(self) -> list[Row]: ...
    def put(self, last: int, state: bytes, *, new_last: int | None = None) -> None: ...
    def delete(self, last: int) -> None: ...
    def insert(self, last: int, topic: str, state: bytes) -> None: ...
    def drop_head(self) -> None: ...
    def set_head(self, position: int, digest: bytes) -> None: ...


class SQLiteRows:
    def __init__(self, url: str) -> None:
        self.path = url.removeprefix("sqlite:///")

    def _run(self, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with closing(sqlite3.connect(self.path)) as db, db:
            return db.execute(statement, params).fetchall()

    def all(self) -> list[Row]:
        found = self._run(
            "SELECT originator_version, topic, state FROM steplog_events "
            "WHERE originator_id = ? ORDER BY originator_version",
            (INSTANCE,),
        )
        return [Row(last, topic, orjson.loads(state)) for last, topic, state in found]

    def put(self, last: int, state: bytes, *, new_last: int | None = None) -> None:
        self._run(
            "UPDATE steplog_events SET originator_version = ?, state = ? "
            "WHERE originator_id = ? AND originator_version = ?",
            (last if new_last is None else new_last, state, INSTANCE, last),
        )

    def delete(self, last: int) -> None:
        self._run(
            "DELETE FROM steplog_events WHERE originator_id = ? AND originator_version = ?",
            (INSTANCE, last),
        )

    def insert(self, last: int, topic: str, state: bytes) -> None:
        self._run(
            "INSERT INTO steplog_events (originator_id, originator_version, topic, state) "
            "VALUES (?, ?, ?, ?)",
            (INSTANCE, last, topic, state),
        )

    def drop_head(self) -> None:
        self._run("DELETE FROM steplog_chain WHERE instance_id = ?", (INSTANCE,))

    def set_head(self, position: int, digest: bytes) -> None:
        self._run(
            "UPDATE steplog_chain SET position = ?, head = ? WHERE instance_id = ?",
            (position, digest, INSTANCE),
        )


class PostgresRows:
    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query))
        self.schema = query.pop("schema")
        self.server = urlunsplit(parts._replace(query=urlencode(query)))

    def _run(self, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        text = sql.SQL(statement).format(
            events=sql.Identifier(self.schema, "steplog_events"),
            heads=sql.Identifier(self.schema, "steplog_heads"),
        )
        with psycopg.connect(self.server, autocommit=True) as conn:
            cursor = conn.execute(text, params)
            return cursor.fetchall() if cursor.description else []

    def all(self) -> list[Row]:
        found = self._run(
            "SELECT originator_version, topic, state FROM {events} "
            "WHERE originator_id = %s ORDER BY originator_version",
            (INSTANCE,),
        )
        return [Row(last, topic, orjson.loads(bytes(state))) for last, topic, state in found]

    def put(self, last: int, state: bytes, *, new_last: int | None = None) -> None:
        self._run(
            "UPDATE {events} SET originator_version = %s, state = %s "
            "WHERE originator_id = %s AND originator_version = %s",
            (last if new_last is None else new_last, state, INSTANCE, last),
        )

    def delete(self, last: int) -> None:
        self._run(
            "DELETE FROM {events} WHERE originator_id = %s AND originator_version = %s",
            (INSTANCE, last),
        )

    def insert(self, last: int, topic: str, state: bytes) -> None:
        self._run(
            "INSERT INTO {events} (originator_id, originator_version, topic, state) "
            "VALUES (%s, %s, %s, %s)",
            (INSTANCE, last, topic, state),
        )

    def drop_head(self) -> None:
        self._run("UPDATE {heads} SET chain = NULL WHERE instance_id = %s", (INSTANCE,))

    def set_head(self, position: int, digest: bytes) -> None:
        self._run(
            "UPDATE {heads} SET version = %s, chain = %s WHERE instance_id = %s",
            (position, digest, INSTANCE),
        )


@dataclass
class Log:
    url: str
    rows: Rows

    def row_of(self, code: str, nth: int = 0) -> tuple[Row, int]:
        """The row holding the ``nth`` event of type ``code``, and its index in ``row.body``."""
        seen = 0
        for row in self.rows.all():
            for index in range(HEADER, len(row.body)):
                if row.body[index][0] == CODE[code]:
                    if seen == nth:
                        return row, index
                    seen += 1
        raise AssertionError(f"no {code} #{nth} in the log")

    def rewrite(self, row: Row) -> None:
        self.rows.put(row.last, orjson.dumps(row.body))


def sqlite_template(directory: Path) -> Path:
    """A SQLite store in ``directory`` holding the two instances (``run_orders``), to copy."""
    path = directory / "template.db"
    asyncio.run(run_orders(f"sqlite:///{path}"))
    return path


def written_log(url: str, template: Path | None = None) -> Log:
    """The two instances written to the (new) store at ``url``, and direct access to its rows.
    A SQLite store is a copy of ``template`` when given: the runs' clocks and ids are injected,
    so it holds the same rows a run would write."""
    if template is not None and url.startswith("sqlite"):
        target = url.removeprefix("sqlite:///")
        with closing(sqlite3.connect(template)) as source, closing(sqlite3.connect(target)) as copy:
            source.backup(copy)
    else:
        asyncio.run(run_orders(url))
    rows: Rows = SQLiteRows(url) if url.startswith("sqlite") else PostgresRows(url)
    layout = [(row.first, row.last) for row in rows.all()]
    assert layout == [(1, 2), (3, 7), (8, 9), (10, 15), (16, 17), (18, 23)]  # the docstring's
    return Log(url, rows)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sqlite_template(tmp_path_factory.mktemp("tamper"))


@pytest.fixture
def log(durable_store_url: str, request: pytest.FixtureRequest) -> Log:
    sqlite = durable_store_url.startswith("sqlite")
    return written_log(durable_store_url, request.getfixturevalue("template") if sqlite else None)


def _refused(log: Log, position: int, kind: str, *, read_kind: str | None = None) -> list[str]:
    """Check that the chain names ``orders``#``position`` as ``kind`` (a read as ``read_kind``,
    when it differs), that reads refuse it, and that ``allow_broken_chain`` reads it with the
    problem listed. Returns every kind ``verify_chain`` found at that position."""
    with open_store(log.url, create=False) as store:
        report = store.verify_chain()
        assert (report.ok, report.instances) == (False, 2)
        assert report.first_problem(CLEAN) is None, report.problems
        first = report.first_problem(INSTANCE)
        assert first is not None, report.problems
        assert (first.instance_id, first.position) == (INSTANCE, position), report.problems
        kinds = [p.kind for p in report.problems if p.position == position]
        assert kind in kinds, report.problems
        with pytest.raises(LogIntegrityError) as caught:
            store.read(INSTANCE)
        error = caught.value
        assert (error.instance_id, error.position, error.kind) == (
            INSTANCE,
            position,
            read_kind or kind,
        )
        assert f"{INSTANCE!r}#{position}" in str(error) or str(position) in str(error)
        with pytest.raises(LogIntegrityError):
            history_of(store, INSTANCE)  # the projections' folds read through the same check
        assert len(store.read(CLEAN)) == 23
        assert store.verify_chain(CLEAN).ok
    with open_store(log.url, create=False, allow_broken_chain=True) as store:
        assert store.read(INSTANCE)
        noted = [(p.instance_id, p.position, p.kind) for p in store.chain_problems]
        assert (INSTANCE, position, read_kind or kind) in noted
    return kinds


def _unnoticed_by_reads(log: Log) -> list[EventBase]:
    """The events of ``orders`` read without any complaint (a problem only verify finds)."""
    with open_store(log.url, create=False) as store:
        events = store.read(INSTANCE)
    with open_store(log.url, create=False, allow_broken_chain=True) as store:
        assert store.read(INSTANCE) == events
        assert store.chain_problems == []
    return events


def _only_problem(log: Log, **heads: Any) -> tuple[int, str]:
    with open_store(log.url, create=False) as store:
        report = store.verify_chain(**heads)
    assert report.first_problem(CLEAN) is None, report.problems
    assert len(report.problems) == 1, report.problems
    problem = report.problems[0]
    assert problem.instance_id == INSTANCE
    return problem.position, problem.kind


def test_the_untouched_log_verifies_and_reads(log: Log) -> None:
    with open_store(log.url, create=False) as store:
        report = store.verify_chain()
        assert report.ok, report.problems
        assert (report.instances, report.rows, report.events, report.unchained_events) == (
            2,
            12,
            46,
            0,
        )
        assert fold_committed(store.read(INSTANCE)).values == {"token": "tok-A-2"}


def test_an_edited_value_is_named_at_its_position(log: Log) -> None:
    row, index = log.row_of("state_staged", nth=1)  # run 2's write of token, #11
    assert row.body[index][-1] == "tok-A-1"
    row.body[index][-1] = "tok-EVIL"
    log.rewrite(row)
    assert _refused(log, 11, "edited") == ["edited"]


def rewrite_marker(log: Log, *, unchain: bool = False) -> Row:
    """Turn run 1's abort marker (#6) into a commit marker, as someone editing the row would;
    with ``unchain``, also drop the row's hashes (batch format 1). Returns the row as written."""
    row, index = log.row_of("superstep_aborted")
    _code, delta, run_ref, superstep_ref, *_reason_and_error = row.body[index]
    row.body[index] = [CODE["superstep_committed"], delta, run_ref, superstep_ref]
    if unchain:
        del row.body[4]
        row.body[0] = 1
    log.rewrite(row)
    return row


def test_an_abort_rewritten_as_a_commit_never_revives_the_secret_unflagged(log: Log) -> None:
    rewrite_marker(log)
    assert _refused(log, 6, "marker rewritten") == ["marker rewritten"]
    with open_store(log.url, create=False) as store:
        with pytest.raises(LogIntegrityError, match="marker"):
            fold_committed(store.read(INSTANCE))
        with pytest.raises(LogIntegrityError) as caught:
            Projector(store, ["state"]).catch_up()  # the views read the global log: refused too
        assert (caught.value.instance_id, caught.value.position) == (INSTANCE, 6)
    with open_store(log.url, create=False, allow_broken_chain=True) as store:
        revived = fold_committed(store.read(INSTANCE)).values
        assert revived["secret"] == SECRET  # what the rewrite was for: shown only when asked,
        assert [(p.position, p.kind) for p in store.chain_problems] == [(6, "marker rewritten")]


def test_a_deleted_middle_row_is_a_gap(log: Log) -> None:
    log.rows.delete(9)  # run 2's start, #8..9
    _refused(log, 8, "gap")
    with open_store(log.url, create=False, allow_broken_chain=True) as store:
        positions = [e.position for e in store.read(INSTANCE)]
    assert positions == [*range(1, 8), *range(10, 24)]


def test_an_inserted_row_with_valid_hashes_is_caught_where_it_overlaps(log: Log) -> None:
    """The strongest insertion short of rewriting everything after it: a forged write of the
    secret at #8, hashed with steplog's own mapper and chained to #7. The row after it overlaps."""
    with open_store(log.url, create=False) as store:
        before = store.read(INSTANCE, upto=7)

    staged = next(e for e in before if isinstance(e, StateStaged))
    forged = staged.model_copy(update={"position": 8})
    row = RowMapper().to_row([forged], previous=_hash_at(log, 7))
    log.rows.insert(8, "1", bytes(row.state))
    _refused(log, 8, "reordered")


def test_two_rows_swapped_are_caught_at_the_first(log: Log) -> None:
    first, second = [r for r in log.rows.all() if r.last in (9, 17)]
    log.rows.put(9, orjson.dumps(second.body))
    log.rows.put(17, orjson.dumps(first.body))
    # Each event's hash covers its position, so a read sees the moved event as edited; the chain
    # check also finds that the row does not follow the one before it.
    kinds = _refused(log, 8, "reordered", read_kind="edited")
    assert kinds[0] == "edited"


def test_two_events_swapped_within_a_row_are_caught_at_the_first(log: Log) -> None:
    row, index = log.row_of("state_staged", nth=1)  # #11, followed by the output at #12
    row.body[index], row.body[index + 1] = row.body[index + 1], row.body[index]
    log.rewrite(row)
    assert _refused(log, 11, "edited")[0] == "edited"


def test_a_row_stripped_of_its_chain_is_unchained(log: Log) -> None:
    """A row rewritten in batch format 1 (the format before the chain), its hashes dropped so
    that nothing checks its events: refused, because the rows before it are chained."""
    row, index = log.row_of("state_staged", nth=1)  # in #10..15
    row.body[index][-1] = "tok-EVIL"
    del row.body[4]
    row.body[0] = 1
    log.rewrite(row)
    _refused(log, 10, "unchained")


def test_a_truncated_tail_is_found_by_verify_only(log: Log) -> None:
    log.rows.delete(23)
    log.rows.delete(17)
    events = _unnoticed_by_reads(log)  # a read cannot know more rows should follow
    assert events[-1].position == 15
    assert _only_problem(log) == (16, "truncated")


def test_no_append_follows_a_truncated_tail_so_verify_still_finds_it(log: Log) -> None:
    """A writer that read the truncated log would chain its append to its end and overwrite the
    recorded head, the one evidence of the removal: it is refused, nothing is written, and
    ``verify`` still names the truncation (found by a fresh-clone review: a resume erased it)."""
    log.rows.delete(23)
    log.rows.delete(17)
    for allow in (False, True):
        with open_store(log.url, create=False, allow_broken_chain=allow) as store:
            last = store.read(INSTANCE)[-1]
            assert last.position == 15
            after = last.model_copy(update={"position": 16})
            with pytest.raises(LogIntegrityError, match="ends at position 15, before its recorded"):
                store.append(INSTANCE, [after], expected_version=15)
            assert store.version(INSTANCE) == 15
    assert _only_problem(log) == (16, "truncated")


def test_a_writer_behind_another_gets_a_conflict_not_a_truncation(log: Log) -> None:
    """The recorded head past a writer's version, with the log reaching it, is another writer's
    append: a version conflict, never a tamper alarm."""
    with open_store(log.url, create=False) as store:
        events = store.read(INSTANCE)
        end = events[-1].position
        # the end of the row before the last one: where the other writer's view stopped
        behind = store._backend.select_stream(INSTANCE)[-2][0]
        assert behind < end
        after = events[behind - 1].model_copy(update={"position": behind + 1})
        with pytest.raises(ConcurrencyConflictError):
            store.append(INSTANCE, [after], expected_version=behind)
        assert store.version(INSTANCE) == end
        assert store.verify_chain().ok


def test_a_recomputed_last_row_is_found_by_the_recorded_head(log: Log) -> None:
    """The last row rewritten with valid hashes (steplog's own mapper, chained to #17): every
    event matches its hash, only the head the store recorded at each append does not."""
    with open_store(log.url, create=False) as store:
        events = store.read(INSTANCE, after=17)

    forged = [_with_token(e, "tok-EVIL") for e in events]
    log.rows.put(23, bytes(RowMapper().to_row(forged, previous=_hash_at(log, 17)).state))
    assert fold_committed(_unnoticed_by_reads(log)).values["token"] == "tok-EVIL"
    assert _only_problem(log) == (23, "head mismatch")


def test_a_deleted_head_is_unrecorded(log: Log) -> None:
    log.rows.drop_head()
    _unnoticed_by_reads(log)
    assert _only_problem(log) == (23, "unrecorded")


def test_a_rewrite_of_everything_is_found_only_by_an_exported_head(log: Log) -> None:
    """Whoever recomputes every hash from the altered event on, and the recorded head too,
    leaves a log that verifies: only a head exported before (held elsewhere) shows it."""
    key = b"auditor key"
    with open_store(log.url, create=False) as store:
        exported = store.chain_head(INSTANCE)
        events = store.read(INSTANCE)
    assert exported is not None
    assert exported.position == 23
    saved = ChainHead.from_json(orjson.loads(orjson.dumps(exported.sign(key).to_json())))
    forged = [
        SuperstepCommitted(
            instance_id=e.instance_id,
            position=e.position,
            timestamp=e.timestamp,
            run_id=e.run_id,
            superstep_id=e.superstep_id,
        )
        if e.type == "superstep_aborted"
        else e
        for e in events
    ]
    mapper, previous = RowMapper(), None
    for row in log.rows.all():
        rewritten = mapper.to_row(forged[row.first - 1 : row.last], previous=previous)
        log.rows.put(row.last, bytes(rewritten.state))
        previous = rewritten.head
    assert previous is not None
    log.rows.set_head(23, previous)
    assert fold_committed(_unnoticed_by_reads(log)).values["secret"] == SECRET
    with open_store(log.url, create=False) as store:
        assert store.verify_chain().ok  # the limit: see docs/security.md
    assert saved.signed_by(key)
    assert not saved.signed_by(b"another key")
    assert _only_problem(log, heads=[saved]) == (23, "head mismatch")


def test_an_exported_head_still_matches_an_untouched_log_that_grew(log: Log) -> None:
    with open_store(log.url, create=False) as store:
        head = store.chain_head(INSTANCE)
    assert head is not None
    asyncio.run(_more(log.url))
    with open_store(log.url, create=False) as store:
        report = store.verify_chain(heads=[head])
        assert report.ok, report.problems
        assert store.version(INSTANCE) > head.position


async def _more(url: str) -> None:
    with open_store(url) as store:
        wf = WorkflowBuilder(
            start_executor=Checkout(id="checkout"), store=store, instance_id=INSTANCE
        ).build()
        await wf.run("A-3")


def test_the_views_refuse_a_rewritten_marker_in_a_row_stripped_of_its_chain(log: Log) -> None:
    rewrite_marker(log, unchain=True)
    with open_store(log.url, create=False) as store:
        with pytest.raises(LogIntegrityError):
            store.read(INSTANCE)  # (a read refuses it: "unchained" at #3)
        projector = Projector(store, ["state"])
        with pytest.raises(LogIntegrityError):
            projector.catch_up()
        assert "secret" not in projector.state(INSTANCE)


def test_the_views_refuse_a_gap(log: Log) -> None:
    log.rows.delete(15)  # run 2's commit: the history view would show the run still running
    with open_store(log.url, create=False) as store, pytest.raises(LogIntegrityError):
        Projector(store, ["history"]).catch_up()


def test_an_instance_deleted_whole_is_found_by_its_exported_head(log: Log) -> None:
    with open_store(log.url, create=False) as store:
        exported = store.chain_head(INSTANCE)
    assert exported is not None
    for row in reversed(log.rows.all()):
        log.rows.delete(row.last)
    log.rows.drop_head()
    assert _only_problem(log, heads=[exported]) == (23, "truncated")


def _hash_at(log: Log, position: int) -> bytes:
    """The chain's hash of ``orders``#``position`` as the table holds it (what someone reading
    the table sees)."""
    (row,) = [r for r in log.rows.all() if r.first <= position <= r.last]
    digest = RowMapper().event_hash(INSTANCE, row.last, row.topic, orjson.dumps(row.body), position)
    assert digest is not None
    return digest


def _with_token(event: EventBase, value: str) -> EventBase:
    if isinstance(event, StateStaged) and event.key == "token":
        return event.model_copy(update={"value": value})
    return event
