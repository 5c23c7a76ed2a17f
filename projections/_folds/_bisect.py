"""Bisect: the first superstep after which a predicate on committed state holds.

Nothing is re-run: the log is folded with the kernel's fold, and the predicate is asked after each
committed superstep (and once on the empty state). A predicate that raises ``LookupError`` or
``TypeError`` (a key not there yet, ``None["status"]``) counts as false. In a forked instance it is
also asked on the values the fork started with: if it holds there, the result says so
(``origin_instance``, and the origin's checkpoint and run).

Example::

    found = bisect(store.read("order-42"), lambda s: s["plan"]["status"] == "failed")
    if found is not None:
        print(found.run_id, found.index, found.superstep_id, found.position)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kernel import CommittedState, EventBase, InstanceForked, SuperstepStarted, ValueCodec

__all__ = ["BisectResult", "bisect"]

Predicate = Callable[[Mapping[str, Any]], object]


@dataclass(frozen=True, slots=True)
class BisectResult:
    """Where the predicate first held: the superstep (None if it held on the empty state),
    the position of its marker, its time, and the committed values (wire trees) there.

    When it first held on the values a fork started with, ``origin_instance`` names the instance
    it was forked from, ``superstep_id`` and ``run_id`` are the origin's checkpoint and run there,
    ``index`` is None and ``position`` is the fork event's.
    """

    superstep_id: str | None
    run_id: str | None
    index: int | None
    position: int
    timestamp: datetime | None
    values: dict[str, Any]
    origin_instance: str | None = None


def _holds(predicate: Predicate, values: Mapping[str, Any]) -> bool:
    try:
        return bool(predicate(values))
    except (LookupError, TypeError):
        return False


def bisect(
    events: Iterable[EventBase],
    predicate: Predicate,
    *,
    decode: bool = True,
    codec: ValueCodec | None = None,
) -> BisectResult | None:
    """The first committed superstep of one instance after which ``predicate(state)`` is true.

    ``state`` is the committed state, decoded to Python values unless ``decode=False`` (then it
    holds wire JSON trees). Returns None when the predicate never holds.
    """
    codec = codec or ValueCodec()
    view = CommittedState()

    def check(values: dict[str, Any]) -> bool:
        shown = {k: codec.decode(v) for k, v in values.items()} if decode else values
        return _holds(predicate, shown)

    if check(view.values):
        return BisectResult(None, None, None, 0, None, {})
    started: dict[str, SuperstepStarted] = {}
    for event in events:
        if isinstance(event, SuperstepStarted):
            started[event.superstep_id] = event
        before = view.last_committed
        view.apply(event)
        if isinstance(event, InstanceForked):
            if check(view.values):
                return BisectResult(
                    event.checkpoint,
                    event.origin_run,
                    None,
                    event.position,
                    event.timestamp,
                    dict(view.values),
                    event.origin_instance,
                )
            continue
        if view.last_committed != before and check(view.values):
            superstep_id = view.last_committed
            assert superstep_id is not None
            start = started.get(superstep_id)
            return BisectResult(
                superstep_id,
                None if start is None else start.run_id,
                None if start is None else start.index,
                event.position,
                event.timestamp,
                dict(view.values),
            )
    return None
