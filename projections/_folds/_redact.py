"""Sensitive state keys: which keys of an instance are sensitive, and their values redacted.

The rule lives here and nowhere else. A key of an instance is **sensitive** if it matches a pattern
that any run of the instance declared (``RunStarted.sensitive_keys``, from
``WorkflowBuilder(sensitive_keys=[...])``), or that any run of the instance it was forked from
declared (its values came from there), or that the reader adds. A pattern is an exact key or an
``fnmatch`` glob (``"secret_*"``, ``"card[0-9]"``), matched case-sensitively
(``fnmatch.fnmatchcase``). Declaring a key sensitive in a later run hides its earlier values too:
the rule is the instance's, not the run's.

Redaction is done when an answer is shown, never when it is computed or stored: the folds
(``fold_committed``, ``state_at``, ``fold_blame``, ...) and the materialized views keep the real
values, and ``SensitiveKeys`` makes a redacted copy of an answer for display. A redacted value is
replaced by ``REDACTED``, the JSON object ``{"$t": "redacted"}``: the value codec tags every stored
object that has a ``"$t"`` key, so no stored value is ever equal to it, and ``is_redacted`` tells
them apart. A redacted answer is for showing: ``decoded()`` on it raises ``DecodeError`` (read the
answer unredacted to decode values). A ``delete`` has no value, so it is shown as it is.

What stays visible: that a key exists, that it was written, when, by which executor, run and
superstep, with which operation, and whether the write counted; that its value changed between
two points (a diff lists it as changed, with both values redacted). Only state values are
redacted, and the results of recorded steps: run inputs, messages, outputs, request data and
error messages are not state keys.

**Recorded steps** (``StepRecorded``) are matched by their step's *name*, against the same patterns
by the same rule (exact or ``fnmatch`` glob, case-sensitive): a step named like a sensitive key has
its result and its recorded arguments redacted wherever a key's value would be (``steplog steps``,
``show``, ``log``, ``replay``, the UI), and a call served from the log shows its origin's result and
arguments, redacted by the same name. Declaring ``sensitive_keys=["call_model"]`` hides what ``@step
call_model`` returned; everything else about the call stays visible (executor, superstep and
verdict, duration, token counts, error, whether it was served and from which run), as a sensitive
key's writes stay listed. A step's arguments are in the log only when it records them
(``@step(record_arguments=True)``; else only their digest), and are redacted like its result.

Example::

    rule = sensitive_keys_of(store, "order-42", extra=["card_*"])
    at = rule.state(state_at(store.read("order-42"), AtPosition(10)))
    print(rule.patterns, at.values)
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import Any, Final, TypeVar

from kernel import (
    EventBase,
    EventStore,
    InstanceForked,
    ProjectionError,
    RunStarted,
    StateStaged,
    StepRecorded,
)
from projections._folds._blame import KeyBlame, MemoryWriteRows, WriteRecord
from projections._folds._diff import Change, StateDiff
from projections._folds._steps import RecordedStep
from projections._folds._timetravel import StateAt

__all__ = [
    "REDACTED",
    "SENSITIVE_TYPES",
    "SensitiveKeys",
    "declared_patterns",
    "is_redacted",
    "sensitive_keys_of",
]

REDACTED: Final[Mapping[str, str]] = MappingProxyType({"$t": "redacted"})
"""What a sensitive key's value is replaced by (read-only; each answer gets its own ``dict``
copy, equal to it)."""
SENSITIVE_TYPES: Final = ("run_started", "instance_forked")
"""The event types the rule is read from: run starts (their patterns) and the fork event."""

E = TypeVar("E", bound=EventBase)


def is_redacted(value: Any) -> bool:
    """Whether ``value`` (a wire JSON tree) is the ``REDACTED`` marker."""
    return type(value) is dict and value == REDACTED


def _marker() -> dict[str, Any]:
    return dict(REDACTED)


class SensitiveKeys:
    """The sensitive keys of one instance, as patterns, and redacted copies of answers.

    ``SensitiveKeys()`` (no patterns) redacts nothing: it is what a reader that reveals uses.
    Raises ``ProjectionError`` for a pattern that is not a non-empty string. ``key in rule``
    tells whether a key is sensitive.
    """

    __slots__ = ("_exact", "_globs", "patterns")

    def __init__(self, patterns: Iterable[str] = ()) -> None:
        if isinstance(patterns, str):
            raise ProjectionError(
                f"sensitive key patterns must be a list, not one string: use [{patterns!r}]"
            )
        unique: list[str] = []
        for pattern in patterns:
            if not isinstance(pattern, str) or not pattern:
                raise ProjectionError(
                    f"a sensitive key pattern must be a non-empty string, got {pattern!r}"
                )
            if pattern not in unique:
                unique.append(pattern)
        self.patterns: tuple[str, ...] = tuple(unique)
        """The patterns, each once, in the order first given."""
        self._exact = frozenset(p for p in unique if not _is_glob(p))
        self._globs = tuple(p for p in unique if _is_glob(p))

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        return key in self._exact or any(fnmatch.fnmatchcase(key, p) for p in self._globs)

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def __repr__(self) -> str:
        return f"SensitiveKeys({list(self.patterns)!r})"

    def adding(self, patterns: Iterable[str]) -> SensitiveKeys:
        """These patterns and ``patterns`` (validated the same way)."""
        if isinstance(patterns, str):
            patterns = [patterns]  # refused by the constructor, with its message
        return SensitiveKeys([*self.patterns, *SensitiveKeys(patterns).patterns])

    @classmethod
    def from_events(cls, events: Iterable[EventBase], extra: Iterable[str] = ()) -> SensitiveKeys:
        """The patterns declared by the runs among ``events`` (one instance's), and ``extra``.
        A fork's origin is not looked at: ``sensitive_keys_of`` does that."""
        return cls(declared_patterns(events)).adding(extra)

    # -- redacting ------------------------------------------------------------------------

    def values(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """A copy of ``values`` (key -> wire value) with sensitive keys' values redacted."""
        return {key: _marker() if key in self else value for key, value in values.items()}

    def state(self, at: StateAt) -> StateAt:
        """``at`` (from ``state_at`` or ``TimeTravel.state``) with sensitive values redacted."""
        if not self or not any(key in self for key in at.values):
            return at
        return replace(at, values=self.values(at.values))

    def diff(self, changes: StateDiff) -> StateDiff:
        """``changes`` with sensitive values redacted; a changed key stays listed as changed."""
        if not self:
            return changes
        return StateDiff(
            self.values(changes.added),
            self.values(changes.removed),
            {
                key: Change(_marker(), _marker()) if key in self else change
                for key, change in changes.changed.items()
            },
        )

    def write(self, record: WriteRecord) -> WriteRecord:
        """A blame write record with its value redacted if its key is sensitive (everything
        else, the verdict included, is kept)."""
        if record.op == "delete" or record.key not in self:
            return record
        return record.model_copy(update={"value": _marker()})

    def blame(self, blame: KeyBlame) -> KeyBlame:
        """A copy of ``blame`` (from ``fold_blame``, ``blame_keys`` or ``Projector.blame``) whose
        sensitive keys' write records have their values redacted; every write is still listed,
        with its position, run, superstep, executor, time, operation and status."""
        keys = blame.written_keys()
        if not self or not any(key in self for key in keys):
            return blame
        records = sorted(
            (self.write(w) for key in keys for w in blame.writes(key)),
            key=lambda record: record.position,
        )
        rows = MemoryWriteRows()
        for record in records:
            rows.add(record)
        return KeyBlame(blame.only, rows=rows, tracker=blame.tracker_json())

    def event(self, event: E) -> E:
        """``event`` with sensitive values redacted: a ``StateStaged`` value, the values a fork
        started with (``InstanceForked.values``), or the result and recorded arguments of a
        recorded step whose name is sensitive (``StepRecorded.result``: a served call's record
        holds none, a failed call's has its error instead; ``StepRecorded.arguments``). Other
        events are returned as they are."""
        if not self:
            return event
        if isinstance(event, StateStaged):
            if event.op == "delete" or event.key not in self:
                return event
            return event.model_copy(update={"value": _marker()})
        if isinstance(event, StepRecorded):
            if event.name not in self:
                return event
            update: dict[str, Any] = {}
            if event.reused is None and event.error is None:
                update["result"] = _marker()
            if event.arguments is not None:
                update["arguments"] = _marker()
            return event.model_copy(update=update) if update else event
        if isinstance(event, InstanceForked) and any(key in self for key in event.values):
            return event.model_copy(update={"values": self.values(event.values)})
        return event

    def step(self, step: RecordedStep) -> RecordedStep:
        """``step`` with its result redacted if its name is sensitive: its own record's, and for
        a served call its origin's (the result it was served)."""
        if not self:
            return step
        origin = None if step.origin is None else self.event(step.origin)
        return replace(step, record=self.event(step.record), origin=origin)

    def events(self, events: Iterable[E]) -> list[E]:
        """``event()`` of each of ``events``."""
        return [self.event(event) for event in events]


def _is_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def declared_patterns(events: Iterable[EventBase]) -> list[str]:
    """Every pattern the runs among ``events`` declared sensitive, each once, first seen
    first."""
    found: dict[str, None] = {}
    for event in events:
        if isinstance(event, RunStarted):
            found.update(dict.fromkeys(event.sensitive_keys))
    return list(found)


def sensitive_keys_of(
    store: EventStore,
    instance_id: str,
    *,
    extra: Iterable[str] = (),
    events: Sequence[EventBase] | None = None,
) -> SensitiveKeys:
    """The sensitive keys of ``instance_id`` in ``store``: the patterns its runs declared, those
    of the instance it was forked from (and so on up its lineage), and ``extra`` (the reader's).

    ``events`` are the instance's events when the caller has read them all already (then only a
    fork's origin is read). Otherwise only run starts and the fork event are looked for
    (``store.find_events(..., SENSITIVE_TYPES)``): every row is looked at, but only the rows
    that may hold one are decoded, so the answer is the one a full read gives, at a fraction of
    its cost. Raises ``ProjectionError`` for a bad pattern in ``extra``, and what
    ``store.find_events`` raises.
    """
    rule = SensitiveKeys(extra)  # checked before anything is read
    found: list[str] = []
    seen: set[str] = set()
    name: str | None = instance_id
    own = events
    while name is not None and name not in seen:
        seen.add(name)
        listed = own if own is not None else _starts_and_fork(store, name)
        own = None
        found += declared_patterns(listed)
        fork = next((e for e in listed if isinstance(e, InstanceForked)), None)
        name = fork.origin_instance if fork is not None else None
    return SensitiveKeys(found).adding(rule.patterns)


def _starts_and_fork(store: EventStore, instance_id: str) -> list[EventBase]:
    return store.find_events(instance_id, SENSITIVE_TYPES)
