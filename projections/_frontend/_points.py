"""Points of an instance's log named on the command line or in the UI, and the error for bad
input.

One rule for both: ``point_in(text, log)`` parses a point and refuses it (``UsageError``) unless
the log has what it names; it never moves a point to one the log has. ``log`` is the little a
point is checked against (``LogPoints``): the CLI gathers it from the events it read
(``points_of``), the UI from its run history and the store, without scanning the log per page.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from functools import cached_property
from typing import Protocol

from kernel import (
    SUPERSTEP_MARKER_TYPES,
    EventBase,
    RunEvent,
    StepLogError,
    SuperstepEvent,
    SuperstepStarted,
)
from projections import AtPosition, AtSuperstep, AtTime, InsideSuperstep, Point
from projections._frontend._safe import visible

__all__ = ["POINT_FORMS", "LogPoints", "UsageError", "parse_point", "point_in", "points_of"]

POINT_FORMS = (
    "a point is pos:N (after position N; pos:0 is before the first event), step:SUPERSTEP, "
    "run:RUN:INDEX, inside:SUPERSTEP (ids may be shortened to a unique prefix) or "
    "time:ISO-8601 with a timezone (e.g. time:2026-11-30T14:55:00+00:00)"
)
"""What every bad point's error says a point may be."""


class UsageError(StepLogError):
    """Bad input on the command line: an unknown instance, a point that names nothing."""


class LogPoints(Protocol):
    """What a point is checked against: the facts of one instance's log that name points."""

    @property
    def last(self) -> int:
        """The instance's last stream position (0: it has no event)."""

    @property
    def supersteps(self) -> Collection[str]:
        """Every superstep id of the instance."""

    @property
    def runs(self) -> Collection[str]:
        """Every run id of the instance."""

    def superstep_at(self, run_id: str, index: int) -> str | None:
        """The id of the superstep ``index`` the run started (None: it started none so)."""

    def last_index(self, run_id: str) -> int | None:
        """The index of the last superstep the run started (None: it started none)."""

    def marked(self, superstep_id: str) -> bool:
        """Whether a marker (``superstep_committed`` or ``superstep_aborted``) closes it."""


def parse_point(text: str, log: LogPoints) -> Point:
    """Parse ``pos:N``, ``step:ID``, ``run:RUN:K``, ``time:ISO`` or ``inside:ID`` (ids may be
    unique prefixes of ``log``'s); ``UsageError`` naming the forms for anything else. The point
    is not checked against ``log`` (``point_in`` does)."""
    kind, _, rest = text.partition(":")
    if kind == "pos":
        return AtPosition(_number(text, rest, "N in pos:N must be a whole number"))
    if kind == "step":
        return AtSuperstep(_unique(rest, log.supersteps, "superstep"))
    if kind == "inside":
        return InsideSuperstep(_unique(rest, log.supersteps, "superstep"))
    if kind == "run":
        run, colon, index = rest.rpartition(":")
        if not colon:
            raise _bad(text, "run:RUN:INDEX needs a run and an index")
        number = _number(text, index, "INDEX in run:RUN:INDEX must be a whole number")
        return AtSuperstep(run_id=_unique(run, log.runs, "run"), index=number)
    if kind == "time":
        try:
            moment = datetime.fromisoformat(rest)
        except ValueError:
            raise _bad(text, "the time is not an ISO 8601 date and time") from None
        if moment.tzinfo is None:
            raise _bad(text, "the time has no timezone; add one, e.g. +00:00 or Z")
        return AtTime(moment)
    raise _bad(text, "it has none of the forms")


def point_in(text: str, log: LogPoints) -> Point:
    """``parse_point``, refused (``UsageError``) unless ``log`` has what the point names, never
    moved to a point it has. ``pos:N`` must be one of its positions (``pos:0``: before its first
    event); a superstep (``step:ID``, ``run:RUN:INDEX``) must be one it committed or aborted
    (``inside:ID`` shows one still open). A time names the last position at or before it (the
    state says which)."""
    point = parse_point(text, log)
    last = log.last
    if isinstance(point, AtPosition) and not 0 <= point.position <= last:
        raise UsageError(
            f"bad point {text!r}: the instance's positions are 1 to {last} (pos:0 is before its "
            "first event)"
        )
    if not isinstance(point, AtSuperstep):
        return point
    superstep = point.superstep_id
    if superstep is None:
        run = point.run_id or ""
        superstep = None if point.index is None else log.superstep_at(run, point.index)
        if superstep is None:
            highest = log.last_index(run)
            started = "it started none" if highest is None else f"its last is {highest}"
            raise UsageError(
                f"bad point {text!r}: run {point.run_id} has no superstep {point.index} ({started})"
            )
    if not log.marked(superstep):
        raise UsageError(
            f"bad point {text!r}: superstep {superstep} was never committed or aborted (it is "
            f"still open, or its run ended first); inside:{superstep} shows the state inside it"
        )
    return point


def points_of(events: Sequence[EventBase]) -> LogPoints:
    """``LogPoints`` of an instance whose whole log is ``events``."""
    return _EventPoints(events)


class _EventPoints:
    """``LogPoints`` gathered from a whole log, each fact when first asked."""

    def __init__(self, events: Sequence[EventBase]) -> None:
        self._events = events

    @property
    def last(self) -> int:
        return self._events[-1].position if self._events else 0

    @cached_property
    def supersteps(self) -> Collection[str]:
        return {e.superstep_id for e in self._events if isinstance(e, SuperstepEvent)}

    @cached_property
    def runs(self) -> Collection[str]:
        return {e.run_id for e in self._events if isinstance(e, RunEvent)}

    @cached_property
    def _started(self) -> dict[str, dict[int, str]]:
        started: dict[str, dict[int, str]] = {}
        for e in self._events:
            if isinstance(e, SuperstepStarted):
                started.setdefault(e.run_id, {})[e.index] = e.superstep_id
        return started

    @cached_property
    def _marked(self) -> set[str]:
        return {
            e.superstep_id
            for e in self._events
            if e.type in SUPERSTEP_MARKER_TYPES and isinstance(e, SuperstepEvent)
        }

    def superstep_at(self, run_id: str, index: int) -> str | None:
        return self._started.get(run_id, {}).get(index)

    def last_index(self, run_id: str) -> int | None:
        return max(self._started.get(run_id, {}), default=None)

    def marked(self, superstep_id: str) -> bool:
        return superstep_id in self._marked


def _bad(text: str, problem: str) -> UsageError:
    return UsageError(f"bad point {text!r}: {problem}; {POINT_FORMS}")


def _number(text: str, digits: str, problem: str) -> int:
    sign = digits[1:] if digits.startswith("-") else digits
    if not (sign.isascii() and sign.isdigit()):
        raise _bad(text, problem)
    return int(digits)


def _unique(prefix: str, ids: Collection[str], what: str) -> str:
    """The id of ``ids`` that ``prefix`` names exactly, or as the prefix of exactly one (the
    rule of every id: ``projections._frontend._ids.pick``)."""
    if prefix in ids:
        return prefix
    matches = sorted(i for i in ids if i.startswith(prefix)) if prefix else []
    if len(matches) != 1:
        found = (
            "none"
            if not matches
            else f"{len(matches)}: {', '.join(visible(m[:12]) for m in matches[:5])}"
        )
        raise UsageError(
            f"{what} {prefix!r} must name exactly one {what} of the instance ({found})"
        )
    return matches[0]
