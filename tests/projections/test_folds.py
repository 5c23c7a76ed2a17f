"""The pure folds against the reference model, on random logs (no store involved)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from freezegun import freeze_time
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel import ProjectionError, system_clock
from projections import (
    AtPosition,
    AtSuperstep,
    AtTime,
    Change,
    CommittedState,
    InsideSuperstep,
    bisect,
    diff,
    diff_points,
    fold_blame,
    fold_committed,
    fold_history,
    state_at,
)
from tests.projections.logs import build_events, flatten, plans, ticking_clock
from tests.projections.reference import Reference

logs = plans().map(lambda plan: flatten(build_events("inst", plan, ticking_clock())))


@given(logs)
def test_committed_state_at_every_prefix_matches_the_reference(events):
    ref = Reference(events)
    view = CommittedState()
    for event in events:
        view.apply(event)
        assert view.values == ref.state(event.position)
        assert state_at(events, AtPosition(event.position)).values == ref.state(event.position)


@given(logs)
def test_snapshot_round_trip_changes_no_answer(events):
    for cut in range(len(events) + 1):
        head = fold_committed(events[:cut])
        restored = CommittedState.from_snapshot(head.to_snapshot())
        rest = events[cut:]
        assert fold_committed(rest, restored).values == fold_committed(events).values
        assert state_at(rest, AtPosition(len(events)), start=restored).values == (
            Reference(events).state()
        )


RUN_FIELDS = (
    "run_id", "status", "started_at", "ended_at", "supersteps", "committed", "outputs", "error",
    "superstep_ids",
)  # fmt: skip
SUPERSTEP_FIELDS = ("superstep_id", "index", "status", "reason", "position", "executors", "keys")


def picked(records: Iterable[object], fields: tuple[str, ...]) -> list[dict[str, Any]]:
    """Each record as a dict of the named attributes, as the reference gives them (sequences as
    lists)."""
    return [{name: _listed(getattr(record, name)) for name in fields} for record in records]


def _listed(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


@given(logs)
def test_run_history_matches_the_reference(events):
    ref = Reference(events)
    history = fold_history(events)
    assert picked(history.runs(), RUN_FIELDS) == ref.runs()
    assert picked(history.supersteps(), SUPERSTEP_FIELDS) == ref.supersteps()


@given(logs)
def test_blame_matches_the_reference(events):
    ref = Reference(events)
    blame = fold_blame(events)
    got = {
        key: [(w.position, w.status, w.reason) for w in blame.writes(key)]
        for key in blame.written_keys()
    }
    assert got == ref.blame()
    state = ref.state()
    for key in blame.written_keys():
        current = blame.current(key)
        if key in state:
            assert current is not None
            assert current.op == "set"
            assert current.value == state[key]
        else:
            assert current is None or current.op == "delete"


@given(logs, st.data())
def test_time_travel_matches_the_reference(events, data):
    ref = Reference(events)
    markers = [e for e in events if e.type in ("superstep_committed", "superstep_aborted")]
    starts = [e for e in events if e.type == "superstep_started"]
    for start in starts:
        values, status = ref.inside(start.superstep_id)
        seen = state_at(events, InsideSuperstep(start.superstep_id))
        assert (seen.values, seen.status) == (values, status)
        assert seen.inside
        assert status in seen.label
        first = ref.first_marker.get(start.superstep_id)
        if first is None:
            with pytest.raises(ProjectionError):
                state_at(events, AtSuperstep(start.superstep_id))
        else:
            expected = ref.state(first.position)
            assert state_at(events, AtSuperstep(start.superstep_id)).values == expected
            by_index = AtSuperstep(run_id=start.run_id, index=start.index)
            assert state_at(events, by_index).values == expected
    assert len(markers) <= len(starts) + 1
    if events:
        offset = data.draw(st.integers(-2, len(events) + 2))
        when = events[0].timestamp + timedelta(seconds=offset, milliseconds=500)
        assert state_at(events, AtTime(when)).values == ref.state(ref.position_at_time(when))


@settings(max_examples=25, deadline=None)  # freezegun makes the first example slow
@given(plans())
def test_time_travel_by_wall_clock_under_freezegun(plan):
    with freeze_time("2025-03-01 12:00:00", tick=False) as frozen:

        def clock():
            frozen.tick(timedelta(seconds=10))
            return system_clock()

        events = flatten(build_events("inst", plan, clock))
        now = system_clock()
    ref = Reference(events)
    for minutes in range(0, int((now - events[0].timestamp).total_seconds() // 60) + 2):
        when = datetime(2025, 3, 1, 12, minutes // 60, minutes % 60, 5, tzinfo=UTC)
        got = state_at(events, AtTime(when))
        assert got.values == ref.state(ref.position_at_time(when))
        assert got.position == ref.position_at_time(when)


def test_unknown_superstep_and_naive_time_are_projection_errors():
    with pytest.raises(ProjectionError):
        state_at([], AtSuperstep("nope"))
    with pytest.raises(ProjectionError):
        state_at([], InsideSuperstep("nope"))
    with pytest.raises(ProjectionError):
        AtTime(datetime(2025, 1, 1))
    with pytest.raises(ProjectionError):
        AtSuperstep("s", run_id="r", index=1)


@given(logs, st.data())
def test_diff_between_two_points_matches_the_reference(events, data):
    ref = Reference(events)
    a = data.draw(st.integers(0, len(events)))
    b = data.draw(st.integers(0, len(events)))
    before, after = ref.state(a), ref.state(b)
    got = diff_points(events, AtPosition(a), AtPosition(b))
    assert got.added == {k: v for k, v in after.items() if k not in before}
    assert got.removed == {k: v for k, v in before.items() if k not in after}
    assert got.changed == {
        k: Change(before[k], after[k]) for k in before if k in after and before[k] != after[k]
    }
    assert bool(got) == (before != after)


def test_diff_of_plain_mappings():
    change = diff({"a": 1, "b": 2, "c": 3}, {"b": 2, "c": 4, "d": 5})
    assert change.added == {"d": 5}
    assert change.removed == {"a": 1}
    assert change.changed == {"c": Change(3, 4)}
    assert not diff({"a": 1}, {"a": 1})


predicates = {
    "plan failed": lambda s: s["plan"]["status"] == "failed",
    "a is set": lambda s: "a" in s,
    "b positive": lambda s: s["b"] > 0,
    "always": lambda s: True,
}


@given(logs, st.sampled_from(sorted(predicates)))
def test_bisect_matches_the_reference(events, name):
    predicate = predicates[name]
    expected = Reference(events).bisect(predicate)
    found = bisect(events, predicate, decode=False)
    if expected is None:
        assert found is None
    else:
        assert found is not None
        assert (found.superstep_id, found.position) == expected


@settings(max_examples=30)
@given(logs)
def test_folds_survive_json_round_trips(events):
    from projections import KeyBlame, RunHistory

    half = len(events) // 2
    history = RunHistory.from_json(fold_history(events[:half]).to_json())
    blame = KeyBlame.from_json(fold_blame(events[:half]).to_json())
    assert fold_history(events[half:], history) == fold_history(events)
    assert fold_blame(events[half:], blame) == fold_blame(events)


def test_a_run_closed_without_a_marker_leaves_its_writes_unmarked():
    from tests.projections.logs import RunPlan, StepPlan

    crash = StepPlan([("write", "e1", "a", "set", 1)], "crash", [], True)
    plan = [RunPlan([crash], mark_on_close=False), RunPlan([])]
    events = flatten(build_events("inst", plan, ticking_clock()))
    assert [w.status for w in fold_blame(events).writes("a")] == ["unmarked"]
    assert Reference(events).blame() == {"a": [(3, "unmarked", None)]}
    seen = state_at(events, InsideSuperstep("inst-s1"))
    assert (seen.status, seen.values) == ("unmarked", {"a": 1})
    assert fold_committed(events).values == {}


@given(logs, st.sampled_from(["a", "b", "plan"]))
def test_blame_of_one_key_equals_the_full_blame_filtered(events, key):
    full = fold_blame(events)
    one = fold_blame(events, keys={key})
    assert one.writes(key) == full.writes(key)
    assert one.current(key) == full.current(key)
    assert one.written_keys() == ([key] if full.writes(key) else [])


@settings(max_examples=30)
@given(logs)
def test_history_records_are_built_on_demand_and_changing_them_changes_nothing(events):
    history = fold_history(events)
    for run in history.runs():
        run.outputs.append("tampered")
        run.superstep_ids.clear()
    for step in history.supersteps():
        step.keys += ("tampered",)
        step.status = "committed"
    assert history == fold_history(events)


def test_a_restricted_blame_cannot_be_folded_on_for_other_keys():
    events = flatten(build_events("inst", [], ticking_clock()))
    with pytest.raises(ProjectionError):
        fold_blame(events, fold_blame(events, keys={"a"}), keys={"b"})
