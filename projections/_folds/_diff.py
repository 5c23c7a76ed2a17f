"""Diff between two states: keys added, removed and changed, with old and new values.

Example::

    events = store.read("order-42")
    change = diff_points(events, AtSuperstep(run_id="run-1", index=2), AtPosition(40))
    print(change.added, change.removed, change.changed)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kernel import EventBase, ValueCodec
from projections._folds._timetravel import Point, state_at

__all__ = ["Change", "StateDiff", "diff", "diff_points"]


@dataclass(frozen=True, slots=True)
class Change:
    """A key whose value changed: ``old`` and ``new`` wire values."""

    old: Any
    new: Any


@dataclass(frozen=True, slots=True)
class StateDiff:
    """``added`` and ``removed`` map keys to values; ``changed`` maps keys to ``Change``."""

    added: dict[str, Any] = field(default_factory=dict)
    removed: dict[str, Any] = field(default_factory=dict)
    changed: dict[str, Change] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)

    def decoded(self, codec: ValueCodec | None = None) -> StateDiff:
        """The same diff with every wire value decoded to its Python value."""
        codec = codec or ValueCodec()
        return StateDiff(
            {k: codec.decode(v) for k, v in self.added.items()},
            {k: codec.decode(v) for k, v in self.removed.items()},
            {k: Change(codec.decode(c.old), codec.decode(c.new)) for k, c in self.changed.items()},
        )


def diff(before: Mapping[str, Any], after: Mapping[str, Any]) -> StateDiff:
    """What changed from ``before`` to ``after`` (two ``values`` mappings), keys sorted."""
    added = {k: after[k] for k in sorted(after.keys() - before.keys())}
    removed = {k: before[k] for k in sorted(before.keys() - after.keys())}
    changed = {
        k: Change(before[k], after[k])
        for k in sorted(before.keys() & after.keys())
        if before[k] != after[k]
    }
    return StateDiff(added, removed, changed)


def diff_points(events: Iterable[EventBase], a: Point, b: Point) -> StateDiff:
    """The diff from the state at point ``a`` to the state at point ``b`` of one instance."""
    listed = list(events)
    return diff(state_at(listed, a).values, state_at(listed, b).values)
