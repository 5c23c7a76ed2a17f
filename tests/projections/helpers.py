"""Helpers for the store-backed projection tests, and logs written step by step, rules or not."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel import (
    EventBase,
    EventStore,
)
from kernel.testing import LogBuilder
from projections import ViewSpec, ViewTx
from tests.projections.logs import RunPlan, append_all, build_events, flatten, plans, ticking_clock

EXAMPLES = {"memory": 12, "sqlite": 6, "postgresql": 3}


def examples_for(store: EventStore) -> int:
    return EXAMPLES[store.url.split(":", 1)[0]]


def run_property(
    store: EventStore, strategy: st.SearchStrategy[Any], test: Callable[..., None]
) -> None:
    """Run ``test`` on examples of ``strategy``, fewer on slower backends."""
    configured = settings(
        max_examples=examples_for(store),
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    configured(given(strategy)(test))()


instance_plans = st.lists(plans(max_runs=3), min_size=1, max_size=3)


def populate(store: EventStore, instance_plans: list[list[RunPlan]]) -> dict[str, list[EventBase]]:
    """Append one instance per plan (fresh ids), interleaved; return each instance's events."""
    tag = uuid.uuid4().hex[:8]
    batches = {
        f"{tag}-{n}": build_events(f"{tag}-{n}", plan, ticking_clock())
        for n, plan in enumerate(instance_plans)
    }
    append_all(store, batches)
    return {instance_id: flatten(b) for instance_id, b in batches.items()}


START = datetime(2025, 1, 1, tzinfo=UTC)


def raw_events(instance_id: str, plan: list[tuple[Any, ...]]) -> list[EventBase]:
    """One event per step of ``plan``, in its order, whether or not the kernel would write it so.

    Steps: ``("run", run)``, ``("start", (run, n))``, ``("write", (run, n), key, op)``,
    ``("commit", (run, n))``, ``("abort", (run, n))``, ``("end", run, "completed" | "crashed")``.
    Superstep ``(run, n)`` has id ``f"{run}-s{n}"``; event ``i`` (from 1) has position ``i`` and
    is stamped ``i`` seconds after 2025-01-01 UTC; every ``set`` writes ``{"written_at": i}``, a
    value no other write has. Built with ``kernel.testing.LogBuilder``, naming every run and
    superstep, so nothing defaults to what the runner would do.
    """
    log = LogBuilder(instance_id, clock=ticking_clock(START, step=1.0))
    for action in plan:
        kind = action[0]
        if kind == "run":
            log.start_run(run_id=action[1], workflow_name="wf")
            continue
        if kind == "end":
            run_id, how = action[1], action[2]
            if how == "completed":
                log.complete_run(supersteps=0, run=run_id)
            else:
                log.abandon_run("crashed", superstep_id=None, run=run_id)
            continue
        (run_id, index) = action[1]
        sid = f"{run_id}-s{index}"
        if kind == "start":
            log.start_superstep(superstep_id=sid, index=index, run=run_id)
        elif kind == "write":
            key, op = action[2], action[3]
            if op == "set":
                value = {"written_at": log.version + 1}
                log.write(key, value, executor_id="e", superstep=sid, run=run_id)
            else:
                log.delete(key, executor_id="e", superstep=sid, run=run_id)
        elif kind == "commit":
            log.commit(superstep=sid, run=run_id)
        else:
            log.abort("failed", superstep=sid, run=run_id)
    return log.events()


class Crash(Exception):
    """A simulated crash in the middle of a page."""


class CrashingView(ViewSpec):
    """Wraps a view and raises after folding ``after`` events (a crash mid-page)."""

    def __init__(self, inner: ViewSpec, after: int) -> None:
        self.inner = inner
        self.left = after
        self.name = inner.name  # type: ignore[misc]
        self.event_types = inner.event_types  # type: ignore[misc]

    def rows_read(self, instance_id: str, events: Sequence[EventBase]) -> Iterable[str]:
        return self.inner.rows_read(instance_id, events)

    def load(self, tx: ViewTx, table: str, instance_id: str) -> Any:
        return self.inner.load(tx, table, instance_id)

    def apply(self, state: Any, event: EventBase) -> Any:
        self.left -= 1
        if self.left < 0:
            raise Crash("killed mid-page")
        return self.inner.apply(state, event)

    def save(self, tx: ViewTx, table: str, instance_id: str, state: Any) -> None:
        self.inner.save(tx, table, instance_id, state)
