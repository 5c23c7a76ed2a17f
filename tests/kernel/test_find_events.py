"""``EventStore.find_events``: the events of rare types found by looking at each row's bytes,
decoding only the rows that may hold one; the answer is always ``read(..., types=...)``'s, on
every backend, for rows whose values look like type codes, for rows rewritten with JSON
whitespace (their hashes unchanged), and for sealed rows."""

from __future__ import annotations

import sqlite3

import orjson
import pytest

from kernel import EventStore, Keyring, StoreConfigError, open_store
from kernel._store._scan import codes_pattern
from kernel.testing import LogBuilder
from tests.projections.test_sensitive import fork_secrets, write_secrets

RARE = [
    ["run_started"],
    ["instance_forked"],
    ["run_started", "instance_forked"],
    ["superstep_committed"],
    ["state_staged", "run_completed"],
]


def _decoys(store: EventStore) -> None:
    """A run whose values are arrays that open with type codes (0, 17, 18): rows that look as
    if they held a run start, and hold none."""
    log = LogBuilder("vault", version=store.version("vault"))
    log.start_run("in")
    log.start_superstep()
    log.invoke("x")
    log.write("k0", [0, 1])
    log.write("k17", [17, "instance_forked"])
    log.write("k18", [[18, 2], "[18,"])
    log.commit()
    log.complete_run()
    log.append_to(store)


def _written(store: EventStore) -> None:
    fork_secrets(store, write_secrets(store))
    _decoys(store)


@pytest.mark.parametrize("types", RARE, ids=",".join)
def test_find_events_finds_what_a_filtered_read_finds(store_url, types):
    with open_store(store_url) as store:
        _written(store)
        for instance in ("vault", "vault-fork"):
            end = store.version(instance)
            assert store.find_events(instance, types) == store.read(instance, types=types)
            for after, upto in ((0, 5), (3, 17), (10, None), (end - 4, end)):
                found = store.find_events(instance, types, after=after, upto=upto)
                assert found == store.read(instance, after=after, upto=upto, types=types)
        starts = store.find_events("vault", ["run_started"])
        assert [e.type for e in starts] == ["run_started"] * 3
        assert starts[1].sensitive_keys == ["password", "secret_*"]


def test_a_row_rewritten_with_json_whitespace_is_still_found(sqlite_url):
    """Whitespace changes no hash: a log so rewritten reads the same, and no run start in it
    may be missed."""
    with open_store(sqlite_url) as store:
        _written(store)
        before = store.read("vault", types=["run_started"])
    path = sqlite_url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT originator_id, originator_version, state FROM steplog_events")
        for instance, last, state in rows.fetchall():
            spaced = orjson.dumps(orjson.loads(state), option=orjson.OPT_INDENT_2)
            spaced = spaced.replace(b"[\n", b"[ \t\r\n").replace(b",\n", b" \n,\n")
            db.execute(
                "UPDATE steplog_events SET state = ? WHERE originator_id = ? AND "
                "originator_version = ?",
                (spaced, instance, last),
            )
    with open_store(sqlite_url) as store:
        assert store.read("vault", types=["run_started"]) == before
        assert store.find_events("vault", ["run_started"]) == before
        assert len(before) == 3


def test_sealed_rows_are_opened_and_looked_at(sqlite_url):
    keyring = Keyring.from_text(Keyring.generate())
    with open_store(sqlite_url, keyring=keyring) as store:
        _written(store)
        for types in RARE:
            assert store.find_events("vault", types) == store.read("vault", types=types)


def test_the_pattern_matches_a_code_as_json_may_write_it_and_no_other():
    pattern = codes_pattern({"run_started"})  # codes 0 and 18
    for text in (b"[0,1]", b"[18,0]", b"[ \t\r\n18 \n,", b"[-0,", b"[0]", b'x",[18,'):
        assert pattern.search(text), text
    for text in (b"[10,", b"[180,", b"[1,8,", b"[8,", b'"18,"', b"[ 1 8,", b"[17,"):
        assert not pattern.search(text), text


def test_find_events_needs_a_known_type(store_url):
    with open_store(store_url) as store:
        with pytest.raises(StoreConfigError, match="at least one"):
            store.find_events("vault", [])
        with pytest.raises(StoreConfigError, match="unknown event type"):
            store.find_events("vault", ["run_begun"])
