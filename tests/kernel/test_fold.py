"""The committed-state fold, over any interleaving of supersteps from any runs.

A generated history is a set of supersteps, each with its staged writes and one marker. The
events of different supersteps are shuffled together in any order that keeps each superstep's own
writes before its marker; some writes land after their superstep's marker (a late write from a
cancelled sibling). Whatever the order, an aborted superstep's writes never count and neither do
late writes; the committed state is the committed supersteps' writes applied in marker order.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kernel import CommittedState, EventBase, SuperstepCommitted, fold_committed
from kernel.testing import LogBuilder

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
    queues = [_calls_of(step) for step in history]
    log = LogBuilder("i", clock=lambda: T0)
    while any(queues):
        queue = draw(st.sampled_from([q for q in queues if q]))
        queue.pop(0)(log)
    return history, log.events()


def _calls_of(step: dict[str, Any]) -> list[Callable[[LogBuilder], Any]]:
    """The builder calls that make one superstep's events: started, writes, marker, late writes."""
    sid = step["id"]

    def start(log: LogBuilder) -> None:
        log.start_superstep(superstep_id=sid, run=step["run"])

    def staged(key: str, delete: bool, value: int) -> Callable[[LogBuilder], Any]:
        if delete:
            return lambda log: log.delete(key, executor_id="x", superstep=sid)
        return lambda log: log.write(key, value, executor_id="x", superstep=sid)

    def marker(log: LogBuilder) -> None:
        if step["commit"]:
            log.commit(superstep=sid)
        else:
            log.abort("failed", superstep=sid)

    writes = [staged(key, delete, value) for key, delete, value in step["writes"]]
    late = [staged(key, False, value) for key, value in step["late"]]
    return [start, *writes, marker, *late]


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
    log = LogBuilder("i", clock=lambda: T0)
    log.start_run()
    step = log.start_superstep().superstep_id
    log.write("k", 1, executor_id="x")
    log.abort("failed")
    log.commit(superstep=step)
    assert fold_committed(log.events()).values == {}


def test_a_fresh_view_is_empty():
    assert CommittedState().values == {}
    assert CommittedState().position == 0
