"""The event store contract: every backend passes this one suite unchanged (see ``store_url``)."""

from __future__ import annotations

import itertools
import queue
import threading
import uuid
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from kernel import (
    EVENT_TYPES,
    ConcurrencyConflictError,
    ErrorInfo,
    EventBase,
    EventStore,
    InvalidBatchError,
    LogIntegrityError,
    Recorded,
    RunStarted,
    StateStaged,
    StoreConfigError,
    ValueCodec,
)
from kernel._codec._mapper import RowMapper
from kernel.testing import LogBuilder, ticking_clock

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
WAIT = 10.0  # seconds: the most any wait in this module may take before the test fails


def staged(instance_id: str, position: int, *, key: str = "k", value: Any = 1) -> StateStaged:
    """A small event for stream ``instance_id`` at ``position``."""
    when = T0 + timedelta(seconds=position)
    log = LogBuilder(instance_id, clock=lambda: when, version=position - 1)
    return log.write(key, value, executor_id="writer", superstep="ss-1", run="run-1")


def stream(instance_id: str, count: int, *, start: int = 1) -> list[EventBase]:
    """``count`` small events for stream ``instance_id``, from position ``start``."""
    clock = ticking_clock(T0 + timedelta(seconds=start - 1))
    log = LogBuilder(instance_id, clock=clock, version=start - 1)
    for _ in range(count):
        log.write("k", 1, executor_id="writer", superstep="ss-1", run="run-1")
    return log.events()


def snapshot(store: EventStore, instance_id: str = "a") -> tuple[Any, ...]:
    """Everything a failed append must leave unchanged (a stream with a planted gap reads as
    the error that names the gap)."""
    try:
        events: Any = store.read(instance_id)
    except LogIntegrityError as error:
        events = str(error)
    try:
        everything: Any = store.read_all()
    except LogIntegrityError as error:
        everything = str(error)
    return (
        events,
        store.version(instance_id),
        everything,
        store.last_position(),
        store.instances(),
    )


def plant(store: EventStore, event: EventBase) -> None:
    """Write ``event`` with the recorder, bypassing ``append``'s checks (a gap in a stream)."""
    store.recorder.insert_events([RowMapper().to_stored(event)])


def keys(events: list[EventBase]) -> list[tuple[str, int]]:
    return [(e.instance_id, e.position) for e in events]


def where(recorded: list[Recorded]) -> list[tuple[str, int]]:
    return keys([r.event for r in recorded])


# -- every event type, exactly --------------------------------------------------------------

RUN_INPUT = {
    "ticket": 4711,
    "opened": datetime(2024, 3, 31, 1, 30, tzinfo=ZoneInfo("Europe/Paris")),
    "tags": frozenset({"billing", "urgent"}),
    "budget": Decimal("12.50"),
    "trace": uuid.UUID("3f1b2c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d"),
    "ratios": (0.25, -0.0, float("inf")),
    "attachment": b"\x00\xffPDF",
    "huge": 2**80,
    "due": date(2024, 4, 2),
}


def one_of_each(instance_id: str, codec: ValueCodec) -> list[EventBase]:
    """One realistic event of every type, positions 1.., with JSON values from ``codec``."""
    # Timestamps in several zones: they must come back at the same instant and offset.
    zones = [UTC, timezone(timedelta(hours=5, minutes=30)), ZoneInfo("America/New_York")]
    moments = ((T0 + timedelta(minutes=i)).astimezone(zones[i % 3]) for i in itertools.count())
    log = LogBuilder(instance_id, clock=lambda: next(moments), codec=codec)
    boom = ErrorInfo.of(RuntimeError("boom"))
    log.start_run(
        RUN_INPUT,
        workflow_name="triage",
        kwargs={"budget": Decimal("12.50"), "mode": "fast"},
        owner="host-a:4242",
        durability="write",
        run_id="run-1",
    )
    log.start_superstep(superstep_id="ss-1")
    log.invoke("classify")
    model = log.record_step(
        "model",
        {"label": "billing", "p": (0.93, float("inf"))},
        digest="ab" * 32,
        duration=0.25,
        usage={"input_tokens": 120, "output_tokens": 7},
    )
    log.record_step("model", reused=model.position)
    log.record_step("tool", key='["explicit","tool","cd"]', call=2, error=TimeoutError("slow"))
    log.write("category", ("billing", 0.93))
    log.delete("draft")
    log.send({1: "one", "$t": "x"}, target="route", targets=["route", "audit"])
    log.send("both", targets=["audit"], gathered={"audit": ["classify", "route"]})
    log.output({"answer": "refund", "score": float("nan")})
    log.custom_event("progress", {"done": 3, "of": 4})
    log.request({"question": "refund?"}, request_id="req-1", response_type="bool")
    log.complete()
    log.fail("audit", boom)
    log.commit()
    log.abort("failed", error=boom, superstep="ss-1")  # a second marker
    log.fail_run(boom, executor_id="audit", superstep_id="ss-1")
    log.cancel_run(superstep_id=None, run="run-1")  # more ends of the same run
    log.abandon_run("crashed", closed_by="run-2", superstep_id=None, run="run-1")
    log.complete_run(run="run-1")
    log.await_input(["req-1"], run="run-1")
    log.start_run(workflow_name="triage", run_id="run-3", continues="run-1", checkpoint="ss-1")
    log.respond("req-1", True)
    log.subworkflow_started("parent", "p-run", "p-ss", "sub")
    log.start_superstep(superstep_id="ss-3")
    log.invoke("sub")
    log.subworkflow_ran("parent/sub/1", "c-run", requests=["req-9"], continues="parent/sub/0")
    log.forked_from(
        "origin",
        {"category": ["billing", 0.93]},
        origin_position=9,
        checkpoint="x",
        origin_run="run-0",
        requests=[{"request_id": "req-0", "executor_id": "classify", "data": {"q": [1]}}],
    )
    return log.events()


def test_the_sample_covers_every_event_type() -> None:
    assert {e.type for e in one_of_each("a", ValueCodec())} == set(EVENT_TYPES)  # type: ignore[attr-defined]


def test_every_event_type_round_trips_exactly(store: EventStore) -> None:
    events = one_of_each("wf-1", ValueCodec())
    store.append("wf-1", events, expected_version=0)
    read = store.read("wf-1")
    assert read == events
    assert [type(e) for e in read] == [type(e) for e in events]
    assert [e.timestamp.utcoffset() for e in read] == [e.timestamp.utcoffset() for e in events]
    assert [r.event for r in store.read_all()] == events


def test_values_decode_to_the_original_python_objects(store: EventStore) -> None:
    store.append("wf-1", one_of_each("wf-1", ValueCodec()), expected_version=0)
    started = store.read("wf-1", upto=1)[0]
    assert isinstance(started, RunStarted)
    decoded = ValueCodec().decode(started.input)
    assert decoded == RUN_INPUT
    assert [type(v) for v in decoded.values()] == [type(v) for v in RUN_INPUT.values()]
    assert decoded["opened"].tzinfo == ZoneInfo("Europe/Paris")


# -- appending --------------------------------------------------------------------------------


def test_append_returns_the_global_positions(store: EventStore) -> None:
    first = store.append("a", stream("a", 2), expected_version=0)
    second = store.append("b", stream("b", 1), expected_version=0)
    assert [r.global_position for r in store.read_all()] == first + second
    assert first[0] < first[1] < second[0]


def test_an_empty_batch_writes_nothing(store: EventStore) -> None:
    assert store.append("a", [], expected_version=0) == []
    assert snapshot(store) == ([], 0, [], 0, [])


@pytest.mark.parametrize(
    ("expected_version", "count"),
    [(0, 1), (1, 1), (1, 3), (5, 1)],
    ids=["new-stream-exists", "stale", "stale-batch-past-the-end", "ahead-of-stream"],
)
def test_expected_version_conflict_writes_nothing(
    store: EventStore, expected_version: int, count: int
) -> None:
    store.append("a", stream("a", 2), expected_version=0)
    before = snapshot(store)
    with pytest.raises(ConcurrencyConflictError) as caught:
        store.append(
            "a", stream("a", count, start=expected_version + 1), expected_version=expected_version
        )
    error = caught.value
    assert (error.instance_id, error.expected_version, error.actual_version) == (
        "a",
        expected_version,
        2,
    )
    assert "'a'" in str(error)
    assert f"version 2, not at the expected version {expected_version}" in str(error)
    assert snapshot(store) == before


def test_a_batch_whose_later_event_conflicts_writes_nothing(store: EventStore) -> None:
    plant(store, staged("a", 3, key="planted"))
    before = snapshot(store)
    with pytest.raises(ConcurrencyConflictError):
        store.append("a", stream("a", 4), expected_version=0)
    assert snapshot(store) == before


def test_racing_writers_one_wins_the_other_conflicts(store: EventStore) -> None:
    barrier = threading.Barrier(2)
    outcomes: queue.Queue[str] = queue.Queue()

    def write(key: str) -> None:
        barrier.wait(timeout=WAIT)
        try:
            store.append("a", [staged("a", 1, key=key)], expected_version=0)
            outcomes.put(key)
        except ConcurrencyConflictError:
            outcomes.put("conflict")

    threads = [threading.Thread(target=write, args=(k,)) for k in ("left", "right")]
    for t in threads:
        t.start()
    conflict, winner = sorted(outcomes.get(timeout=WAIT) for _ in threads)
    for t in threads:
        t.join(timeout=WAIT)
    assert conflict == "conflict"
    assert [e.key for e in store.read("a")] == [winner]  # type: ignore[attr-defined]


BAD_BATCHES = {
    "other-instance": (1, [staged("a", 2), staged("b", 3)]),
    "gap": (1, [staged("a", 2), staged("a", 4)]),
    "wrong-start": (1, [staged("a", 3)]),
    "repeated-position": (1, [staged("a", 2), staged("a", 2)]),
    "negative-expected-version": (-1, [staged("a", 1)]),
}


@pytest.mark.parametrize("case", BAD_BATCHES, ids=list(BAD_BATCHES))
def test_a_bad_batch_is_refused_and_writes_nothing(store: EventStore, case: str) -> None:
    store.append("a", stream("a", 1), expected_version=0)
    before = snapshot(store)
    expected_version, batch = BAD_BATCHES[case]
    with pytest.raises(InvalidBatchError) as caught:
        store.append("a", batch, expected_version=expected_version)
    assert not isinstance(caught.value, StoreConfigError)  # the batch is wrong, not the store
    assert snapshot(store) == before


# -- reading one stream -----------------------------------------------------------------------


def test_read_windows_by_after_upto_and_limit(store: EventStore) -> None:
    store.append("a", stream("a", 5), expected_version=0)
    store.append("b", stream("b", 2), expected_version=0)
    windows: list[dict[str, int]] = [
        {}, {"after": 2}, {"upto": 3}, {"limit": 2}, {"after": 1, "upto": 4, "limit": 2},
        {"after": 5}, {"after": 3, "upto": 3},
    ]  # fmt: skip
    got = [[e.position for e in store.read("a", **w)] for w in windows]
    assert got == [[1, 2, 3, 4, 5], [3, 4, 5], [1, 2, 3], [1, 2], [2, 3], [], []]
    assert {e.instance_id for e in store.read("a")} == {"a"}


def test_reads_filtered_by_type_equal_filtering_a_full_read(store: EventStore) -> None:
    events = one_of_each("a", store.codec)
    store.append("a", events, expected_version=0)
    store.append("b", one_of_each("b", store.codec), expected_version=0)
    wanted = {"state_staged", "superstep_committed", "run_failed"}

    def kept(found: list[EventBase]) -> list[EventBase]:
        return [e for e in found if e.type in wanted]  # type: ignore[attr-defined]

    assert store.read("a", types=wanted) == kept(events)
    assert store.read("a", after=4, upto=11, types=wanted) == kept(events[4:11])
    assert [r.event for r in store.read_all(types=wanted)] == kept(store.read("a")) + kept(
        store.read("b")
    )
    assert [r.event for r in store.iter_all(page_size=2, types=wanted)] == [
        r.event for r in store.read_all(types=wanted)
    ]


def test_an_unknown_event_type_in_a_filter_is_refused(store: EventStore) -> None:
    with pytest.raises(StoreConfigError, match="unknown event type 'state_stagged'"):
        store.read_all(types={"state_stagged"})
    with pytest.raises(StoreConfigError, match="unknown event type"):
        store.read("a", types={"nope"})


def test_an_unknown_stream_is_empty_at_version_zero(store: EventStore) -> None:
    store.append("a", stream("a", 1), expected_version=0)
    assert store.read("nope") == []
    assert store.version("nope") == 0


def test_version_is_the_last_position(store: EventStore) -> None:
    store.append("a", stream("a", 2), expected_version=0)
    store.append("a", stream("a", 3, start=3), expected_version=2)
    store.append("b", stream("b", 1), expected_version=0)
    assert (store.version("a"), store.version("b")) == (5, 1)


# -- the global log ---------------------------------------------------------------------------


def interleave(store: EventStore) -> list[int]:
    """Append to three streams in turns; return the global positions in append order."""
    ids = store.append("a", stream("a", 1), expected_version=0)
    ids += store.append("b", stream("b", 1), expected_version=0)
    ids += store.append("a", stream("a", 1, start=2), expected_version=1)
    ids += store.append("c", stream("c", 2), expected_version=0)
    ids += store.append("b", stream("b", 1, start=2), expected_version=1)
    return ids


ORDER = [("a", 1), ("b", 1), ("a", 2), ("c", 1), ("c", 2), ("b", 2)]


def test_read_all_is_in_append_order_across_streams(store: EventStore) -> None:
    ids = interleave(store)
    everything = store.read_all()
    assert where(everything) == ORDER
    assert [r.global_position for r in everything] == ids
    assert ids == sorted(set(ids))


def test_read_all_pages_with_after_and_limit(store: EventStore) -> None:
    ids = interleave(store)
    pages, after = [], 0
    while page := store.read_all(after=after, limit=4):
        pages.append(where(page))
        after = page[-1].global_position
    assert pages == [ORDER[:4], ORDER[4:]]
    assert where(store.read_all(after=ids[1], limit=2)) == ORDER[2:4]
    assert where(store.read_all(upto=ids[2])) == ORDER[:3]
    assert store.read_all(after=ids[-1]) == []


def test_read_all_refuses_a_limit_below_one(store: EventStore) -> None:
    with pytest.raises(StoreConfigError, match="limit"):
        store.read_all(limit=0)


def test_iter_all_reads_every_page(store: EventStore) -> None:
    ids = interleave(store)
    assert list(store.iter_all(page_size=2)) == store.read_all()
    assert where(list(store.iter_all(after=ids[1], page_size=3))) == ORDER[2:]
    assert list(store.iter_all(after=ids[-1])) == []


def test_last_position_is_the_newest_global_position(store: EventStore) -> None:
    assert store.last_position() == 0
    ids = interleave(store)
    assert store.last_position() == ids[-1]


def test_instances_lists_every_stream_once_sorted(store: EventStore) -> None:
    assert store.instances() == []
    for name in ("wf-c", "wf-a", "wf-b"):
        store.append(name, stream(name, 2), expected_version=0)
    assert store.instances() == ["wf-a", "wf-b", "wf-c"]


# -- following --------------------------------------------------------------------------------


def start_follower(
    store: EventStore, stop: threading.Event, **options: Any
) -> tuple[threading.Thread, queue.Queue[Recorded]]:
    received: queue.Queue[Recorded] = queue.Queue()

    def run() -> None:
        for recorded in store.follow(stop=stop, poll_interval=0.02, **options):
            received.put(recorded)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, received


def test_follow_yields_existing_then_new_events_until_stopped(store: EventStore) -> None:
    store.append("a", stream("a", 2), expected_version=0)
    stop = threading.Event()
    follower, received = start_follower(store, stop)
    existing = [received.get(timeout=WAIT) for _ in range(2)]
    writer = threading.Thread(target=store.append, args=("b", stream("b", 2)),
                              kwargs={"expected_version": 0})  # fmt: skip
    writer.start()
    writer.join(timeout=WAIT)
    new = [received.get(timeout=WAIT) for _ in range(2)]
    stop.set()
    follower.join(timeout=WAIT)
    assert not follower.is_alive()
    assert existing + new == store.read_all()
    assert received.empty()


def test_follow_starts_after_the_given_position(store: EventStore) -> None:
    ids = interleave(store)
    stop = threading.Event()
    follower, received = start_follower(store, stop, after=ids[3])
    got = [received.get(timeout=WAIT) for _ in range(2)]
    stop.set()
    follower.join(timeout=WAIT)
    assert where(got) == ORDER[4:]


def test_follow_stops_between_events_when_stop_is_set(store: EventStore) -> None:
    store.append("a", stream("a", 3), expected_version=0)
    stop = threading.Event()
    seen = []
    for recorded in store.follow(stop=stop):
        seen.append(recorded)
        stop.set()
    assert where(seen) == [("a", 1)]


def test_follow_yields_nothing_once_stopped(store: EventStore) -> None:
    store.append("a", stream("a", 1), expected_version=0)
    stop = threading.Event()
    stop.set()
    assert list(store.follow(stop=stop)) == []
