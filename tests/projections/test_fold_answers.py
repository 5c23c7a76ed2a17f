"""The answers the folds give on their fast paths agree with what the folds then hold, on any log.

A rebuild folds every event once, so the folds answer while they fold: ``CommittedState``'s
``apply_write`` (does the write count if its superstep commits?) and ``apply_marker`` (what did the
marker decide?), ``SuperstepTracker.verdict`` (the kind of an event's outcome, the rest built when
read), and ``RunHistory.state`` (the committed-state fold the history's verdicts came from). Each
must say exactly what the slower questions say: ``apply`` then ``is_pending``/``staged``, ``track``,
``fold_committed``. The logs are drawn from the damaged-log alphabet of ``test_verdicts`` (late
writes, second markers, markers after a run's end) and from the kernel's own rules.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kernel import (
    RUN_END_TYPES,
    CommittedState,
    EventBase,
    StateStaged,
    SuperstepAborted,
    SuperstepCommitted,
    fold_committed,
)
from projections import fold_history
from projections._folds._tracker import SuperstepTracker
from tests.projections.helpers import raw_events
from tests.projections.logs import build_events, flatten, plans, ticking_clock
from tests.projections.test_verdicts import actions

damaged = st.lists(actions, min_size=1, max_size=24).map(lambda plan: raw_events("inst", plan))
ruled = plans().map(lambda plan: flatten(build_events("inst", plan, ticking_clock())))
any_log = st.one_of(damaged, ruled)


def same_view(a: CommittedState, b: CommittedState) -> bool:
    return (a.values, a.position, a.last_committed) == (b.values, b.position, b.last_committed)


@settings(max_examples=150, deadline=None)
@given(any_log)
def test_apply_write_and_apply_marker_answer_what_the_fold_then_holds(events: list[EventBase]):
    fast, plain = CommittedState(), CommittedState()
    ended: set[str] = set()
    marked: set[str] = set()  # supersteps whose first marker came while their run was live
    for event in events:
        if isinstance(event, StateStaged):
            counts = fast.apply_write(event)
            assert counts == fast.is_pending(event)
            assert counts == any(w is event for w in fast.staged(event.superstep_id))
        elif isinstance(event, SuperstepCommitted | SuperstepAborted):
            staged = fast.staged(event.superstep_id)
            decided = fast.apply_marker(event)
            effective = event.run_id not in ended and event.superstep_id not in marked
            assert (decided is not None) == effective, event
            if decided is not None:
                marked.add(event.superstep_id)
                assert tuple(decided) == staged
                assert fast.staged(event.superstep_id) == ()
        else:
            fast.apply(event)
            if event.type in RUN_END_TYPES:
                ended.add(event.run_id)
        plain.apply(event)
        assert same_view(fast, plain), event


@settings(max_examples=150, deadline=None)
@given(any_log)
def test_verdict_is_the_kind_of_the_outcome_track_reports(events: list[EventBase]):
    quick, full = SuperstepTracker(), SuperstepTracker()
    state = CommittedState()  # what each superstep staged before its marker
    for event in events:
        before = state.staged(event.superstep_id) if hasattr(event, "superstep_id") else ()
        state.apply(event)
        kind = quick.verdict(event)
        outcome = full.track(event)
        assert kind == outcome.kind, event
        assert quick.outcome == outcome == full.outcome, event
        if isinstance(event, StateStaged):
            assert kind == ("staged" if state.is_pending(event) else "late"), event
            assert outcome.writes == (event,)
        elif kind in ("staged", "late"):
            assert outcome.writes == ()  # a request
        if kind in ("committed", "aborted"):
            assert outcome.writes == before
            assert quick.decided_requests == outcome.requests
        else:
            assert quick.decided_requests == ()


@settings(max_examples=150, deadline=None)
@given(any_log)
def test_the_history_state_is_the_committed_state_at_every_prefix(events: list[EventBase]):
    history = fold_history([])
    for cut, event in enumerate(events, start=1):
        history.apply(event)
        assert same_view(history.state, fold_committed(events[:cut])), cut
