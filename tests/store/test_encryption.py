"""Encryption at rest, end to end: with a keyring, no value a workflow handled is in the store's
files or tables in plain text (event rows and view documents), it reads back exactly with the
keys, a missing or wrong key is a clear error, and keys rotate (``kernel.rekey``)."""

from __future__ import annotations

import asyncio
import base64
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import psycopg
import pytest
from psycopg import sql

from kernel import (
    DEFAULT_STORE_ENV,
    FROM_ENV,
    KEYS_ENV,
    DecodeError,
    EventStore,
    Executor,
    Keyring,
    LogIntegrityError,
    StoreConfigError,
    WorkflowBuilder,
    WorkflowContext,
    compact_store,
    handler,
    open_store,
    rekey,
)
from kernel._codec._cipher import key_id
from projections import VIEW_NAMES, Projector, backend_for, reseal_views

SECRET = "zq7-SECRET-card-4111"
"""The value every test hides: as a state value, in a run's input, an output, a message and an
error text. It appears nowhere else (not in ids, key names or executor names)."""
DATA = Path(__file__).parent.parent / "data"


def ring(*keys: str) -> Keyring:
    return Keyring.from_text(",".join(keys))


class Intake(Executor):
    @handler
    async def take(self, order: dict[str, str], ctx: WorkflowContext[str, str]) -> None:
        ctx.set_state("card", order["card"])
        if order.get("fail"):
            raise ValueError(f"card {order['card']} was declined")
        await ctx.send_message(f"charge {order['card']}")


class Charge(Executor):
    @handler
    async def charge(self, text: str, ctx: WorkflowContext[str, str]) -> None:
        ctx.set_state("charged", text)
        await ctx.yield_output(f"done: {text}")


def run_workflows(store: EventStore, instance_id: str = "orders-1") -> None:
    """A run that writes the secret as state, input, message and output; then a run whose
    handler raises with the secret in its message."""
    intake = Intake(id="intake")
    workflow = (
        WorkflowBuilder(start_executor=intake, store=store, instance_id=instance_id)
        .add_edge(intake, Charge(id="charge"))
        .build()
    )

    async def both() -> None:
        result = await workflow.run({"card": SECRET})
        assert result.get_outputs() == [f"done: charge {SECRET}"]
        with pytest.raises(ValueError, match="declined"):
            await workflow.run({"card": SECRET, "fail": "yes"})

    asyncio.run(both())


def build_views(store: EventStore) -> Projector:
    projector = Projector(store, list(VIEW_NAMES), snapshot_every=1)
    projector.catch_up()
    projector.rebuild("history")  # a shadow table, swapped in: its documents are sealed too
    return projector


def assert_reads_back(store: EventStore, projector: Projector | None = None) -> None:
    """Every copy of the secret reads back exactly."""
    events = store.read("orders-1")
    starts = [e for e in events if e.type == "run_started"]
    assert starts[0].input == {"card": SECRET}
    staged = {e.key: e.value for e in events if e.type == "state_staged"}
    assert staged["card"] == SECRET
    messages = [e.message for e in events if e.type == "message_staged"]
    assert f"charge {SECRET}" in messages
    outputs = [e.value for e in events if e.type == "output_yielded"]
    assert outputs == [f"done: charge {SECRET}"]
    failed = [e.error.message for e in events if e.type == "executor_failed"]
    assert failed == [f"card {SECRET} was declined"]
    if projector is not None:
        assert projector.state("orders-1")["card"] == SECRET


def files_of(url: str) -> Iterator[Path]:
    path = Path(url.removeprefix("sqlite:///"))
    for suffix in ("", "-wal", "-shm", "-journal"):
        found = path.with_name(path.name + suffix)
        if found.exists():
            yield found


def leaks_in_sqlite(url: str) -> list[str]:
    """The files of the SQLite store whose raw bytes hold the secret (in any text encoding a
    value could be stored in: UTF-8, or base64 of it)."""
    needles = [SECRET.encode(), base64.b64encode(SECRET.encode())[:16]]
    return [f.name for f in files_of(url) if any(n in f.read_bytes() for n in needles)]


def leaks_in_postgres(url: str) -> list[str]:
    """The tables of the store's schema any row of which, as text, holds the secret."""
    schema = parse_qs(urlsplit(url).query)["schema"][0]
    found = []
    with psycopg.connect(url.split("?")[0], autocommit=True) as conn:
        tables = [
            row[0]
            for row in conn.execute(
                "SELECT tablename FROM pg_catalog.pg_tables WHERE schemaname = %s", (schema,)
            )
        ]
        assert "steplog_events" in tables
        assert any(t.startswith("steplog_view_") for t in tables)
        for table in tables:
            statement = sql.SQL("SELECT t::text FROM {} t").format(sql.Identifier(schema, table))
            if any(SECRET in row[0] for row in conn.execute(statement)):
                found.append(table)
    return found


def leaks(url: str) -> list[str]:
    return leaks_in_sqlite(url) if url.startswith("sqlite") else leaks_in_postgres(url)


def test_a_keyed_store_holds_no_secret_in_plain_text(durable_store_url):
    keys = ring(Keyring.generate())
    with open_store(durable_store_url, keyring=keys) as store:
        run_workflows(store)
        projector = build_views(store)
        assert_reads_back(store, projector)
        assert leaks(durable_store_url) == []  # open: the SQLite WAL holds pages too
    assert leaks(durable_store_url) == []
    with open_store(durable_store_url, keyring=keys, create=False) as store:
        assert_reads_back(store, Projector(store, list(VIEW_NAMES)))
        assert store.verify_chain().ok


def test_the_same_workflows_without_a_key_do_leave_the_secret_in_plain_text(durable_store_url):
    """The grep above can fail: without a key the secret is there to find."""
    with open_store(durable_store_url) as store:
        run_workflows(store)
        build_views(store)
    assert leaks(durable_store_url) != []


def test_a_missing_or_wrong_key_is_a_clear_error_naming_the_position(durable_store_url):
    key = Keyring.generate()
    with open_store(durable_store_url, keyring=ring(key)) as store:
        run_workflows(store)
        build_views(store)
    with open_store(durable_store_url, create=False) as store:
        with pytest.raises(DecodeError, match=r"'orders-1'#1\.\.\d+ is encrypted.*STEPLOG_KEYS"):
            store.read("orders-1")
        with pytest.raises(DecodeError, match=r"view document .* is encrypted.*STEPLOG_KEYS"):
            Projector(store, ["state"]).state("orders-1")
    other = ring(Keyring.generate())
    with open_store(durable_store_url, create=False, keyring=other) as store:
        with pytest.raises(DecodeError, match=rf"#1\.\.\d+ is encrypted with key {fp(key)}"):
            store.read("orders-1")
        with pytest.raises(DecodeError, match=f"encrypted with key {fp(key)}"):
            Projector(store, ["state"]).state("orders-1")


def fp(key: str) -> str:
    return key_id(base64.urlsafe_b64decode(key)).hex()


def test_writers_without_the_keys_are_refused(durable_store_url):
    with open_store(durable_store_url, keyring=ring(Keyring.generate())) as store:
        run_workflows(store)
    with pytest.raises(StoreConfigError, match="is encrypted: open it with its keys"):
        open_store(durable_store_url)
    with open_store(durable_store_url, create=False) as store:
        with pytest.raises(StoreConfigError, match="opened without its keys"):
            run_workflows(store, "orders-new")
        assert store.version("orders-new") == 0


def test_rotation_new_key_first_then_rekey_then_the_old_key_is_not_needed(durable_store_url):
    old, new = Keyring.generate(), Keyring.generate()
    with open_store(durable_store_url, keyring=ring(old)) as store:
        run_workflows(store)
        build_views(store)
    with open_store(durable_store_url, keyring=ring(new, old)) as store:
        assert_reads_back(store, Projector(store, list(VIEW_NAMES)))
        rows = rekey(store)
        docs = reseal_views(backend_for(store), ring(new, old))
        assert rows.resealed == rows.rows > 0
        assert rows.sealed == 0
        assert docs.rewritten == docs.documents > 0
        compact_store(store, tables=docs.table_names)
        assert store.verify_chain().ok
        again = rekey(store)
        assert (again.current, again.written) == (rows.rows, 0)
        assert reseal_views(backend_for(store), ring(new, old)).rewritten == 0
    with open_store(durable_store_url, keyring=ring(old), create=False) as store:
        with pytest.raises(DecodeError, match=f"encrypted with key {fp(new)}"):
            store.read("orders-1")
        with pytest.raises(DecodeError, match=f"encrypted with key {fp(new)}"):
            Projector(store, ["state"]).state("orders-1")
    with open_store(durable_store_url, keyring=ring(new), create=False) as store:
        assert_reads_back(store, Projector(store, list(VIEW_NAMES)))
        assert store.verify_chain().ok
    assert leaks(durable_store_url) == []


def test_rekey_seals_a_store_that_was_written_plain(durable_store_url):
    with open_store(durable_store_url) as store:
        run_workflows(store)
        build_views(store)
        heads = [store.chain_head("orders-1")]
    key = Keyring.generate()
    with open_store(durable_store_url, keyring=ring(key)) as store:
        rows = rekey(store)
        docs = reseal_views(backend_for(store), ring(key))
        assert rows.sealed == rows.rows > 0
        assert rows.resealed == 0
        assert docs.rewritten == docs.documents > 0
        compact_store(store, tables=docs.table_names)
        assert_reads_back(store, Projector(store, list(VIEW_NAMES)))
        assert store.verify_chain(heads=heads).ok  # the hashes are over events, not bytes
    assert leaks(durable_store_url) == []
    with pytest.raises(StoreConfigError, match="is encrypted"):
        open_store(durable_store_url)


def test_a_plain_store_given_a_key_is_marked_encrypted_by_rekey(sqlite_url):
    with open_store(sqlite_url) as store:
        run_workflows(store)
    with open_store(sqlite_url, keyring=ring(Keyring.generate()), create=False) as store:
        assert rekey(store).marked
        assert not rekey(store).marked
    with open_store(sqlite_url, create=False) as store, pytest.raises(StoreConfigError):
        run_workflows(store, "orders-new")


def test_an_interrupted_rekey_run_again_rewrites_only_what_is_left(sqlite_url):
    old, new = Keyring.generate(), Keyring.generate()
    with open_store(sqlite_url, keyring=ring(old)) as store:
        run_workflows(store)
        total = len(store.recorder.select_notifications(start=None, limit=10_000))

    class Stop(Exception):
        pass

    def stop_after_first_page(report):
        raise Stop

    with open_store(sqlite_url, keyring=ring(new, old)) as store:
        with pytest.raises(Stop):
            rekey(store, rows_per_transaction=2, progress=stop_after_first_page)
        rest = rekey(store, rows_per_transaction=2)
        assert (rest.current, rest.resealed) == (2, total - 2)
        assert store.verify_chain().ok
    with open_store(sqlite_url, keyring=ring(new), create=False) as store:
        assert_reads_back(store)


def test_rekey_on_a_memory_store():
    old, new = Keyring.generate(), Keyring.generate()
    with open_store("memory://", keyring=ring(old)) as store:
        run_workflows(store)
        store._mapper.keyring = ring(new, old)
        assert rekey(store).resealed > 0
        store._mapper.keyring = ring(new)
        assert_reads_back(store)
        assert store.verify_chain().ok


def test_rekey_needs_the_keys_and_every_old_key(sqlite_url):
    old = Keyring.generate()
    with open_store(sqlite_url, keyring=ring(old)) as store:
        run_workflows(store)
    with (
        open_store(sqlite_url, create=False) as store,
        pytest.raises(StoreConfigError, match="opened without keys"),
    ):
        rekey(store)
    wrong = ring(Keyring.generate())
    with (
        open_store(sqlite_url, create=False, keyring=wrong) as store,
        pytest.raises(DecodeError, match=f"encrypted with key {fp(old)}"),
    ):
        rekey(store)


def test_a_sealed_row_or_document_altered_or_moved_does_not_open(sqlite_url):
    key = Keyring.generate()
    with open_store(sqlite_url, keyring=ring(key)) as store:
        run_workflows(store)
        projector = Projector(store, ["state"])
        projector.catch_up()
        table = projector.views["state"].table
    path = sqlite_url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:
        conn.execute(f"INSERT INTO {table} SELECT 'orders-2', key, doc FROM {table}")
        last, state = conn.execute(
            "SELECT rowid, state FROM steplog_events ORDER BY rowid DESC LIMIT 1"
        ).fetchone()
        altered = state[:40] + bytes([state[40] ^ 1]) + state[41:]
        conn.execute("UPDATE steplog_events SET state = ? WHERE rowid = ?", (altered, last))
    with open_store(sqlite_url, keyring=ring(key), create=False) as store:
        with pytest.raises(LogIntegrityError, match="altered or moved"):
            Projector(store, ["state"]).state("orders-2")
        # The view's manifest names the event it was folded up to, in the altered row: checking
        # it against the log meets the broken seal (issue 21: views never outvote the log).
        with pytest.raises(LogIntegrityError, match="altered or moved"):
            Projector(store, ["state"]).state("orders-1")
        with pytest.raises(LogIntegrityError, match="altered or moved") as caught:
            store.read("orders-1")
        assert caught.value.kind == "seal broken"
    with open_store(sqlite_url, keyring=ring(Keyring.generate(), key)) as store:
        with pytest.raises(LogIntegrityError, match="rekey stopped there") as stopped:
            rekey(store)
        assert (stopped.value.instance_id, stopped.value.kind) == ("orders-1", "seal broken")
        assert stopped.value.position == caught.value.position


def test_rekey_seals_the_one_event_rows_of_the_first_format(tmp_path):
    path = tmp_path / "format1.db"
    shutil.copy(DATA / "format1.db", path)
    url = f"sqlite:///{path}"
    with open_store(url, create=False) as store:
        before = {i: store.read(i) for i in store.instances()}
        report = store.verify_chain()
    key = Keyring.generate()
    with open_store(url, keyring=ring(key)) as store:
        rows = rekey(store)
        assert rows.converted > 0
        assert rows.written == rows.rows
        assert {i: store.read(i) for i in store.instances()} == before
        after = store.verify_chain()
        assert (after.ok, after.events, after.unchained_events) == (
            report.ok,
            report.events,
            report.unchained_events,
        )
    with sqlite3.connect(path) as conn:
        states = [bytes(s) for (s,) in conn.execute("SELECT state FROM steplog_events")]
    assert all(s.startswith(b"\x00SL1") for s in states)


# -- where keys come from: STEPLOG_KEYS, unless opted out (issue 21) ----------------------------


def test_open_store_by_url_alone_takes_the_keys_of_steplog_keys(durable_store_url, monkeypatch):
    """``open_store(url)`` ignored ``$STEPLOG_KEYS`` and wrote every value in plain text."""
    key = Keyring.generate()
    monkeypatch.setenv(KEYS_ENV, key)
    with open_store(durable_store_url) as store:
        assert store.keyring is not None
        assert store.keyring.fingerprints == [fp(key)]
        run_workflows(store)
        build_views(store)
    assert leaks(durable_store_url) == []
    monkeypatch.delenv(KEYS_ENV)
    with (
        open_store(durable_store_url, create=False) as store,  # the rows need the key
        pytest.raises(DecodeError, match=r"is encrypted.*STEPLOG_KEYS"),
    ):
        store.read("orders-1")
    with open_store(durable_store_url, keyring=ring(key), create=False) as store:
        assert_reads_back(store)


def test_the_builders_default_store_takes_the_keys_of_steplog_keys(sqlite_url, monkeypatch):
    key = Keyring.generate()
    monkeypatch.setenv(KEYS_ENV, key)
    monkeypatch.setenv(DEFAULT_STORE_ENV, sqlite_url)
    intake = Intake(id="intake")
    workflow = (
        WorkflowBuilder(start_executor=intake, instance_id="b")
        .add_edge(intake, Charge(id="charge"))
        .build()
    )
    asyncio.run(workflow.run({"card": SECRET}))
    workflow.store.close()
    assert leaks_in_sqlite(sqlite_url) == []


def test_keyring_none_opts_out_of_steplog_keys_explicitly(sqlite_url, monkeypatch):
    monkeypatch.setenv(KEYS_ENV, Keyring.generate())
    with open_store(sqlite_url, keyring=None) as store:
        assert store.keyring is None
        run_workflows(store)
    assert leaks_in_sqlite(sqlite_url) != []  # asked for: plain text


@pytest.mark.parametrize("choice", ["ENV", "", 0, b"key"])
def test_a_keyring_that_is_neither_keys_nor_from_env_nor_none_is_refused(choice):
    with pytest.raises(StoreConfigError, match=r"must be a kernel\.Keyring, kernel\.FROM_ENV"):
        open_store("memory://", keyring=choice)
    assert FROM_ENV == "env"


def test_malformed_steplog_keys_make_open_store_refuse_naming_the_place(sqlite_url, monkeypatch):
    key = Keyring.generate()
    monkeypatch.setenv(KEYS_ENV, f"{key}\n{key}trailing")
    with pytest.raises(StoreConfigError, match="key 2 of \\$STEPLOG_KEYS is not base64") as caught:
        open_store(sqlite_url)
    assert key not in str(caught.value)
