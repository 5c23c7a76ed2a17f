"""The batch row format: one row per append, every event at its own position, hostile rows refused
with the position of what is wrong, and the version check exact whatever the batches' lengths."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import orjson
import pytest
from eventsourcing.persistence import StoredEvent

from kernel import (
    ConcurrencyConflictError,
    DecodeError,
    EventStore,
    InvalidBatchError,
    SchemaVersionError,
    StateStaged,
    counter_ids,
    open_store,
)
from kernel._codec._mapper import RowMapper
from kernel.testing import LogBuilder, ticking_clock

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def superstep(instance: str, version: int, value: object = 1) -> list:
    ids = counter_ids(f"{instance}{version}")
    log = LogBuilder(instance, clock=ticking_clock(T0), ids=ids, version=version)
    log.start_run()
    log.start_superstep()
    log.invoke("a")
    log.write("k", value)
    log.commit()
    return log.events()


def test_one_append_is_one_row_and_reads_back_position_by_position(store: EventStore) -> None:
    events = superstep("i", 0)
    positions = store.append("i", events, expected_version=0)
    more = superstep("i", len(events), value={"deep": [1, None, "✓"]})
    positions += store.append("i", more, expected_version=len(events))
    assert store.read("i") == events + more
    assert len({p >> 20 for p in positions}) == 2  # two rows
    for after in range(len(events) + len(more)):
        for upto in range(after, len(events) + len(more) + 1):
            window = store.read("i", after=after, upto=upto)
            assert [e.position for e in window] == list(range(after + 1, upto + 1))
    page = store.read_all(after=positions[2], limit=3)
    assert [r.global_position for r in page] == positions[3:6]
    assert store.read_all(after=positions[-2]) == store.read_all()[-1:]
    assert store.last_position() == positions[-1]
    only = store.read_all(types=["state_staged"])
    assert [r.event.key for r in only] == ["k", "k"]  # type: ignore[attr-defined]


def test_a_stale_version_inside_an_earlier_batch_is_a_conflict(store: EventStore) -> None:
    first = superstep("i", 0)
    store.append("i", first, expected_version=0)
    second = superstep("i", len(first))
    store.append("i", second, expected_version=len(first))
    before = store.read_all()
    stale = superstep("i", 2)  # positions 3.. : inside the first row, not at a row's end
    with pytest.raises(ConcurrencyConflictError):
        store.append("i", stale, expected_version=2)
    ahead = superstep("i", 99)
    with pytest.raises(ConcurrencyConflictError):
        store.append("i", ahead, expected_version=99)
    assert store.read_all() == before


def test_append_many_commits_the_good_batches_and_reports_the_conflicting_one(
    store: EventStore,
) -> None:
    store.append("b", superstep("b", 0), expected_version=0)
    results = store.append_many(
        [
            ("a", superstep("a", 0), 0),
            ("b", superstep("b", 0), 0),
            ("c", [], 0),
            ("d", superstep("d", 0), 0),
        ]
    )
    assert isinstance(results[1], ConcurrencyConflictError)
    assert results[2] == []
    assert [len(r) for r in (results[0], results[3])] == [5, 5]  # type: ignore[arg-type]
    assert store.instances() == ["a", "b", "d"]
    assert store.read("a") == superstep("a", 0)


def test_a_batch_too_big_for_one_row_is_refused(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("kernel._store._eventstore.ROW_EVENTS", 3)
    with pytest.raises(InvalidBatchError, match="at most 3 events"):
        store.append("i", superstep("i", 0), expected_version=0)
    assert store.instances() == []


def test_times_in_several_offsets_and_defaults_round_trip() -> None:
    mapper = RowMapper()
    zones = [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-4))]
    stamps = iter([T0.astimezone(z) + timedelta(microseconds=i) for i, z in enumerate(zones * 2)])
    log = LogBuilder("i", clock=lambda: next(stamps))
    log.start_run()
    log.start_superstep()
    log.invoke("a")
    log.write("k", None)
    events = log.events()
    row = mapper.to_row(events)
    decoded = mapper.decode_row("i", row.originator_version, row.topic, row.state)
    assert decoded == events
    assert [e.timestamp.utcoffset() for e in decoded] == [e.timestamp.utcoffset() for e in events]


def row_of(state: object, topic: str = "2", last: int = 2) -> StoredEvent:
    return StoredEvent(
        originator_id="i", originator_version=last, topic=topic, state=orjson.dumps(state)
    )


def good() -> list:
    events = superstep("i", 0)[:2]  # run_started, superstep_started
    return list(orjson.loads(RowMapper().to_row(events).state))


@pytest.mark.parametrize(
    ("mutate", "error", "match"),
    [
        (lambda b: b"[1,2", DecodeError, r"row 'i'#1\.\.2 is not valid JSON"),
        (lambda b: {"a": 1}, DecodeError, "is not a batch row"),
        (lambda b: [99, *b[1:]], SchemaVersionError, "newer than this steplog"),
        (lambda b: [0, *b[1:]], DecodeError, "unknown batch format"),
        (lambda b: b[:-1], DecodeError, "holds 1 events, its topic says 2"),
        (lambda b: [*b[:3], [1], *b[4:]], DecodeError, "malformed string table"),
        (lambda b: [b[0], "x", *b[2:]], DecodeError, "base time"),
        (lambda b: [*b[:2], [0], *b[3:]], DecodeError, "malformed UTC offsets"),
        (lambda b: [*b[:2], 10**12, *b[3:]], DecodeError, "UTC offset out of range"),
        (lambda b: [*b[:5], [500, 0], b[6]], DecodeError, r"'i'#1 has unknown type code 500"),
        (lambda b: [*b[:6], "x"], DecodeError, r"'i'#2 is not \[code, time"),
        (lambda b: [*b[:6], [b[6][0], "t", *b[6][2:]]], DecodeError, "time that is not"),
        (lambda b: [*b[:6], [*b[6], 1, 2, 3, 4]], DecodeError, r"#2 \(superstep_started\) has"),
        (lambda b: [*b[:6], [b[6][0], 0, 7]], DecodeError, "refers to string 7"),
        (lambda b: [*b[:6], [b[6][0], 0, 0, 9]], DecodeError, r"#2 \(\w+\) refers to string 9"),
        (lambda b: [*b[:6], [b[6][0], 0, 0, 1, "one"]], DecodeError, "field 'index'"),
        (lambda b: [*b[:6], [b[6][0], 0, 0]], DecodeError, "lacks its required field"),
        (lambda b: [*b[:4], "not base64!", *b[5:]], DecodeError, "malformed hash chain"),
        (lambda b: [*b[:4], 7, *b[5:]], DecodeError, "malformed hash chain"),
        (lambda b: [*b[:4], b[4][:24], *b[5:]], DecodeError, "chain of 18 bytes; 2 events need 34"),
    ],
)
def test_a_tampered_batch_row_names_what_and_where(mutate, error, match) -> None:  # type: ignore[no-untyped-def]
    body = good()
    tampered = mutate(body)
    state = tampered if isinstance(tampered, bytes) else orjson.dumps(tampered)
    with pytest.raises(error, match=match):
        RowMapper().decode_row("i", 2, "2", state)


@pytest.mark.parametrize(("topic", "last"), [("0", 2), ("3", 2), ("x", 2), ("", 2)])
def test_a_row_with_a_bad_count_is_refused(topic: str, last: int) -> None:
    with pytest.raises(DecodeError, match="'i'#2"):
        RowMapper().decode_row("i", last, topic, orjson.dumps(good()))


def test_a_tampered_row_in_a_store_is_reported_by_every_reader(store: EventStore) -> None:
    store.append("i", superstep("i", 0), expected_version=0)
    body = good()
    body = [1, *body[1:4], body[5], [body[6][0], 0, 0, 1, "one"]]  # a row before the chain
    store.recorder.insert_events([row_of(body, "2", 7)])
    with pytest.raises(DecodeError, match=r"'i'#7"):
        store.read("i")
    with pytest.raises(DecodeError, match=r"'i'#7"):
        store.read_all()
    assert [e.position for e in store.read("i", upto=5)] == [1, 2, 3, 4, 5]
    assert isinstance(store.read("i", upto=5)[3], StateStaged)


def test_a_time_at_the_edge_of_the_calendar_reads_back_in_its_own_offset() -> None:
    mapper = RowMapper()
    late = datetime(9999, 12, 31, 22, tzinfo=timezone(timedelta(hours=-5)))  # past UTC's last day
    for stamps in ([late, late], [late, late.replace(tzinfo=timezone(timedelta(hours=-4)))]):
        log = LogBuilder("i", clock=iter(stamps).__next__, ids=counter_ids())
        log.start_run()
        log.start_superstep()
        row = mapper.to_row(log.events())
        decoded = mapper.decode_row("i", row.originator_version, row.topic, row.state)
        assert [e.timestamp for e in decoded] == stamps
        assert [e.timestamp.utcoffset() for e in decoded] == [s.utcoffset() for s in stamps]


@pytest.mark.parametrize(
    ("last", "topic", "match"),
    [
        (2, "9" * 5000, "has a count"),
        ("abc", "2", "not an integer"),
        (None, "2", "not an integer"),
        (2.5, "2", "not an integer"),
    ],
)
def test_a_row_with_a_hostile_count_or_position_is_a_decode_error(
    last: object, topic: str, match: str
) -> None:
    with pytest.raises(DecodeError, match=match):
        RowMapper().decode_row("i", last, topic, orjson.dumps(good()))  # type: ignore[arg-type]


def test_per_event_offsets_out_of_range_are_a_decode_error() -> None:
    body = good()
    body[1] = 253402300799999999  # the last microsecond a datetime holds, as wall time
    body[2] = [3600000000, 3600000000]  # an hour further on: past it
    with pytest.raises(DecodeError, match="out of range"):
        RowMapper().decode_row("i", 2, "2", orjson.dumps(body))


def test_hostile_positions_in_a_sqlite_store_are_decode_errors(sqlite_url: str) -> None:
    import sqlite3

    with open_store(sqlite_url) as store:
        store.append("i", superstep("i", 0), expected_version=0)
    with sqlite3.connect(sqlite_url.removeprefix("sqlite:///")) as db:
        db.execute(
            "INSERT INTO steplog_events (originator_id, originator_version, topic, state) "
            "VALUES ('i', 'abc', '2', ?)",
            (orjson.dumps(good()),),
        )
    with open_store(sqlite_url, create=False) as store:
        for read in (store.read_all, store.last_position, lambda: store.version("i")):
            with pytest.raises(DecodeError, match="not an integer"):
                read()
