"""The hash chain and the row cipher, unit by unit: what each event's hash covers, how rows link,
the recorded heads on every backend, exported heads, and sealed rows.

Tampering with real rows written by real workflows, kind by kind, is in ``test_tamper.py``.
"""

from __future__ import annotations

import base64

import orjson
import pytest

from kernel import (
    ChainHead,
    DecodeError,
    EventStore,
    Keyring,
    LogIntegrityError,
    StoreConfigError,
    open_store,
)
from kernel._codec._chain import link_problem, tail_problem
from kernel._codec._hashing import CHAIN_BYTES, TAG_BYTES, RowLink, genesis
from kernel._codec._mapper import RowMapper
from kernel.testing import LogBuilder


def superstep_log(instance: str = "i", steps: int = 3) -> LogBuilder:
    log = LogBuilder(instance)
    log.start_run()
    for n in range(steps):
        log.start_superstep()
        log.invoke("a")
        log.write("k", {"n": n, "note": "grüße"})
        log.commit()
    return log


def append_in_rows(store: EventStore, instance: str, size: int = 4) -> int:
    """Append a log in rows of ``size`` events; the stream's version."""
    events = superstep_log(instance).events()
    for start in range(0, len(events), size):
        store.append(instance, events[start : start + size], expected_version=start)
    return len(events)


def chain_of(state: bytes) -> bytes:
    return base64.b64decode(orjson.loads(state)[4])


def test_a_row_is_checked_whole_and_an_edit_named_by_position() -> None:
    """Batch format 3: the hash before the row and its last hash in full, a 2-byte tag per event
    between them. Any read of the row recomputes every hash; the tags name the edited event."""
    mapper = RowMapper()
    events = superstep_log().events()[:6]
    row = mapper.to_row(events)
    body = orjson.loads(row.state)
    assert body[0] == 3
    chain = chain_of(row.state)
    assert len(chain) == 2 * CHAIN_BYTES + TAG_BYTES * 5  # before, 5 tags, the last hash
    assert row.head == chain[-CHAIN_BYTES:]
    assert mapper.decode_row("i", 6, "6", row.state) == events
    body[5 + 3][-1] = {"n": 99, "note": "grüße"}  # the write at position 4
    tampered = orjson.dumps(body)
    with pytest.raises(LogIntegrityError, match=r"'i'#4 \(state_staged\) does not match") as caught:
        mapper.decode_row("i", 6, "6", tampered)
    assert (caught.value.instance_id, caught.value.position, caught.value.kind) == (
        "i",
        4,
        "edited",
    )
    # A read of any part of the row checks the whole row: the events before the edit, or of
    # another type, are refused with it (in format 2, each was checked alone: test_batch2.py).
    for window in ({"upto": 3}, {"after": 4}, {"types": {"run_started"}}):
        with pytest.raises(LogIntegrityError, match="'i'#4") as caught:
            mapper.decode_row("i", 6, "6", tampered, **window)  # type: ignore[arg-type]
        assert caught.value.position == 4
    with pytest.raises(LogIntegrityError, match="'i'#4"):
        mapper.decode_row("i", 6, "6", tampered, types=(), check_all=True)
    assert mapper.decode_row("i", 6, "6", tampered, types=()) == []  # nothing read: unchecked
    seen: list[LogIntegrityError] = []
    read = mapper.decode_row("i", 6, "6", tampered, on_broken=seen.append)
    assert [e.position for e in read] == [1, 2, 3, 4, 5, 6]
    assert [e.position for e in seen] == [4]  # one problem a row: every later hash differs too


def test_an_edit_whose_tags_were_recomputed_is_still_refused() -> None:
    """The tags name the event; they never vouch for one. Whoever edits an event and rewrites
    the tags after it to match still changes the row's last hash, and the row is refused (named
    at its last event, where the recomputed hash no longer matches)."""
    mapper = RowMapper()
    events = superstep_log().events()[:6]
    body = orjson.loads(mapper.to_row(events).state)
    edited = [*events[:3], events[3].model_copy(update={"value": {"n": 99}}), *events[4:]]
    forged = chain_of(mapper.to_row(edited).state)
    chain = chain_of(bytes(mapper.to_row(events).state))
    body[5 + 3] = orjson.loads(mapper.to_row(edited).state)[5 + 3]
    body[4] = base64.b64encode(forged[:-CHAIN_BYTES] + chain[-CHAIN_BYTES:]).decode()
    with pytest.raises(LogIntegrityError) as caught:
        mapper.decode_row("i", 6, "6", orjson.dumps(body))
    assert (caught.value.position, caught.value.kind) == (6, "edited")
    # The tags alone altered (the events intact) is refused too: the row is not as written.
    body = orjson.loads(mapper.to_row(events).state)
    body[4] = base64.b64encode(chain[:CHAIN_BYTES] + b"\0\0" + chain[CHAIN_BYTES + 2 :]).decode()
    with pytest.raises(LogIntegrityError) as caught:
        mapper.decode_row("i", 6, "6", orjson.dumps(body))
    assert caught.value.position == 1


def test_the_hash_of_any_event_is_recomputed_from_its_row() -> None:
    """``event_hash`` of a position inside a row of format 3 is recomputed from the hash before
    the row and the row's events up to it: an edit after it changes nothing, one before it does."""
    mapper = RowMapper()
    events = superstep_log().events()[:6]
    row = mapper.to_row(events)
    hashes = []
    previous = None
    for event in events:  # one row per event: every hash is stored whole
        one = mapper.to_row([event], previous)
        hashes.append(one.head)
        previous = one.head
    assert [mapper.event_hash("i", 6, "6", row.state, p) for p in range(1, 7)] == hashes
    assert mapper.event_hash("i", 6, "6", row.state, 7) is None
    body = orjson.loads(row.state)
    body[5 + 3][-1] = {"n": 99}  # position 4
    tampered = orjson.dumps(body)
    found = [mapper.event_hash("i", 6, "6", tampered, p) for p in range(1, 7)]
    assert found[:3] == hashes[:3]
    assert all(f != h for f, h in zip(found[3:], hashes[3:], strict=True))
    body[5 + 4] = [500, 0]  # position 5: a code no steplog wrote
    unreadable = orjson.dumps(body)
    found = [mapper.event_hash("i", 6, "6", unreadable, p) for p in range(1, 7)]
    assert found[:3] == hashes[:3] != found[3:]
    assert found[4:] == [b"", b""]  # matches no hash: no event from the unreadable one on


def test_a_rewritten_marker_is_named_as_one() -> None:
    mapper = RowMapper()
    log = LogBuilder("i")
    log.start_run()
    log.start_superstep()
    log.invoke("a")
    log.write("secret", "s3cret")
    log.abort("failed")
    events = log.events()
    row = mapper.to_row(events)
    body = orjson.loads(row.state)
    committed = RowMapper().to_row(
        [*events[:-1], *_commit_like(events[-1])]
    )  # the same superstep, committed: its marker's code and fields
    body[-1] = orjson.loads(committed.state)[-1]
    with pytest.raises(LogIntegrityError, match="marker was rewritten") as caught:
        mapper.decode_row("i", len(events), str(len(events)), orjson.dumps(body))
    assert caught.value.kind == "marker rewritten"
    assert caught.value.position == len(events)


def _commit_like(aborted: object) -> list:  # type: ignore[type-arg]
    from kernel import SuperstepCommitted

    data = {
        k: v
        for k, v in aborted.__dict__.items()  # type: ignore[attr-defined]
        if k in ("instance_id", "position", "timestamp", "run_id", "superstep_id")
    }
    return [SuperstepCommitted(**data)]


def test_hashes_cover_the_logical_event_not_its_packing() -> None:
    """The same events packed in rows of different sizes have the same hashes."""
    mapper = RowMapper()
    events = superstep_log().events()
    whole = mapper.to_row(events)
    last, count = whole.originator_version, whole.topic
    hashes: list[bytes | None] = []
    previous = None
    for start in range(0, len(events), 3):
        part = mapper.to_row(events[start : start + 3], previous)
        end = part.originator_version
        hashes += [
            mapper.event_hash("i", end, part.topic, part.state, p)
            for p in range(start + 1, end + 1)
        ]
        previous = part.head
    assert hashes == [
        mapper.event_hash("i", last, count, whole.state, p) for p in range(1, last + 1)
    ]
    assert whole.head == previous == hashes[-1]


def test_rows_link_up_or_say_how_they_do_not() -> None:
    g = genesis("i")
    first = RowLink(1, 3, g, b"a" * 16)
    assert link_problem("i", None, first) is None
    assert link_problem("i", first, RowLink(4, 5, b"a" * 16, b"b" * 16)) is None
    gap = link_problem("i", first, RowLink(6, 7, b"a" * 16, b"b" * 16))
    assert gap is not None
    assert (gap.kind, gap.position) == ("gap", 4)
    overlap = link_problem("i", first, RowLink(3, 5, b"a" * 16, b"b" * 16))
    assert overlap is not None
    assert (overlap.kind, overlap.position) == ("reordered", 3)
    moved = link_problem("i", first, RowLink(4, 5, b"c" * 16, b"b" * 16))
    assert moved is not None
    assert (moved.kind, moved.position) == ("reordered", 4)
    stripped = link_problem("i", first, RowLink(4, 5, None, None))
    assert stripped is not None
    assert stripped.kind == "unchained"
    late_start = link_problem("i", None, RowLink(3, 4, g, b"x" * 16))
    assert late_start is not None
    assert late_start.kind == "gap"
    assert link_problem("i", RowLink(1, 1, None, None), RowLink(2, 2, g, b"x" * 16)) is None
    truncated = tail_problem("i", first, (7, b"z" * 16))
    assert truncated is not None
    assert (truncated.kind, truncated.position) == ("truncated", 4)
    rewritten = tail_problem("i", first, (3, b"z" * 16))
    assert rewritten is not None
    assert rewritten.kind == "head mismatch"
    assert tail_problem("i", first, (3, b"a" * 16)) is None


def test_every_backend_records_heads_and_verifies_a_clean_log(store: EventStore) -> None:
    version = append_in_rows(store, "x")
    append_in_rows(store, "y", size=100)
    report = store.verify_chain()
    assert report.ok, report.problems
    assert (report.instances, report.events) == (2, 2 * version)
    head = store.chain_head("x")
    assert head is not None
    assert head.position == version
    assert head.hash == chain_of_last(store, "x").hex()
    assert store.verify_chain("x", heads=[head]).ok
    forged = ChainHead("x", 5, "00" * 16)
    found = store.verify_chain("x", heads=[forged]).problems
    assert [(p.kind, p.position) for p in found] == [("head mismatch", 5)]
    past = store.verify_chain("x", heads=[ChainHead("x", version + 3, head.hash)]).problems
    assert [p.kind for p in past] == ["truncated"]


def chain_of_last(store: EventStore, instance: str) -> bytes:
    rows = store.backend.select_stream(instance)
    return chain_of(rows[-1][2])[-CHAIN_BYTES:]


def test_batches_of_one_instance_chain_within_one_group_commit(store: EventStore) -> None:
    events = superstep_log("g").events()
    results = store.append_many([("g", events[:5], 0), ("g", events[5:], 5)])
    assert all(isinstance(r, list) for r in results)
    assert store.read("g") == events
    assert store.verify_chain("g").ok


def test_a_new_store_object_continues_the_chain_from_the_stored_head(
    durable_store_url: str,
) -> None:
    events = superstep_log("c").events()
    with open_store(durable_store_url) as first:
        first.append("c", events[:5], expected_version=0)
    with open_store(durable_store_url) as second:
        second.append("c", events[5:], expected_version=5)
        assert second.read("c") == events
        report = second.verify_chain()
        assert report.ok, report.problems


def test_a_signed_head_proves_itself_and_a_changed_one_does_not() -> None:
    head = ChainHead("i", 7, "ab" * 16)
    signed = head.sign(b"auditor key")
    assert signed.signed_by(b"auditor key")
    assert not signed.signed_by(b"another key")
    assert not ChainHead("i", 8, signed.hash, signed.signature).signed_by(b"auditor key")
    assert ChainHead.from_json(signed.to_json()) == signed
    for bad in ({}, {"instance_id": "i", "position": 0, "hash": "ab" * 16}, [1]):
        with pytest.raises(StoreConfigError):
            ChainHead.from_json(bad)


# -- the cipher ----------------------------------------------------------------------------------


def test_a_keyring_seals_binds_and_names_its_keys() -> None:
    old, new = Keyring.generate(), Keyring.generate()
    ring = Keyring.from_text(f"{new},{old}")
    sealed = ring.seal(b'{"secret": 1}', b"here")
    assert b"secret" not in sealed
    assert ring.open(sealed, b"here", "x") == b'{"secret": 1}'
    with pytest.raises(LogIntegrityError, match="altered or moved"):
        ring.open(sealed, b"there", "x")  # moved
    flipped = sealed[:-1] + bytes([sealed[-1] ^ 1])
    with pytest.raises(LogIntegrityError, match="altered or moved"):
        ring.open(flipped, b"here", "x")
    with pytest.raises(DecodeError, match="not in the keyring"):
        Keyring.from_text(old).open(sealed, b"here", "x")  # wrong key
    assert Keyring.from_text(old).open(Keyring.from_text(old).seal(b"a", b"p"), b"p", "x") == b"a"
    assert new not in repr(ring)
    with pytest.raises(StoreConfigError, match="key 2 of the keyring is not base64"):
        Keyring.from_text(f"{new},not base64!")
    with pytest.raises(StoreConfigError, match="not 32 bytes"):
        Keyring([b"short"])


def test_an_encrypted_store_holds_no_plain_value_and_refuses_keyless_writers(
    durable_store_url: str,
) -> None:
    ring = Keyring.from_text(Keyring.generate())
    log = LogBuilder("e")
    log.start_run()
    log.start_superstep()
    log.invoke("a")
    log.write("card", "4111-SECRET")
    log.commit()
    with open_store(durable_store_url, keyring=ring) as store:
        log.append_to(store)
        rows = store.backend.select_stream("e")
        assert all(b"SECRET" not in state for _, _, state in rows)
        assert store.read("e") == log.events()
        assert store.verify_chain().ok
    with pytest.raises(StoreConfigError, match="is encrypted"):
        open_store(durable_store_url)
    with (
        open_store(durable_store_url, create=False) as reader,
        pytest.raises(DecodeError, match=r"'e'#1\.\..*is encrypted.*STEPLOG_KEYS"),
    ):
        reader.read("e")
    other = Keyring.from_text(Keyring.generate())
    with pytest.raises(LogIntegrityError, match="not in the keyring"):
        open_store(durable_store_url, keyring=other)  # a writer with the wrong keys
    with (
        open_store(durable_store_url, keyring=other, create=False) as wrong,
        pytest.raises(DecodeError, match="not in the keyring"),
    ):
        wrong.read("e")


async def test_verify_names_an_event_every_reader_refuses_though_its_hash_holds() -> None:
    """Issue 22 review: a ``RunStarted`` whose ``durability`` a buggy writer set to "bogus" was
    refused by every reader ("the row is damaged; 'steplog verify' lists every unreadable row"),
    while ``verify`` said the chain was ok. verify decodes every event as a reader would: the
    event is named ``malformed`` at its position, and the rows after it still link up."""
    from tests.durable.helpers import Tick, counting

    store = open_store("memory://")
    wf = counting(store, "a", limit=3)
    wf._instance.durability = "bogus"  # a writer around the settings check
    await wf.run(Tick(1))
    with pytest.raises(DecodeError, match=r"'a'#1 \(run_started\) does not fit its schema"):
        store.read("a")
    report = store.verify_chain()
    assert not report.ok
    assert [(p.instance_id, p.position, p.kind) for p in report.problems] == [("a", 1, "malformed")]
    assert "durability" in report.problems[0].detail
    assert report.rows > 1  # the rows after it were read and linked: no other problem
