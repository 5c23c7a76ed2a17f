"""Helpers for the store-backed projection tests."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel import EventBase, EventStore
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


class Crash(Exception):
    """A simulated crash in the middle of a page."""


class CrashingView(ViewSpec):
    """Wraps a view and raises after folding ``after`` events (a crash mid-page)."""

    def __init__(self, inner: ViewSpec, after: int) -> None:
        self.inner = inner
        self.left = after
        self.name = inner.name  # type: ignore[misc]
        self.event_types = inner.event_types  # type: ignore[misc]

    def load(self, tx: ViewTx, table: str, instance_id: str) -> Any:
        return self.inner.load(tx, table, instance_id)

    def apply(self, state: Any, event: EventBase) -> Any:
        self.left -= 1
        if self.left < 0:
            raise Crash("killed mid-page")
        return self.inner.apply(state, event)

    def save(self, tx: ViewTx, table: str, instance_id: str, state: Any) -> None:
        self.inner.save(tx, table, instance_id, state)
