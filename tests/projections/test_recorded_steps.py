"""Recorded steps in the projections (issue 23): each step beside its superstep's verdict, a served
call beside the record it reused, the redaction rule (by the step's name), and that a step's
result is provenance, never state: blame and time travel answer exactly what they answer for the
same log without its step records."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kernel import (
    EventBase,
    EventStore,
    LogIntegrityError,
    StepRecorded,
    SuperstepAborted,
    counter_ids,
    fold_committed,
)
from kernel.testing import ticking_clock
from projections import (
    REDACTED,
    AtPosition,
    AtSuperstep,
    InsideSuperstep,
    Projector,
    RecordedStep,
    SensitiveKeys,
    TimeTravel,
    blame_keys,
    fold_blame,
    fold_history,
    recorded_steps,
    state_at,
)
from tests.projections.stepping import MAIL, write_mail


@pytest.fixture
def mailed(store: EventStore) -> tuple[EventStore, str, str]:
    first, second = asyncio.run(
        write_mail(store, clock=ticking_clock(), id_factory=counter_ids("m"))
    )
    return store, first, second


def _steps(events: list[EventBase]) -> list[RecordedStep]:
    past = fold_history(events)
    supersteps = {s.superstep_id: s for s in past.supersteps()}
    return recorded_steps([e for e in events if isinstance(e, StepRecorded)], supersteps)


def test_each_step_carries_its_supersteps_verdict_and_a_served_call_its_origin(mailed) -> None:
    store, first, second = mailed
    steps = _steps(store.read(MAIL))
    shown = [
        (s.record.run_id, s.record.name, s.index, s.verdict, s.reason, s.served, s.origin_run)
        for s in steps
    ]
    assert shown == [
        (first, "call_model", 1, "aborted", "cancelled", False, None),
        (first, "check_spam", 1, "aborted", "cancelled", False, None),
        (second, "call_model", 1, "committed", None, True, first),
        (second, "check_spam", 1, "committed", None, False, None),
        (second, "send_email", 1, "committed", None, False, None),
    ]
    model, spam, served, _, sent = steps
    assert model.record.usage == {"input_tokens": 3, "output_tokens": 6}
    assert served.record.result is None  # the served call's own record holds no result ...
    assert (
        served.result
        == model.result
        == {  # ... it shows the one it was served
            "prompt": "write to Ann",
            "response": "Dear Ann,\nthank you. (write to Ann)",
        }
    )
    assert served.to_row()["reused"] == {"position": model.record.position, "run_id": first}
    assert spam.result is None
    assert spam.to_row()["error"] == {
        "type": "tests.projections.stepping.SpamCheckDown",
        "message": "the spam checker is down",
    }
    assert sent.result == "sent to ann@example.com"


def test_a_served_call_whose_position_holds_no_step_record_is_refused(mailed) -> None:
    """Its origin neither given nor among the records: the same refusal as a forged pointer's
    (``StepRecorded.origin_in``), never a served call shown without what it was served."""
    store, _, _ = mailed
    events = store.read(MAIL)
    served = next(e for e in events if isinstance(e, StepRecorded) and e.reused is not None)
    with pytest.raises(LogIntegrityError, match="holds no recorded result of that call") as error:
        recorded_steps([served], {})
    assert (error.value.position, error.value.kind) == (served.position, "reused")


def test_a_step_is_redacted_by_its_name_its_origin_too(mailed) -> None:
    store, _, _ = mailed
    steps = _steps(store.read(MAIL))
    rule = SensitiveKeys(["call_*"])
    shown = [rule.step(s) for s in steps]
    assert [s.result == dict(REDACTED) for s in shown] == [True, False, True, False, False]
    assert [s.record.name for s in shown] == [s.record.name for s in steps]
    assert shown[2].origin_run == steps[2].origin_run  # where it came from stays visible
    assert shown[0].record.usage == steps[0].record.usage
    events = [rule.event(e) for e in store.read(MAIL)]  # `log` redacts through the same rule
    recorded = [e for e in events if isinstance(e, StepRecorded) and e.name == "call_model"]
    assert [e.result for e in recorded] == [dict(REDACTED), None]  # a served one holds none
    assert SensitiveKeys().step(steps[0]) is steps[0]  # revealing redacts nothing


def _without_steps(events: list[EventBase]) -> list[EventBase]:
    return [e for e in events if not isinstance(e, StepRecorded)]


def test_a_step_recorded_in_an_aborted_superstep_never_shows_as_state(mailed) -> None:
    """Blame and time travel follow the markers: at every position, inside every superstep and
    after it, the state is the state of the same log without its step records, and no state
    value is the result of a step recorded in the aborted superstep; the views built from the
    store say the same."""
    store, _, second = mailed
    events = store.read(MAIL)
    steps = _steps(events)
    results = [s.result for s in steps if s.verdict == "aborted" and s.result is not None]
    assert results  # call_model's answer, recorded in the aborted superstep
    bare = _without_steps(events)
    aborted = next(e for e in events if isinstance(e, SuperstepAborted))
    points: list[Any] = [AtPosition(n) for n in range(len(events) + 1)]
    points += [InsideSuperstep(s.superstep_id) for s in fold_history(events).supersteps()]
    points += [AtSuperstep(aborted.superstep_id)]
    travel = TimeTravel(store, snapshots=False)
    for point in points:
        at = state_at(events, point)
        assert at.values == state_at(bare, point).values, point
        assert at.values == travel.state(MAIL, point).values, point
        assert not any(value in results for value in at.values.values()), point
    assert state_at(events, InsideSuperstep(aborted.superstep_id)).values == {}
    assert fold_committed(events).values == {"sent": "sent to ann@example.com"}
    blame = fold_blame(events)
    assert blame.written_keys() == fold_blame(bare).written_keys() == ["sent"]
    assert [(w.run_id, w.status) for w in blame.writes("sent")] == [(second, "committed")]
    projector = Projector(store)
    projector.catch_up()
    assert projector.state(MAIL) == {"sent": "sent to ann@example.com"}
    assert projector.blame(MAIL).written_keys() == ["sent"]
    assert blame_keys(store, MAIL, ["call_model"]).writes("call_model") == []
    with_snapshots = TimeTravel(store)
    for point in points:
        assert with_snapshots.state(MAIL, point).values == state_at(bare, point).values, point
