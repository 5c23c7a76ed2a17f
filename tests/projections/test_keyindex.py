"""The key index says where a key's writes (and what their verdicts depend on) are; blame read
through it equals the full fold, on any log, with the index complete, behind, or missing.

The verdicts always come from ``KeyBlame`` (the kernel's fold): the first tests check that
folding only the subsequence the index names gives the full fold's answers, on disorderly logs
(late writes after a marker, two markers, writes after a run ended, crashes, forks, deletes,
interleaved runs). The rest check the view on every backend: catch-up in pages, a crash mid-page,
rebuild and verify, an index behind the log, reading that never creates the index, and that blame
through the index reads the key's events, not the log.
"""

from __future__ import annotations

import io
import sqlite3
import uuid
from contextlib import redirect_stdout
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kernel import EventBase, EventStore, StateStaged, open_store
from kernel.testing import LogBuilder, ticking_clock
from projections import (
    BLAME_TYPES,
    KeyIndexView,
    Projector,
    backend_for,
    blame_keys,
    fold_blame,
    key_index_position,
)
from projections._folds._keyindex import (
    CHUNK,
    KeyIndexFold,
    chunk_row,
    indexed_upto,
    one_by_one,
    relevant_positions,
    windows,
)
from projections.cli import main
from tests.projections.helpers import (
    START,
    Crash,
    CrashingView,
    instance_plans,
    populate,
    run_property,
)
from tests.projections.logs import (
    KEYS,
    RunPlan,
    StepPlan,
    append_all,
    build_events,
    fixed_plans,
    flatten,
)

RUNS = ("r1", "r2", "r3")
DISORDERLY_KEYS = ("a", "b")
ALL_KEYS = (*DISORDERLY_KEYS, "never")

step_ids = st.tuples(st.sampled_from(RUNS), st.integers(1, 2))
ops = st.sampled_from(("set", "set", "delete"))
actions = st.one_of(
    st.tuples(st.just("run"), st.sampled_from(RUNS)),
    st.tuples(st.just("start"), step_ids),
    st.tuples(st.just("write"), step_ids, st.sampled_from(DISORDERLY_KEYS), ops),
    st.tuples(st.just("write"), step_ids, st.sampled_from(DISORDERLY_KEYS), ops),
    st.tuples(st.just("write"), step_ids, st.sampled_from(DISORDERLY_KEYS), ops),
    st.tuples(st.just("commit"), step_ids),
    st.tuples(st.just("abort"), step_ids),
    st.tuples(st.just("end"), st.sampled_from(RUNS), st.sampled_from(["completed", "crashed"])),
    st.tuples(st.just("fork"), st.sampled_from(["", "a", "b", "ab"])),
    st.tuples(st.just("as"), st.sampled_from(RUNS)),
)
disorderly_plans = st.lists(actions, min_size=1, max_size=30)


def disorderly(instance_id: str, plan: list[tuple[Any, ...]]) -> list[EventBase]:
    """One event per step of ``plan``, in its order, whether or not the kernel would write it so
    (like ``helpers.raw_events``, with forks: ``("fork", keys)`` starts the instance over from
    values of those keys, wherever it stands). ``("as", run)`` relabels the event before it
    with another run: runs then write to, start and mark each other's supersteps, as no runner
    would."""
    log = LogBuilder(instance_id, clock=ticking_clock(START), validate=False)
    relabel: dict[int, str] = {}
    for action in plan:
        kind = action[0]
        if kind == "as":
            if log.version:
                relabel[log.version] = action[1]
        elif kind == "run":
            log.start_run(run_id=action[1], workflow_name="wf")
        elif kind == "end":
            if action[2] == "completed":
                log.complete_run(supersteps=0, run=action[1])
            else:
                log.abandon_run("crashed", superstep_id=None, run=action[1])
        elif kind == "fork":
            values = {key: f"forked-{log.version + 1}" for key in action[1]}
            log.forked_from("origin", values, origin_position=7, checkpoint="o-s1", origin_run="o")
        else:
            run_id, index = action[1]
            sid = f"{run_id}-s{index}"
            if kind == "start":
                log.start_superstep(superstep_id=sid, index=index, run=run_id)
            elif kind == "write" and action[3] == "set":
                value = {"written_at": log.version + 1}
                log.write(action[2], value, executor_id="e", superstep=sid, run=run_id)
            elif kind == "write":
                log.delete(action[2], executor_id="e", superstep=sid, run=run_id)
            elif kind == "commit":
                log.commit(superstep=sid, run=run_id)
            else:
                log.abort("failed", superstep=sid, run=run_id)
    return [
        e.model_copy(update={"run_id": relabel[e.position]}) if e.position in relabel else e
        for e in log.events()
    ]


def index_rows(events: list[EventBase], cuts: list[int]) -> dict[str, Any]:
    """The index rows of one instance folded page by page (a page ends before each position in
    ``cuts``), each page loading the rows the previous ones wrote: what a view table holds."""
    rows: dict[str, Any] = {}
    pages: list[list[EventBase]] = [[]]
    for event in events:
        if event.type not in KeyIndexFold.EVENT_TYPES:
            continue  # what catch-up reads: the view's types only
        if event.position in cuts and pages[-1]:
            pages.append([])
        pages[-1].append(event)
    for page in filter(None, pages):  # an instance with no event in a page is not touched
        fold = KeyIndexFold(rows.get)
        fold.apply_all(page)
        rows.update(fold.flush())
    return rows


def answers(blame: Any, key: str) -> tuple[Any, Any]:
    return blame.writes(key), blame.current(key)


# -- the fold gives the same answers on the subsequence the index names ---------------------------


MARKED_BY_AN_ENDED_RUN = [
    ("run", "r1"),
    ("end", "r2", "completed"),
    ("start", ("r1", 1)),
    ("write", ("r1", 1), "a", "set"),
    ("commit", ("r1", 1)),
    ("as", "r2"),  # the commit names run r2, which had ended: it is inert
]


@settings(max_examples=300, deadline=None)
@example(plan=MARKED_BY_AN_ENDED_RUN, cuts=[], upto=40)
@example(plan=MARKED_BY_AN_ENDED_RUN, cuts=[], upto=4)  # the commit in the tail
@example(  # a write in the tail after a marker the index holds: late
    plan=[("commit", ("r3", 1)), ("write", ("r3", 1), "a", "set")], cuts=[], upto=1
)
@given(
    plan=disorderly_plans,
    cuts=st.lists(st.integers(1, 40), max_size=4),
    upto=st.integers(0, 40),
)
def test_folding_what_the_index_names_gives_the_full_folds_answers(plan, cuts, upto):
    events = disorderly("inst", plan)
    full = fold_blame(events)
    indexed = [e for e in events if e.position <= upto and e.type in BLAME_TYPES]
    rows = index_rows(indexed, cuts)
    upto_found = indexed_upto(rows.get)
    if not indexed:
        assert upto_found is None
        return
    assert upto_found == indexed[-1].position
    for keys in [[key] for key in ALL_KEYS] + [list(DISORDERLY_KEYS)]:
        # what blame_keys folds after the index: the tail, without other keys' writes
        tail = [
            e
            for e in events
            if e.position > upto_found
            and e.type in BLAME_TYPES
            and (not isinstance(e, StateStaged) or e.key in keys)
        ]
        positions = relevant_positions(one_by_one(rows.get), keys, upto_found, tail)
        assert all(p <= upto_found for p in positions)
        exact = [e for e in events if e.position in positions]
        # what blame_keys reads: whole windows around those positions, of blame's types
        spans = windows(positions)
        read = [
            e
            for e in events
            if e.type in BLAME_TYPES and any(lo <= e.position <= hi for lo, hi in spans)
        ]
        for subsequence in (exact, read):
            one = fold_blame(subsequence + tail, keys=keys)
            for key in keys:
                assert answers(one, key) == answers(full, key), (key, subsequence)


@settings(max_examples=100, deadline=None)
@given(plan=disorderly_plans)
def test_the_index_names_every_write_of_the_key_and_nothing_of_other_keys(plan):
    events = disorderly("inst", plan)
    rows = index_rows(events, [])
    upto = max((e.position for e in events if e.type in BLAME_TYPES), default=0)
    for key in ALL_KEYS:
        named = set(relevant_positions(one_by_one(rows.get), [key], upto))
        writes = {e.position: e.key for e in events if isinstance(e, StateStaged)}
        assert {p for p, k in writes.items() if k == key} <= named
        assert all(writes[p] == key for p in named if p in writes)


def test_a_hot_key_is_sealed_in_chunks_that_pages_never_rewrite():
    log = LogBuilder("hot", clock=ticking_clock(START))
    log.start_run(run_id="r", workflow_name="wf")
    for n in range(CHUNK * 2 + 5):
        log.start_superstep()
        log.write("hot", n, executor_id="e")
        if n % 100 == 0:
            log.write("cold", n, executor_id="e")
        if n % 7 == 0:
            log.abort("failed")
        else:
            log.commit()
    log.complete_run()
    events = log.events()
    rows = index_rows(events, list(range(1, len(events), 37)))
    assert len(rows[chunk_row("hot", 0)]) == len(rows[chunk_row("hot", 1)]) == CHUNK
    assert chunk_row("hot", 2) not in rows
    assert rows["k:hot"]["n"] == CHUNK * 2 + 5
    assert len(rows["k:hot"]["tail"]) == 5
    assert rows == index_rows(events, [])  # the same rows, however the log was paged
    full = fold_blame(events)
    positions = relevant_positions(one_by_one(rows.get), ["cold"], events[-1].position)
    cold = [e for e in events if e.position in positions]
    assert answers(fold_blame(cold, keys=["cold"]), "cold") == answers(full, "cold")
    assert len(cold) < len(events) // 20


def test_positions_close_together_share_a_window():
    assert windows([]) == []
    assert windows([3, 5, 30, 31, 100], gap=16) == [(3, 5), (30, 31), (100, 100)]
    assert windows([1, 17, 34], gap=16) == [(1, 17), (34, 34)]


# -- the view on every backend -------------------------------------------------------------------


def keyindex(store: EventStore, *, page_size: int = 7, upto: int | None = None) -> Projector:
    projector = Projector(store, [KeyIndexView()], page_size=page_size)
    projector.catch_up(upto=upto)
    return projector


def assert_blame_matches(store: EventStore, logs: dict[str, list[EventBase]]) -> None:
    for instance_id, events in logs.items():
        full = fold_blame(events)
        for keys in [[key] for key in (*KEYS, "never")] + [list(KEYS)]:
            through_index = blame_keys(store, instance_id, keys, page_size=5)
            by_scan = blame_keys(store, instance_id, keys, page_size=5, index=False)
            for key in keys:
                assert answers(through_index, key) == answers(full, key), (instance_id, key)
                assert answers(by_scan, key) == answers(full, key), (instance_id, key)


def test_blame_through_the_index_equals_the_full_fold(store):
    """Instances appended in part, indexed up to a random global position, then appended to
    again: blame through the index, behind or not, equals the full fold at every stage."""

    def check(args: tuple[list[list[RunPlan]], int, float, float]) -> None:
        plans, page_size, split, fraction = args
        tag = uuid.uuid4().hex[:8]
        batches = {
            f"{tag}-{n}": build_events(f"{tag}-{n}", plan, ticking_clock())
            for n, plan in enumerate(plans)
        }
        first = {i: b[: round(len(b) * split)] for i, b in batches.items()}
        append_all(store, first)
        keyindex(store, page_size=page_size, upto=round(store.last_position() * fraction))
        assert_blame_matches(store, {i: flatten(b) for i, b in first.items()})
        for instance_id, instance_batches in batches.items():
            for batch in instance_batches[len(first[instance_id]) :]:
                store.append(instance_id, batch, expected_version=batch[0].position - 1)
        assert_blame_matches(store, {i: flatten(b) for i, b in batches.items()})

    strategy = st.tuples(instance_plans, st.integers(1, 20), st.floats(0, 1), st.floats(0, 1))
    run_property(store, strategy, check)


def test_an_index_behind_its_instance_folds_the_rest_from_the_log(store):
    step = StepPlan(
        [("write", "e1", "a", "set", 1), ("write", "e2", "b", "set", 2)], "commit", [], True
    )
    failed = StepPlan([("write", "e1", "a", "delete", None)], "failed", [], True)
    batches = build_events(
        "late", [RunPlan([step] * 3), RunPlan([failed]), RunPlan([step])], ticking_clock()
    )
    half = len(batches) // 2
    version = 0
    for batch in batches[:half]:
        store.append("late", batch, expected_version=version)
        version += len(batch)
    keyindex(store)
    before = key_index_position(store, "late")
    assert before is not None
    assert before <= version
    for batch in batches[half:]:
        store.append("late", batch, expected_version=version)
        version += len(batch)
    events = store.read("late")
    for key in ("a", "b"):
        assert answers(blame_keys(store, "late", [key]), key) == answers(fold_blame(events), key)
    keyindex(store)
    assert key_index_position(store, "late") == version


def test_the_index_survives_a_crash_mid_page_and_verifies(store):
    logs = populate(store, fixed_plans())
    crashing = Projector(store, [CrashingView(KeyIndexView(), after=5)], page_size=4)
    with pytest.raises(Crash):
        crashing.catch_up()
    projector = keyindex(store, page_size=4)
    assert projector.verify("keyindex").ok
    live = projector.backend.rows(projector.views["keyindex"].table)
    assert projector.rebuild("keyindex") > 0
    assert projector.backend.rows(projector.views["keyindex"].table) == live
    assert_blame_matches(store, logs)


def test_reading_never_creates_the_index(tmp_path):
    table = KeyIndexView().table
    url = f"sqlite:///{tmp_path / 'log.db'}"
    with open_store(url) as store:
        logs = populate(
            store, [[RunPlan([StepPlan([("write", "e1", "a", "set", 1)], "commit", [], True)])]]
        )
        (instance_id,) = logs
        assert answers(blame_keys(store, instance_id, ["a"]), "a") == answers(
            fold_blame(logs[instance_id]), "a"
        )
        assert key_index_position(store, instance_id) is None
    with sqlite3.connect(tmp_path / "log.db") as conn:
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master")}
    assert table not in tables
    assert not any(name.startswith("steplog_view") for name in tables)
    memory = open_store("memory://")
    populate(memory, [[RunPlan([])]])
    blame_keys(memory, "nobody", ["a"])
    assert not backend_for(memory).exists(table)


def test_an_instance_the_index_has_not_seen_is_read_from_the_log(store):
    keyindex(store)  # an index table that knows no instance yet
    logs = populate(
        store, [[RunPlan([StepPlan([("write", "e1", "a", "set", 1)], "commit", [], True)])]]
    )
    (instance_id,) = logs
    assert key_index_position(store, instance_id) is None
    assert_blame_matches(store, logs)


class CountingStore:
    """Counts the events a store's ``read`` and ``read_ranges`` return (what blame decodes)."""

    def __init__(self, store: EventStore) -> None:
        self._read = store.read
        self._read_ranges = store.read_ranges
        self.events = 0

    def read(self, *args: Any, **kwargs: Any) -> list[EventBase]:
        found = self._read(*args, **kwargs)
        self.events += len(found)
        return found

    def read_ranges(self, *args: Any, **kwargs: Any) -> list[EventBase]:
        found = self._read_ranges(*args, **kwargs)
        self.events += len(found)
        return found


def test_blame_through_the_index_reads_the_keys_events_not_the_log(store, monkeypatch):
    log = LogBuilder("long", clock=ticking_clock(START))
    log.start_run(run_id="r", workflow_name="wf")
    for n in range(300):
        log.start_superstep()
        log.write("busy", n, executor_id="e")
        if n in (10, 150, 290):
            log.write("rare", n, executor_id="e")
        log.commit()
    log.complete_run()
    log.append_to(store)
    keyindex(store, page_size=500)
    counting = CountingStore(store)
    monkeypatch.setattr(store, "read", counting.read)
    monkeypatch.setattr(store, "read_ranges", counting.read_ranges)
    indexed = blame_keys(store, "long", ["rare"])
    read_through_index = counting.events
    counting.events = 0
    scanned = blame_keys(store, "long", ["rare"], index=False)
    assert answers(indexed, "rare") == answers(scanned, "rare")
    assert [w.value for w in indexed.writes("rare")] == [10, 150, 290]
    assert read_through_index <= 3 * 6  # each write's superstep: started, two writes, commit
    assert counting.events > 900


def test_the_blame_command_prints_the_same_with_and_without_the_index(tmp_path):
    url = f"sqlite:///{tmp_path / 'log.db'}"

    def blame_output() -> str:
        out = io.StringIO()
        with redirect_stdout(out):
            assert main(["--store", url, "blame", instance_id, "a"]) == 0
        return out.getvalue()

    with open_store(url) as store:
        (instance_id,) = populate(store, [build_plans()])
    scanned = blame_output()
    with open_store(url) as store:
        keyindex(store)
        assert key_index_position(store, instance_id) is not None
    assert blame_output() == scanned
    assert "committed" in scanned
    assert "aborted" in scanned


def build_plans() -> list[RunPlan]:
    write = ("write", "e1", "a", "set", 1)
    return [
        RunPlan([StepPlan([write], "commit", [write], True)]),
        RunPlan([StepPlan([write], "failed", [], True)]),
        RunPlan([StepPlan([write], "commit", [], False)]),
    ]
