"""The committed-state fold, over any interleaving of supersteps from any runs.

A generated history is a set of supersteps, each with its staged writes and one marker. The
events of different supersteps are shuffled together in any order that keeps each superstep's own
writes before its marker; some writes land after their superstep's marker (a late write from a
cancelled sibling). Whatever the order, an aborted superstep's writes never count and neither do
late writes; the committed state is the committed supersteps' writes applied in marker order.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kernel import (
    CommittedState,
    EventBase,
    StateStaged,
    SuperstepAborted,
    SuperstepCommitted,
    fold_committed,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
KEYS = ["a", "b", "c"]


@st.composite
def histories(draw: st.DrawFn) -> list[dict[str, Any]]:
    supersteps = []
    for number in range(draw(st.integers(1, 6))):
        writes = draw(
            st.lists(st.tuples(st.sampled_from(KEYS), st.booleans(), st.integers(0, 9)), max_size=4)
        )
        supersteps.append(
            {
                "run": f"run-{draw(st.integers(0, 2))}",
                "id": f"step-{number}",
                "writes": writes,  # (key, is_delete, value)
                "late": draw(
                    st.lists(st.tuples(st.sampled_from(KEYS), st.integers(10, 19)), max_size=2)
                ),
                "commit": draw(st.booleans()),
            }
        )
    return supersteps


@st.composite
def interleavings(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[EventBase]]:
    """A history, and its events in one arbitrary order that keeps each superstep's sequence."""
    history = draw(histories())
    queues = [_events_of(step) for step in history]
    ordered: list[tuple[str, dict[str, Any]]] = []
    while any(queues):
        queue = draw(st.sampled_from([q for q in queues if q]))
        ordered.append(queue.pop(0))
    events = [_make(kind, fields, position) for position, (kind, fields) in enumerate(ordered, 1)]
    return history, events


def _events_of(step: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    base = {"run_id": step["run"], "superstep_id": step["id"]}
    staged = [
        ("staged", {**base, "key": key, "op": "delete" if delete else "set", "value": value})
        for key, delete, value in step["writes"]
    ]
    marker = ("committed" if step["commit"] else "aborted", base)
    late = [("staged", {**base, "key": k, "op": "set", "value": v}) for k, v in step["late"]]
    return [*staged, marker, *late]


def _make(kind: str, fields: dict[str, Any], position: int) -> EventBase:
    common = {"instance_id": "i", "position": position, "timestamp": T0, **fields}
    if kind == "staged":
        return StateStaged(executor_id="x", **common)
    if kind == "committed":
        return SuperstepCommitted(**common)
    return SuperstepAborted(reason="failed", **common)


def reference(history: list[dict[str, Any]], events: list[EventBase]) -> dict[str, Any]:
    """Committed supersteps' own writes, applied in the order their markers appear."""
    by_id = {step["id"]: step for step in history}
    state: dict[str, Any] = {}
    for event in events:
        if isinstance(event, SuperstepCommitted):
            for key, delete, value in by_id[event.superstep_id]["writes"]:
                if delete:
                    state.pop(key, None)
                else:
                    state[key] = value
    return state


@settings(max_examples=300, deadline=None)
@given(interleavings())
def test_only_committed_supersteps_count_whatever_the_interleaving(case):
    history, events = case
    view = fold_committed(events)
    assert view.values == reference(history, events)
    late_values = {v for step in history for _, v in step["late"]}
    assert not late_values & set(view.values.values())


@settings(max_examples=100, deadline=None)
@given(interleavings(), st.data())
def test_folding_in_pieces_equals_folding_at_once(case, data):
    _, events = case
    cut = data.draw(st.integers(0, len(events)))
    first = fold_committed(events[:cut])
    branch = first.copy()
    assert fold_committed(events[cut:], first).values == fold_committed(events).values
    assert branch.values == fold_committed(events[:cut]).values


def test_a_commit_marker_after_an_abort_marker_does_not_revive_the_writes():
    events = [
        _make(
            "staged", {"run_id": "r", "superstep_id": "s", "key": "k", "op": "set", "value": 1}, 1
        ),
        _make("aborted", {"run_id": "r", "superstep_id": "s"}, 2),
        _make("committed", {"run_id": "r", "superstep_id": "s"}, 3),
    ]
    assert fold_committed(events).values == {}


def test_a_fresh_view_is_empty():
    assert CommittedState().values == {}
    assert CommittedState().position == 0
