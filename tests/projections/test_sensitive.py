"""Sensitive state keys (issue 11): the rule (declared by any run of an instance or of the one it
was forked from, or added by the reader), and redacted copies of every projection's answer, with
the folds and the materialized views left holding the real values.

``write_secrets`` is the log the CLI tests read too: run 1 declares nothing, commits superstep 1
and fails in superstep 2; run 2, of a workflow that declares ``password`` and ``secret_*``
sensitive, continues it and deletes ``secret_token`` in its last superstep.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kernel import (
    DefinitionError,
    EventBase,
    EventStore,
    Executor,
    InstanceForked,
    ProjectionError,
    RunStarted,
    StateStaged,
    ValueCodec,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    counter_ids,
    fold_committed,
    handler,
    open_store,
)
from kernel.testing import ticking_clock
from projections import (
    REDACTED,
    AtPosition,
    AtSuperstep,
    Projector,
    SensitiveKeys,
    TimeTravel,
    blame_keys,
    declared_patterns,
    diff_points,
    fold_blame,
    is_redacted,
    sensitive_keys_of,
    state_at,
)

SECRET = "hunter2"
"""Every value of a sensitive key contains it; no redacted answer may."""
DECLARED = ["password", "secret_*"]
T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


class Vault(Executor):
    """Writes ``password``, ``secret_token`` and ``note`` in supersteps 1 to 3 (deleting
    ``secret_token`` in 3); fails in superstep ``fail_at``."""

    fail_at: int | None = None

    @handler
    async def step(self, n: int, ctx: WorkflowContext[int, int]) -> None:
        ctx.set_state("password", f"{SECRET}-{n}")
        if n == 3:
            ctx.delete_state("secret_token")
        else:
            ctx.set_state("secret_token", f"{SECRET}-token-{n}")
        ctx.set_state("note", f"note-{n}")
        if n == self.fail_at:
            raise ConnectionError(f"the vault was down at {n}")
        if n < 3:
            await ctx.send_message(n + 1)


def vault(
    store: EventStore,
    *,
    run: int,
    fail_at: int | None = None,
    sensitive: list[str] | None = None,
    instance_id: str = "vault",
) -> Workflow:
    executor = Vault("vault")
    executor.fail_at = fail_at
    return (
        WorkflowBuilder(
            start_executor=executor,
            store=store,
            instance_id=instance_id,
            sensitive_keys=sensitive or [],
            clock=ticking_clock(T0 + timedelta(hours=run)),
            id_factory=counter_ids(f"r{run}"),
        )
        .add_edge(executor, executor)
        .build()
    )


def write_secrets(store: EventStore) -> list[EventBase]:
    """The log described in the module docstring; returns the events of ``vault``."""
    with pytest.raises(ConnectionError):
        asyncio.run(vault(store, run=1, fail_at=2).run(1))
    later = vault(store, run=2, sensitive=DECLARED)
    asyncio.run(later.run(checkpoint_id=later.checkpoints()[-1].checkpoint_id))
    return store.read("vault")


def fork_secrets(store: EventStore, events: list[EventBase]) -> list[EventBase]:
    """``vault-fork``: forked from ``vault`` after run 1's committed superstep, never run."""
    first_commit = next(e for e in events if e.type == "superstep_committed")
    origin = vault(store, run=3)
    origin.fork(at=AtPosition(first_commit.position), instance_id="vault-fork")
    return store.read("vault-fork")


def no_secret_in(tree: Any) -> bool:
    return SECRET not in repr(tree)


@pytest.fixture
def memory() -> EventStore:
    return open_store("memory://")


# -- the rule --------------------------------------------------------------------------------


def test_a_key_is_sensitive_when_it_matches_a_pattern_exactly_or_as_a_case_sensitive_glob():
    rule = SensitiveKeys(["password", "secret_*", "card[0-9]", "pin?"])

    for key in ("password", "secret_", "secret_token", "card7", "pin1"):
        assert key in rule, key
    for key in ("Password", "password2", "SECRET_token", "my_secret_x", "card", "cardx", "pin"):
        assert key not in rule, key
    assert 7 not in rule
    assert not SensitiveKeys()
    assert "password" not in SensitiveKeys()
    assert SensitiveKeys(["a", "b", "a"]).adding(["b", "c"]).patterns == ("a", "b", "c")


@pytest.mark.parametrize("bad", ["", None, 3, b"password"])
def test_a_pattern_that_is_not_a_non_empty_string_is_refused_naming_it(bad):
    with pytest.raises(ProjectionError, match="non-empty string") as raised:
        SensitiveKeys([bad])
    assert repr(bad) in str(raised.value)
    with pytest.raises(DefinitionError, match="non-empty string"):
        WorkflowBuilder(sensitive_keys=[bad])
    with pytest.raises(DefinitionError, match="non-empty string"):
        WorkflowBuilder().with_sensitive_keys(bad)


def test_one_string_instead_of_a_list_of_patterns_is_refused():
    with pytest.raises(ProjectionError, match=r"use \['password'\]"):
        SensitiveKeys("password")
    with pytest.raises(DefinitionError, match=r"use \['password'\]"):
        WorkflowBuilder(sensitive_keys="password")
    with pytest.raises(DefinitionError, match="lone surrogate"):
        WorkflowBuilder().with_sensitive_keys("pass\ud800")


def test_every_run_records_the_workflows_patterns_a_continued_run_too(store_url):
    with open_store(store_url) as store:
        events = write_secrets(store)
    first, second = (e for e in events if isinstance(e, RunStarted))

    assert first.sensitive_keys == []
    assert second.continues == first.run_id
    assert second.sensitive_keys == DECLARED
    assert declared_patterns(events) == DECLARED
    built = (
        WorkflowBuilder(start_executor=Vault("v"), store=open_store("memory://"))
        .with_sensitive_keys("a", "b*")
        .with_sensitive_keys("a", "c")
        .build()
    )
    assert built.sensitive_keys == ("a", "b*", "c")


def test_the_runs_of_a_fork_record_the_patterns_of_the_workflow_that_runs_it(memory):
    events = write_secrets(memory)
    fork_secrets(memory, events)

    asyncio.run(vault(memory, run=4, sensitive=["note"], instance_id="vault-fork").run(3))

    started = [e for e in memory.read("vault-fork") if isinstance(e, RunStarted)]
    assert [e.sensitive_keys for e in started] == [["note"]]


def test_the_rule_of_an_instance_is_every_pattern_of_its_runs_and_of_its_origin(memory):
    events = write_secrets(memory)
    fork = fork_secrets(memory, events)

    assert sensitive_keys_of(memory, "vault").patterns == tuple(DECLARED)
    assert sensitive_keys_of(memory, "vault", events=events).patterns == tuple(DECLARED)
    # the fork never ran: its values came from the origin, so the origin's patterns hide them
    assert sensitive_keys_of(memory, "vault-fork").patterns == tuple(DECLARED)
    assert sensitive_keys_of(memory, "vault-fork", events=fork).patterns == tuple(DECLARED)
    assert sensitive_keys_of(memory, "vault", extra=["note"]).patterns == (*DECLARED, "note")
    with pytest.raises(ProjectionError, match="non-empty string"):
        sensitive_keys_of(memory, "vault", extra=[""])


# -- redacted answers ------------------------------------------------------------------------


def test_state_is_redacted_for_sensitive_keys_only_and_the_fold_keeps_real_values(memory):
    events = write_secrets(memory)
    rule = sensitive_keys_of(memory, "vault", events=events)

    real = state_at(events, AtPosition(events[-1].position))
    shown = rule.state(real)

    assert shown.values == {"password": REDACTED, "note": "note-3"}
    assert is_redacted(shown.values["password"])
    assert not is_redacted(shown.values["note"])
    assert (shown.position, shown.label) == (real.position, real.label)
    assert real.values["password"] == f"{SECRET}-3"
    assert fold_committed(events).values["password"] == f"{SECRET}-3"
    assert SensitiveKeys().state(real) is real


def test_a_key_declared_sensitive_by_a_later_run_hides_the_values_written_before(memory):
    events = write_secrets(memory)
    rule = sensitive_keys_of(memory, "vault", events=events)
    run_1 = next(e.run_id for e in events if isinstance(e, RunStarted))

    before = state_at(events, AtSuperstep(run_id=run_1, index=1))

    assert before.values["password"] == f"{SECRET}-1"  # written by run 1, which declared nothing
    assert rule.state(before).values == {
        "password": REDACTED,
        "secret_token": REDACTED,
        "note": "note-1",
    }
    writes = rule.blame(fold_blame(events)).writes("password")
    assert writes[0].run_id == run_1
    assert is_redacted(writes[0].value)


def test_a_diff_lists_a_sensitive_key_as_changed_without_either_value(memory):
    events = write_secrets(memory)
    rule = sensitive_keys_of(memory, "vault", events=events)
    first_commit = next(e for e in events if e.type == "superstep_committed")

    changes = rule.diff(
        diff_points(events, AtPosition(first_commit.position), AtPosition(events[-1].position))
    )

    assert set(changes.changed) == {"password", "note"}
    assert changes.changed["password"].old == REDACTED == changes.changed["password"].new
    assert (changes.changed["note"].old, changes.changed["note"].new) == ("note-1", "note-3")
    assert changes.removed == {"secret_token": REDACTED}
    added = rule.diff(diff_points(events, AtPosition(0), AtPosition(first_commit.position)))
    assert added.added == {"password": REDACTED, "secret_token": REDACTED, "note": "note-1"}
    assert no_secret_in(changes)
    assert no_secret_in(added)


def test_blame_lists_every_write_when_by_whom_and_its_verdict_but_no_value(memory):
    events = write_secrets(memory)
    rule = sensitive_keys_of(memory, "vault", events=events)
    real = fold_blame(events)

    shown = rule.blame(real)

    assert shown.written_keys() == real.written_keys()
    for key in ("password", "secret_token"):
        for mine, truth in zip(shown.writes(key), real.writes(key), strict=True):
            assert mine.model_dump(exclude={"value"}) == truth.model_dump(exclude={"value"})
            if truth.op == "delete":
                assert mine.value is None
            else:
                assert is_redacted(mine.value)
                assert SECRET in truth.value
    verdicts = [(w.status, w.reason) for w in shown.writes("password")]
    assert verdicts == [
        ("superseded", None),
        ("aborted", "failed"),
        ("superseded", None),
        ("committed", None),
    ]
    assert [w.op for w in shown.writes("secret_token")][-1] == "delete"
    assert shown.writes("note") == real.writes("note")
    assert no_secret_in([w.value for k in shown.written_keys() for w in shown.writes(k)])
    keyed = rule.blame(blame_keys(memory, "vault", ["password"]))
    assert [w.value for w in keyed.writes("password")] == [REDACTED] * 4
    assert keyed.only == frozenset({"password"})


def test_log_events_are_redacted_copies_and_the_read_events_are_untouched(memory):
    events = write_secrets(memory)
    rule = sensitive_keys_of(memory, "vault", events=events)

    shown = rule.events(events)

    assert [e.position for e in shown] == [e.position for e in events]
    for mine, truth in zip(shown, events, strict=True):
        if isinstance(truth, StateStaged) and truth.key in rule and truth.op == "set":
            assert isinstance(mine, StateStaged)
            assert is_redacted(mine.value)
            assert mine.model_dump(exclude={"value"}) == truth.model_dump(exclude={"value"})
            assert SECRET in truth.value
        else:
            assert mine is truth
    assert no_secret_in([e.model_dump() for e in shown])


def test_a_fork_shows_the_values_it_started_with_redacted(memory):
    events = write_secrets(memory)
    fork = fork_secrets(memory, events)
    rule = sensitive_keys_of(memory, "vault-fork", events=fork)
    assert isinstance(fork[0], InstanceForked)

    (event,) = rule.events(fork)
    state = rule.state(state_at(fork, AtPosition(fork[-1].position)))
    blame = rule.blame(fold_blame(fork))

    assert isinstance(event, InstanceForked)
    assert event.values == {"password": REDACTED, "secret_token": REDACTED, "note": "note-1"}
    assert fork[0].values["password"] == f"{SECRET}-1"
    assert state.values == event.values
    (write,) = blame.writes("password")
    assert is_redacted(write.value)
    assert write.origin_instance == "vault"


def test_materialized_views_keep_real_values_and_time_travel_is_redacted_on_read(store_url):
    with open_store(store_url) as store:
        events = write_secrets(store)
        projector = Projector(store, ["state", "blame", "snapshots"])
        projector.catch_up()
        rule = sensitive_keys_of(store, "vault")

        assert projector.state("vault")["password"] == f"{SECRET}-3"
        assert rule.values(projector.state("vault")) == {"password": REDACTED, "note": "note-3"}
        viewed = rule.blame(projector.blame("vault"))
        assert viewed == rule.blame(fold_blame(events))
        assert no_secret_in([w.value for w in viewed.writes("password")])
        at = TimeTravel(store).state("vault", AtPosition(events[-1].position))
        assert at.values["password"] == f"{SECRET}-3"
        assert rule.state(at).values["password"] == REDACTED


def test_the_marker_is_never_equal_to_a_stored_value():
    stored = ValueCodec().encode({"$t": "redacted"}, what="a value")

    assert stored != REDACTED
    assert not is_redacted(stored)
    assert not is_redacted("redacted")
    assert not is_redacted({"redacted": True})
    shown = SensitiveKeys(["k"]).values({"k": 1, "j": 2})
    shown["k"]["$t"] = "changed"  # each answer gets its own copy of the marker
    assert REDACTED == {"$t": "redacted"}
