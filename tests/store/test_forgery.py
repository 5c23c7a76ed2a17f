"""Forgeries of issue 21, performed on real SQLite files and PostgreSQL schemas by someone who can
write to the database but holds no key: every reader must refuse them, and ``verify`` must name
them (or, for events without hashes, say that it could not check them).

1. In an encrypted store, a plain row holding a whole forged run (``a = 666``, committed) is
   appended and chained to the head the store keeps in plain text, and that head moved forward.
   Variants: the meta marks deleted too; the integrity mark edited; a forged instance of its own.
2. In a plain store, every row is rewritten in batch format 1 (no hashes), a committed value
   edited, an abort turned into a commit, and the recorded heads deleted.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import orjson
import psycopg
import pytest
from psycopg import sql

from kernel import (
    EventBase,
    EventStore,
    Executor,
    Keyring,
    LogIntegrityError,
    StateStaged,
    StoreConfigError,
    SuperstepCommitted,
    WorkflowBuilder,
    WorkflowContext,
    counter_ids,
    fold_committed,
    handler,
    open_store,
    rekey,
)
from kernel._codec._mapper import RowMapper
from kernel.testing import ticking_clock
from projections import history_of
from projections.cli import EXIT_BROKEN_CHAIN, EXIT_PROBLEM, main
from tests.store.test_tamper import CLEAN, INSTANCE, SECRET, run_orders

KEY = Keyring.generate()
OTHER = Keyring.generate()


class Setter(Executor):
    """Stages ``a``: the order's number."""

    @handler
    async def set_a(self, value: int, ctx: WorkflowContext[str, str]) -> None:
        ctx.set_state("a", value)


def run_a(store: EventStore, instance: str, value: int) -> None:
    workflow = WorkflowBuilder(
        start_executor=Setter(id="setter"),
        store=store,
        instance_id=instance,
        clock=ticking_clock(datetime(2026, 12, 1, 9, 0, tzinfo=UTC)),
        id_factory=counter_ids(f"{instance}-{value}"),
    ).build()
    asyncio.run(workflow.run(value))


def forged_run(instance: str, after: int) -> list[EventBase]:
    """A whole committed run setting ``a = 666``, at the positions after ``after``: written by
    steplog itself to a store of the attacker's, then renumbered."""
    with open_store("memory://") as scratch:
        run_a(scratch, instance, 666)
        events = scratch.read(instance)
    return [e.model_copy(update={"position": after + n}) for n, e in enumerate(events, start=1)]


class Database:
    """The store's tables, reached with the driver, as an attacker with write access would."""

    def __init__(self, url: str) -> None:
        self.sqlite = url.startswith("sqlite")
        if self.sqlite:
            self.path = url.removeprefix("sqlite:///")
        else:
            parts = urlsplit(url)
            query = dict(parse_qsl(parts.query))
            self.schema = query.pop("schema")
            self.server = urlunsplit(parts._replace(query=urlencode(query)))

    def run(self, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """``statement`` with ``{events}``, ``{meta}`` and ``?`` placeholders."""
        if self.sqlite:
            text = statement.format(events="steplog_events", meta="steplog_meta")
            with closing(sqlite3.connect(self.path)) as db, db:
                return db.execute(text, params).fetchall()
        composed = sql.SQL(statement.replace("?", "%s")).format(
            events=sql.Identifier(self.schema, "steplog_events"),
            meta=sql.Identifier(self.schema, "steplog_meta"),
        )
        with psycopg.connect(self.server, autocommit=True) as conn:
            cursor = conn.execute(composed, params)
            return cursor.fetchall() if cursor.description else []

    def head(self, instance: str) -> tuple[int, bytes]:
        """The recorded chain head (kept in plain text)."""
        if self.sqlite:
            with closing(sqlite3.connect(self.path)) as db:
                (found,) = db.execute(
                    "SELECT position, head FROM steplog_chain WHERE instance_id = ?", (instance,)
                ).fetchall()
        else:
            with psycopg.connect(self.server) as conn:
                (found,) = conn.execute(
                    sql.SQL("SELECT version, chain FROM {} WHERE instance_id = %s").format(
                        sql.Identifier(self.schema, "steplog_heads")
                    ),
                    (instance,),
                ).fetchall()
        return int(found[0]), bytes(found[1])

    def set_head(self, instance: str, position: int, digest: bytes | None) -> None:
        """Record (or, with None, delete) an instance's chain head."""
        if self.sqlite:
            with closing(sqlite3.connect(self.path)) as db, db:
                if digest is None:
                    db.execute("DELETE FROM steplog_chain WHERE instance_id = ?", (instance,))
                else:
                    db.execute(
                        "INSERT OR REPLACE INTO steplog_chain VALUES (?, ?, ?)",
                        (instance, position, digest),
                    )
            return
        with psycopg.connect(self.server, autocommit=True) as conn:
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (instance_id, version, last_row, chain) VALUES (%s, %s, 0, %s) "
                    "ON CONFLICT (instance_id) DO UPDATE SET version = EXCLUDED.version, "
                    "chain = EXCLUDED.chain"
                ).format(sql.Identifier(self.schema, "steplog_heads")),
                (instance, position, digest),
            )

    def append_plain(
        self,
        instance: str,
        events: list[EventBase],
        previous: bytes | None,
        row_id: int | None = None,
    ) -> None:
        """Append ``events`` as one plain row chained to ``previous`` (with ``row_id``: at that
        row id), and move the head."""
        row = RowMapper().to_row(events, previous=previous)
        values = (instance, row.originator_version, row.topic, bytes(row.state))
        if row_id is None:
            self.run(
                "INSERT INTO {events} (originator_id, originator_version, topic, state) "
                "VALUES (?, ?, ?, ?)",
                values,
            )
        elif self.sqlite:
            self.run(
                "INSERT INTO {events} (rowid, originator_id, originator_version, topic, state) "
                "VALUES (?, ?, ?, ?, ?)",
                (row_id, *values),
            )
        else:
            self.run(
                "INSERT INTO {events} (originator_id, originator_version, topic, state, "
                "notification_id, tx_id) VALUES (?, ?, ?, ?, ?, pg_current_xact_id())",
                (*values, row_id),
            )
        self.set_head(instance, row.originator_version, row.head)

    def renumber(self, shift: int) -> None:
        """Move every row's id by ``shift`` (SQLite's rowid, PostgreSQL's notification id)."""
        if self.sqlite:
            self.run("UPDATE {events} SET rowid = rowid + ?", (shift,))
        else:
            self.run("UPDATE {events} SET notification_id = notification_id + ?", (shift,))

    def rows(self, instance: str) -> list[tuple[int, str, bytes]]:
        found = self.run(
            "SELECT originator_version, topic, state FROM {events} WHERE originator_id = ? "
            "ORDER BY originator_version",
            (instance,),
        )
        return [(int(last), str(topic), bytes(state)) for last, topic, state in found]

    def put(self, instance: str, last: int, state: bytes) -> None:
        self.run(
            "UPDATE {events} SET state = ? WHERE originator_id = ? AND originator_version = ?",
            (state, instance, last),
        )

    def meta(self) -> dict[str, str]:
        return {str(k): str(v) for k, v in self.run("SELECT key, value FROM {meta}")}


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def keys_file(tmp_path: Path) -> Path:
    path = tmp_path / "steplog.keys"
    path.write_text(KEY)
    return path


@pytest.fixture
def encrypted(durable_store_url: str) -> Iterator[str]:
    """An encrypted store holding ``orders`` (a = 1, then a = 2) and ``clean`` (a = 7)."""
    with open_store(durable_store_url, keyring=Keyring.from_text(KEY)) as store:
        run_a(store, INSTANCE, 1)
        run_a(store, INSTANCE, 2)
        run_a(store, CLEAN, 7)
    return durable_store_url


def keyless_append(url: str, instance: str = INSTANCE, row_id: int | None = None) -> int:
    """Attack 1: a plain forged run appended to ``instance``, chained to its recorded head (a
    new instance: to its genesis), the head moved forward. Returns the forged run's first
    position."""
    db = Database(url)
    try:
        position, digest = db.head(instance)
    except ValueError:  # no head: a new instance
        position, digest = 0, None
    db.append_plain(instance, forged_run(instance, position), digest, row_id)
    return position + 1


def assert_refused(
    url: str,
    instance: str,
    position: int,
    kind: str,
    capsys: Any,
    keys: Path,
    *,
    seen_by_read_all: bool = True,
    mark_refused: bool = False,
) -> None:
    """Every reader with the key refuses ``instance`` at ``position`` as ``kind``, and
    ``verify`` names it there. (``seen_by_read_all``: False for a row put at a row id below 1,
    which the global log, read from row id 1 on, does not show.)"""
    with open_store(url, keyring=Keyring.from_text(KEY), create=False) as store:
        with pytest.raises(LogIntegrityError) as caught:
            store.read(instance)
        assert (caught.value.instance_id, caught.value.position, caught.value.kind) == (
            instance,
            position,
            kind,
        )
        if seen_by_read_all:
            with pytest.raises(LogIntegrityError):
                store.read_all(limit=10_000)
        else:
            assert 666 not in [getattr(e, "value", None) for e in store.read_all(limit=10_000)]
        with pytest.raises(LogIntegrityError):
            history_of(store, instance)
        report = store.verify_chain()
        found = [(p.instance_id, p.position, p.kind) for p in report.problems]
        assert (instance, position, kind) in found, found
        clean = [p.kind for p in store.verify_chain(CLEAN).problems]
        assert clean == (["mark altered"] if mark_refused else []), clean
    with open_store(url, keyring=Keyring.from_text(KEY), allow_broken_chain=True) as store:
        assert fold_committed(store.read(instance)).values["a"] == 666  # shown, and labelled
        assert (instance, position, kind) in [
            (p.instance_id, p.position, p.kind) for p in store.chain_problems
        ]
    store_args = ("--store", url, "--keys-file", str(keys))
    for command in (["state", instance], ["blame", instance, "a"], ["history", instance]):
        code, out, err = cli(capsys, *store_args, *command)
        assert code == EXIT_BROKEN_CHAIN, (command, out, err)
        assert "666" not in out
        assert f"{instance!r}#{position}" in err, err
        assert kind in err
    code, out, _ = cli(capsys, *store_args, "verify")
    assert code == EXIT_BROKEN_CHAIN
    assert kind in out
    assert instance in out


def test_a_keyless_plain_row_appended_to_an_encrypted_store_is_refused(
    encrypted: str, keys_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    position = keyless_append(encrypted)
    assert_refused(encrypted, INSTANCE, position, "unsealed", capsys, keys_file)


def test_deleting_the_stores_marks_does_not_let_a_plain_row_in(
    encrypted: str, keys_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without its tagged mark, a store holding sealed rows is refused by every reader with the
    key (``mark altered``); read anyway, every row must be sealed."""
    db = Database(encrypted)
    db.run("DELETE FROM {meta} WHERE key IN ('encryption', 'integrity')")
    position = keyless_append(encrypted)
    assert_mark_refused(encrypted, capsys, keys_file)
    with open_store(encrypted, keyring=Keyring.from_text(KEY), allow_broken_chain=True) as store:
        found = [(p.instance_id, p.position, p.kind) for p in store.verify_chain().problems]
        assert (INSTANCE, position, "unsealed") in found


def test_a_store_without_its_mark_gets_it_back_from_rekey_as_the_error_says(
    encrypted: str, keys_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the refusal advises for a store encrypted by an older steplog (no mark): ``steplog
    --allow-broken-chain rekey`` with its keys records the strictest mark, after which the
    store opens as before."""
    Database(encrypted).run("DELETE FROM {meta} WHERE key = 'integrity'")
    with pytest.raises(LogIntegrityError, match="allow-broken-chain rekey"):
        open_store(encrypted, keyring=Keyring.from_text(KEY), create=False)
    store_args = ("--store", encrypted, "--keys-file", str(keys_file))
    code, out, err = cli(capsys, *store_args, "--allow-broken-chain", "rekey")
    assert code == 0, (out, err)
    mark = orjson.loads(Database(encrypted).meta()["integrity"])
    assert (mark["chained_from"], mark["plain"]) == (0, {})
    with open_store(encrypted, keyring=Keyring.from_text(KEY), create=False) as store:
        assert fold_committed(store.read(INSTANCE)).values == {"a": 2}
        assert store.verify_chain().verified


def assert_mark_refused(url: str, capsys: Any, keys: Path) -> None:
    """Readers and writers with the key refuse the store (``mark altered``), no writer records
    a mark, and the CLI's writers and readers exit with the broken-chain status."""
    before = Database(url).meta().get("integrity")
    for create in (False, True):
        with pytest.raises(LogIntegrityError, match="integrity mark") as caught:
            open_store(url, keyring=Keyring.from_text(KEY), create=create)
        assert caught.value.kind == "mark altered"
        assert "rekey" in str(caught.value)
    store_args = ("--store", url, "--keys-file", str(keys))
    for command in (["project"], ["state", INSTANCE], ["verify"]):
        code, out, err = cli(capsys, *store_args, *command)
        assert code == EXIT_BROKEN_CHAIN, (command, out, err)
        assert "666" not in out
        assert "integrity mark" in err, err
    assert Database(url).meta().get("integrity") == before  # nothing recorded from the rows


def test_a_forged_instance_of_plain_rows_is_refused(
    encrypted: str, keys_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert keyless_append(encrypted, "forged") == 1
    assert_refused(encrypted, "forged", 1, "unsealed", capsys, keys_file)


def test_an_edited_integrity_mark_is_refused_by_every_reader_with_the_key(
    encrypted: str, keys_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The mark says from which row on rows must be sealed; moved past the forged row (its tag
    kept, or dropped), it no longer matches its tag."""
    db = Database(encrypted)
    mark = orjson.loads(db.meta()["integrity"])
    assert mark["plain"] == {}
    assert mark["tag"]
    keyless_append(encrypted)
    for tag in (mark["tag"], ""):
        edited = {**mark, "plain": {INSTANCE: 10**9}, "tag": tag}
        db.run(
            "UPDATE {meta} SET value = ? WHERE key = 'integrity'", (orjson.dumps(edited).decode(),)
        )
        with pytest.raises(LogIntegrityError, match="integrity mark") as caught:
            open_store(encrypted, keyring=Keyring.from_text(KEY), create=False)
        assert caught.value.kind == "mark altered"
        with pytest.raises(LogIntegrityError, match="integrity mark"):
            open_store(encrypted, keyring=Keyring.from_text(KEY))  # a writer never adopts it
        code, _out, err = cli(capsys, "--store", encrypted, "--keys-file", str(keys_file), "verify")
        assert code == EXIT_BROKEN_CHAIN
        assert "integrity mark" in err
    with open_store(encrypted, keyring=Keyring.from_text(KEY), allow_broken_chain=True) as store:
        kinds = {p.kind for p in store.verify_chain().problems}
        assert kinds == {"mark altered", "unsealed"}


def test_rotation_and_rekey_keep_the_mark_and_move_it(durable_store_url: str) -> None:
    """A store written plain, then given a key: its plain rows read until ``rekey`` seals them;
    a plain row appended by someone without the key after that is refused, and rekey will not
    seal it for him. After a rotation (``NEW,OLD``) the mark written with the old key still
    holds; ``rekey`` tags it with the new one."""
    url = durable_store_url
    with open_store(url) as store:
        run_a(store, INSTANCE, 1)
    with open_store(url, keyring=Keyring.from_text(KEY)) as store:
        run_a(store, INSTANCE, 2)  # the store's first sealed row
        assert fold_committed(store.read(INSTANCE)).values == {"a": 2}
    db = Database(url)
    head = db.head(INSTANCE)
    position = keyless_append(url)
    with open_store(url, keyring=Keyring.from_text(KEY), create=False) as store:
        with pytest.raises(LogIntegrityError) as caught:
            store.read(INSTANCE)
        assert (caught.value.position, caught.value.kind) == (position, "unsealed")
        with pytest.raises(LogIntegrityError, match="without the key"):
            rekey(store)
    last, _, _ = db.rows(INSTANCE)[-1]  # the forgery removed, the head put back
    db.run(
        "DELETE FROM {events} WHERE originator_id = ? AND originator_version = ?",
        (INSTANCE, last),
    )
    db.set_head(INSTANCE, *head)
    with open_store(url, keyring=Keyring.from_text(f"{OTHER},{KEY}"), create=False) as store:
        report = rekey(store)
        assert report.sealed >= 1
        assert report.resealed >= 1
        assert store.verify_chain().verified
    assert orjson.loads(db.meta()["integrity"])["plain"] == {}
    with open_store(url, keyring=Keyring.from_text(OTHER), create=False) as store:
        assert fold_committed(store.read(INSTANCE)).values == {"a": 2}
        assert store.verify_chain().verified
    position = keyless_append(url)
    with open_store(url, keyring=Keyring.from_text(OTHER), create=False) as store:
        with pytest.raises(LogIntegrityError) as caught:
            store.read(INSTANCE)
        assert (caught.value.position, caught.value.kind) == (position, "unsealed")


def test_rows_renumbered_or_put_at_id_0_are_not_before_the_key(
    encrypted: str, keys_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Row ids are the attacker's: every row renumbered (``rowid + 1000``), a plain forged
    instance put at row id 1, below the first sealed row; another at row id 0 (or below), which
    no scan of the global log starting after 0 sees. The mark names the rows written before
    the key by instance and position, never by row id: both are refused."""
    db = Database(encrypted)
    db.renumber(1000)
    assert keyless_append(encrypted, "forged", row_id=1) == 1
    assert_refused(encrypted, "forged", 1, "unsealed", capsys, keys_file)
    assert keyless_append(encrypted, "below", row_id=0) == 1
    assert_refused(encrypted, "below", 1, "unsealed", capsys, keys_file)
    db.run("DELETE FROM {meta} WHERE key = 'integrity'")  # no bound left to compare with
    assert_mark_refused(encrypted, capsys, keys_file)
    with (
        open_store(encrypted, keyring=Keyring.from_text(KEY), allow_broken_chain=True) as store,
        pytest.raises(LogIntegrityError, match="not encrypted"),
    ):
        rekey(store)  # what the CLI's warning would lead to: it never seals the forgery
    assert not Database(encrypted).rows("forged")[-1][2].startswith(b"\x00SL1")


def test_a_plain_row_below_the_keys_first_row_is_refused(
    durable_store_url: str, keys_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A store written plain, then with a key, its mark intact: a plain forged row put at row
    id -5 (below every row written before the key) in an instance written wholly with the key
    is refused; rekey seals the plain rows the mark lists, never it."""
    url = durable_store_url
    with open_store(url) as store:
        run_a(store, CLEAN, 7)
    with open_store(url, keyring=Keyring.from_text(KEY)) as store:
        run_a(store, INSTANCE, 1)
        run_a(store, INSTANCE, 2)
    mark = orjson.loads(Database(url).meta()["integrity"])
    assert mark["plain"] == {CLEAN: Database(url).rows(CLEAN)[-1][0]}, mark
    position = keyless_append(url, row_id=-5)
    assert_refused(url, INSTANCE, position, "unsealed", capsys, keys_file, seen_by_read_all=False)
    with open_store(url, keyring=Keyring.from_text(KEY), create=False) as store:
        rekey(store)  # seals the rows the mark lists, never the forged one
        assert fold_committed(store.read(CLEAN)).values == {"a": 7}
        with pytest.raises(LogIntegrityError, match="not encrypted"):
            store.read(INSTANCE)
    assert orjson.loads(Database(url).meta()["integrity"])["plain"] == {}
    assert not Database(url).rows(INSTANCE)[-1][2].startswith(b"\x00SL1")


def test_a_mark_tagged_with_a_key_not_in_the_keyring_is_refused(
    encrypted: str, keys_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tag naming a fingerprint that no key of the keyring has cannot be checked: the mark is
    not believed (``mark altered``, named by verify; a writer is refused), never silently
    passed over for one computed from rows: every row must then be sealed."""
    db = Database(encrypted)
    forged = {"chained_from": 0, "plain": {"forged": 10**9}, "tag": "0000000000000000:00"}
    db.run("UPDATE {meta} SET value = ? WHERE key = 'integrity'", (orjson.dumps(forged).decode(),))
    db.renumber(1000)
    keyless_append(encrypted, "forged", row_id=1)
    with pytest.raises(LogIntegrityError, match="integrity mark") as caught:
        open_store(encrypted, keyring=Keyring.from_text(KEY))  # a writer never adopts it
    assert caught.value.kind == "mark altered"
    assert_refused(encrypted, "forged", 1, "unsealed", capsys, keys_file, mark_refused=True)
    with open_store(encrypted, keyring=Keyring.from_text(KEY), create=False) as store:
        assert "mark altered" in [p.kind for p in store.verify_chain().problems]
    assert orjson.loads(db.meta()["integrity"]) == forged


@pytest.mark.parametrize(
    "edit",
    [
        {"chained_from": True},
        {"chained_from": 1e9},
        {"chained_from": -1},
        {"plain": {INSTANCE: True}},
        {"plain": {INSTANCE: 2.0}},
        {"plain": [INSTANCE]},
    ],
)
def test_a_mark_with_a_bound_that_is_not_a_whole_number_is_malformed(
    edit: dict[str, Any], encrypted: str, keys_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``true`` and ``1e9`` are not row ids or positions: the mark is refused as altered."""
    from kernel._codec._chain import IntegrityMark

    db = Database(encrypted)
    mark = {**orjson.loads(db.meta()["integrity"]), **edit}
    assert IntegrityMark.from_text(orjson.dumps(mark).decode()) is None
    db.run("UPDATE {meta} SET value = ? WHERE key = 'integrity'", (orjson.dumps(mark).decode(),))
    assert_mark_refused(encrypted, capsys, keys_file)


def test_deleting_the_encryption_mark_does_not_let_a_keyless_writer_in(encrypted: str) -> None:
    """With the meta row ``encryption`` deleted, a writer without keys is still refused: the
    integrity mark says sealed (tagged or not), and so does the store's newest row."""
    db = Database(encrypted)
    db.run("DELETE FROM {meta} WHERE key = 'encryption'")
    with pytest.raises(StoreConfigError, match="is encrypted"):
        open_store(encrypted)
    db.run("DELETE FROM {meta} WHERE key = 'integrity'")
    with pytest.raises(StoreConfigError, match="is encrypted"):
        open_store(encrypted)
    with open_store(encrypted, keyring=Keyring.from_text(KEY), allow_broken_chain=True) as store:
        assert fold_committed(store.read(INSTANCE)).values == {"a": 2}


# -- 2. a plain store downgraded to the format before the chain ----------------------------------


def downgrade(url: str) -> None:
    """Attack 2: every row of ``orders`` rewritten in batch format 1 (no hashes), the committed
    token edited, the abort turned into a commit; every recorded head deleted."""
    db = Database(url)
    with open_store(url, create=False) as store:
        events = store.read(INSTANCE)
    forged: list[EventBase] = []
    for event in events:
        if isinstance(event, StateStaged) and event.key == "token":
            event = event.model_copy(update={"value": "tok-EVIL"})
        if event.type == "superstep_aborted":
            event = SuperstepCommitted(
                instance_id=event.instance_id,
                position=event.position,
                timestamp=event.timestamp,
                run_id=event.run_id,  # type: ignore[attr-defined]
                superstep_id=event.superstep_id,  # type: ignore[attr-defined]
            )
        forged.append(event)
    mapper = RowMapper()
    for last, topic, _ in db.rows(INSTANCE):
        first = last - int(topic) + 1
        body = orjson.loads(mapper.to_row(forged[first - 1 : last]).state)
        del body[4]  # the chain
        body[0] = 1
        db.put(INSTANCE, last, orjson.dumps(body))
    db.set_head(INSTANCE, 0, None)


@pytest.fixture
def plain(durable_store_url: str) -> str:
    asyncio.run(run_orders(durable_store_url))
    return durable_store_url


def test_a_downgraded_store_is_refused_while_its_stamp_is_there(
    plain: str, capsys: pytest.CaptureFixture[str]
) -> None:
    downgrade(plain)
    with open_store(plain, create=False) as store:
        with pytest.raises(LogIntegrityError) as caught:
            store.read(INSTANCE)
        assert (caught.value.position, caught.value.kind) == (1, "unchained")
        report = store.verify_chain()
        assert (INSTANCE, 1, "unchained") in [
            (p.instance_id, p.position, p.kind) for p in report.problems
        ]
    code, out, err = cli(capsys, "--store", plain, "state", INSTANCE)
    assert code == EXIT_BROKEN_CHAIN
    assert "tok-EVIL" not in out
    assert "unchained" in err
    mark = orjson.loads(Database(plain).meta()["integrity"])  # the stamp: every row chained
    assert (mark["chained_from"], mark["plain"], mark["tag"]) == (0, None, "")


def test_a_downgraded_store_with_its_stamp_deleted_is_never_called_verified(
    plain: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without a key nothing in the database can tell this store from one written before the
    chain: readers show it, but ``verify`` says it could not check it, and fails."""
    downgrade(plain)
    Database(plain).run("DELETE FROM {meta} WHERE key = 'integrity'")
    with open_store(plain, create=False) as store:
        assert fold_committed(store.read(INSTANCE)).values["secret"] == SECRET  # the limit
        report = store.verify_chain()
        assert report.ok
        assert not report.verified
        assert (report.events, report.unchained_events) == (46, 23)
    code, out, err = cli(capsys, "--store", plain, "verify")
    assert code == EXIT_PROBLEM, (out, err)
    assert "chain ok" not in out
    assert "23 of 46 events" in out
    assert "could not be checked" in out
    code, out, _ = cli(capsys, "--store", plain, "verify", "--json")
    assert code == EXIT_PROBLEM
    chain = orjson.loads(out)["chain"]
    assert (chain["ok"], chain["verified"], chain["unchained_events"]) == (True, False, 23)


@pytest.mark.postgres
def test_plain_rows_held_back_by_an_older_transaction_are_before_the_key(postgres_url: str) -> None:
    """On PostgreSQL a committed row is read only once every older transaction on the server has
    ended. Plain rows committed while such a transaction is open were written before the key all
    the same: the first writer with a key must count them so (it took the settled prefix and
    refused its own instance's plain rows as forged, in a busy server)."""
    with open_store(postgres_url) as store:
        run_a(store, "warm", 1)  # the tables exist
    server = urlunsplit(urlsplit(postgres_url)._replace(query=""))
    with psycopg.connect(server, autocommit=False) as older:
        older.execute("SELECT txid_current()")  # an open transaction with an id, older than...
        with open_store(postgres_url) as store:
            run_a(store, INSTANCE, 1)  # ...these plain rows, committed but held back
        with open_store(postgres_url, keyring=Keyring.from_text(KEY)) as store:
            run_a(store, INSTANCE, 2)
        older.rollback()
    with open_store(postgres_url, keyring=Keyring.from_text(KEY), create=False) as store:
        assert fold_committed(store.read(INSTANCE)).values == {"a": 2}
