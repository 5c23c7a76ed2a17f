"""The history and blame views keep rows (one per run, superstep and write) on every backend:
a page rewrites only the rows its events touched, and one-key blame reads from a store."""

from __future__ import annotations

import uuid
from typing import Any

from hypothesis import strategies as st

from kernel import StateStaged, SuperstepStarted
from projections import (
    BlameView,
    MemoryViewBackend,
    Projector,
    blame_keys,
    fold_blame,
    fold_history,
)
from tests.projections.helpers import instance_plans, populate, run_property
from tests.projections.logs import KEYS, append_all, build_events, fixed_plans, ticking_clock


def test_history_and_blame_keep_one_row_per_run_superstep_and_write(store):
    logs = populate(store, fixed_plans())
    projector = Projector(store, ["history", "blame"], page_size=4)
    projector.catch_up()
    for instance_id, events in logs.items():
        history = projector.backend.documents(projector.views["history"].table, instance_id)
        runs = {f"r:{e.run_id}" for e in events if e.type == "run_started"}
        steps = {f"s:{e.superstep_id}" for e in events if isinstance(e, SuperstepStarted)}
        assert set(history) == {"t", "#"} | runs | steps  # "#": the instance's manifest
        blame = projector.backend.documents(projector.views["blame"].table, instance_id)
        writes = {BlameView.write_key(e.position) for e in events if isinstance(e, StateStaged)}
        assert set(blame) == {"t", "#"} | writes
        assert projector.history(instance_id) == fold_history(events)
        assert projector.blame(instance_id) == fold_blame(events)


class CountingBackend(MemoryViewBackend):
    """Counts the rows written per table."""

    def __init__(self) -> None:
        super().__init__()
        self.puts: dict[str, int] = {}

    def transaction(self) -> Any:
        outer = super().transaction()
        counts = self.puts

        class Counting:
            def __enter__(self) -> Any:
                tx = outer.__enter__()
                put = tx.put

                def counted(table: str, instance_id: str, key: str, doc: Any) -> None:
                    counts[table] = counts.get(table, 0) + 1
                    put(table, instance_id, key, doc)

                tx.put = counted  # type: ignore[method-assign]
                return tx

            def __exit__(self, *exc: Any) -> Any:
                return outer.__exit__(*exc)

        return Counting()


def test_a_page_rewrites_only_the_rows_it_touched():
    from kernel import open_store

    store = open_store("memory://")
    backend = CountingBackend()
    projector = Projector(store, ["history", "blame"], backend=backend)
    # One long run: each page adds one superstep of three events (started, a write, commit).
    from tests.projections.logs import RunPlan, StepPlan

    step = StepPlan([("write", "e1", "a", "set", 1)], "commit", [], True)
    batches = build_events("long", [RunPlan([step] * 30)], ticking_clock())
    events = [e for batch in batches for e in batch]
    head, tail = events[:4], events[4:]
    store.append("long", head, expected_version=0)
    projector.catch_up()
    for n in range(0, len(tail), 3):
        backend.puts.clear()
        store.append("long", tail[n : n + 3], expected_version=4 + n)
        projector.catch_up()
        history = backend.puts.get(projector.views["history"].table, 0)
        blame = backend.puts.get(projector.views["blame"].table, 0)
        assert history <= 4, history  # the run, the superstep, the tracker, the manifest
        assert blame <= 4, blame  # the new write, the one it superseded, the tracker, manifest
    assert projector.history("long") == fold_history(events)
    assert projector.blame("long") == fold_blame(events)


def test_blame_keys_equals_the_full_blame_of_those_keys(store):
    def check(plans_):
        logs = populate(store, plans_)
        for instance_id, events in logs.items():
            full = fold_blame(events)
            for key in KEYS:
                one = blame_keys(store, instance_id, [key], page_size=3)
                assert one.writes(key) == full.writes(key)
                assert one.current(key) == full.current(key)

    run_property(store, instance_plans, check)


def test_views_of_interleaved_instances_match_the_folds(store):
    def check(data):
        plans_, page_size = data
        tag = uuid.uuid4().hex[:8]  # fresh per example: id() of a freed object is reused
        batches = {
            f"i{n}-{tag}": build_events(f"i{n}-{tag}", plan, ticking_clock())
            for n, plan in enumerate(plans_)
        }
        append_all(store, batches)
        projector = Projector(store, ["history", "blame"], page_size=page_size)
        projector.catch_up()
        for instance_id in batches:
            events = store.read(instance_id)
            assert projector.history(instance_id) == fold_history(events)
            assert projector.blame(instance_id) == fold_blame(events)
        assert projector.verify("history").ok
        assert projector.verify("blame").ok

    run_property(store, st.tuples(instance_plans, st.integers(1, 5)), check)
