"""Time travel from a store, with and without snapshots: snapshots never change an answer."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import strategies as st

from kernel import ProjectionError, open_store
from projections import (
    AtPosition,
    AtSuperstep,
    AtTime,
    InsideSuperstep,
    Projector,
    SnapshotView,
    TimeTravel,
    state_at,
)
from tests.projections.helpers import instance_plans, populate, run_property
from tests.projections.logs import fixed_plans
from tests.projections.reference import Reference


def points(events):
    yield AtPosition(0)
    for event in events:
        yield AtPosition(event.position)
        yield AtTime(event.timestamp + timedelta(milliseconds=500))
        if event.type == "superstep_started":
            yield InsideSuperstep(event.superstep_id)
            yield AtSuperstep(event.superstep_id)
            yield AtSuperstep(run_id=event.run_id, index=event.index)
    if events:
        yield AtTime(events[0].timestamp - timedelta(seconds=1))


def answer(travel, instance_id, point):
    try:
        got = travel.state(instance_id, point)
    except ProjectionError:
        return "no such superstep"
    return got.values, got.position, got.inside, got.status


def test_snapshots_never_change_an_answer(store):
    def check(data):
        plans_, every, page_size = data
        logs = populate(store, plans_)
        projector = Projector(store, ["snapshots"], snapshot_every=every)
        projector.catch_up()
        with_snapshots = TimeTravel(store, page_size=page_size)
        without = TimeTravel(store, snapshots=False, page_size=page_size)
        for instance_id, events in logs.items():
            ref = Reference(events)
            for point in points(events):
                expected = answer(without, instance_id, point)
                assert answer(with_snapshots, instance_id, point) == expected, point
                try:
                    pure = state_at(events, point)
                except ProjectionError:
                    assert expected == "no such superstep"
                else:
                    assert (pure.values, pure.position, pure.inside, pure.status) == expected
                if isinstance(point, AtPosition):
                    assert expected[0] == ref.state(point.position)
        projector.drop("snapshots")  # deleting every snapshot changes no answer
        for instance_id, events in logs.items():
            for point in points(events):
                assert answer(with_snapshots, instance_id, point) == answer(
                    without, instance_id, point
                )

    run_property(store, st.tuples(instance_plans, st.integers(1, 3), st.integers(1, 5)), check)


def test_time_travel_reads_a_snapshot_and_a_short_tail(store):
    logs = populate(store, fixed_plans(4))
    Projector(store, ["snapshots"], snapshot_every=1).catch_up()
    reads = []
    original = store.read

    def counting_read(instance_id, **kwargs):
        page = original(instance_id, **kwargs)
        reads.append(len(page))
        return page

    store.read = counting_read  # type: ignore[method-assign]
    travel = TimeTravel(store)
    for instance_id, events in logs.items():
        last = events[-1].position
        reads.clear()
        assert travel.state(instance_id, AtPosition(last)).values == Reference(events).state()
        assert sum(reads) < 10  # the tail since the last snapshot, not the whole stream
        step = next(e for e in reversed(events) if e.type == "superstep_committed")
        reads.clear()
        got = travel.state(instance_id, AtSuperstep(step.superstep_id))
        assert got.values == Reference(events).state(step.position)
        assert sum(reads) < 10


def test_unknown_superstep_is_a_projection_error(store):
    populate(store, fixed_plans())
    Projector(store, ["snapshots"]).catch_up()
    with pytest.raises(ProjectionError):
        TimeTravel(store).state("nobody", AtSuperstep("nope"))
    with pytest.raises(ProjectionError):
        TimeTravel(store).state("nobody", InsideSuperstep("nope"))


@pytest.mark.parametrize("every", [0, -1])
def test_a_snapshot_interval_below_one_is_a_projection_error(every):
    with pytest.raises(ProjectionError, match=f"got {every}"):
        SnapshotView(every)
    with pytest.raises(ProjectionError):
        Projector(open_store("memory://"), ["snapshots"], snapshot_every=every)
