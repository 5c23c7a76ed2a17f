"""Points of an instance's log named on the command line, and the error for bad input."""

from __future__ import annotations

from datetime import datetime

from kernel import (
    SUPERSTEP_MARKER_TYPES,
    EventBase,
    RunEvent,
    StepLogError,
    SuperstepEvent,
    SuperstepStarted,
)
from projections import AtPosition, AtSuperstep, AtTime, InsideSuperstep, Point
from projections.cli._safe import visible

__all__ = ["UsageError", "parse_point", "point_in"]


class UsageError(StepLogError):
    """Bad input on the command line: an unknown instance, a point that names nothing."""


def parse_point(text: str, events: list[EventBase]) -> Point:
    """Parse ``pos:N``, ``step:ID``, ``run:RUN:K``, ``time:ISO`` or ``inside:ID`` (id prefixes)."""
    kind, _, rest = text.partition(":")
    try:
        if kind == "pos":
            return AtPosition(int(rest))
        if kind == "step":
            return AtSuperstep(_unique(rest, _superstep_ids(events), "superstep"))
        if kind == "inside":
            return InsideSuperstep(_unique(rest, _superstep_ids(events), "superstep"))
        if kind == "run":
            run, _, index = rest.rpartition(":")
            runs = {e.run_id for e in events if isinstance(e, RunEvent)}
            return AtSuperstep(run_id=_unique(run, runs, "run"), index=int(index))
        if kind == "time":
            moment = datetime.fromisoformat(rest)
            if moment.tzinfo is None:
                raise ValueError("it has no timezone; add one, e.g. +00:00 or Z")
            return AtTime(moment)
    except ValueError as error:
        raise UsageError(f"bad point {text!r}: {error}") from error
    raise UsageError(
        f"bad point {text!r}: use pos:N, step:SUPERSTEP, run:RUN:INDEX, time:ISO-8601 or "
        "inside:SUPERSTEP"
    )


def point_in(text: str, events: list[EventBase]) -> Point:
    """``parse_point`` for a command given ``events``, the instance's whole log: refused
    (``UsageError``) unless the log has what the point names, never moved to a point it has.
    ``pos:N`` must be one of its positions (``pos:0``: before its first event); a superstep
    (``step:ID``, ``run:RUN:INDEX``) must be one it committed or aborted (``inside:ID`` shows
    one still open). A time names the last position at or before it (the state says which)."""
    point = parse_point(text, events)
    last = events[-1].position if events else 0
    if isinstance(point, AtPosition) and not 0 <= point.position <= last:
        raise UsageError(
            f"bad point {text!r}: the instance's positions are 1 to {last} (pos:0 is before its "
            "first event)"
        )
    if not isinstance(point, AtSuperstep):
        return point
    superstep = point.superstep_id
    if superstep is None:
        indexes = {
            e.index: e.superstep_id
            for e in events
            if isinstance(e, SuperstepStarted) and e.run_id == point.run_id
        }
        superstep = None if point.index is None else indexes.get(point.index)
        if superstep is None:
            started = f"its last is {max(indexes)}" if indexes else "it started none"
            raise UsageError(
                f"bad point {text!r}: run {point.run_id} has no superstep {point.index} ({started})"
            )
    if not any(
        e.type in SUPERSTEP_MARKER_TYPES and isinstance(e, SuperstepEvent)
        and e.superstep_id == superstep
        for e in events
    ):  # fmt: skip
        raise UsageError(
            f"bad point {text!r}: superstep {superstep} was never committed or aborted (it is "
            f"still open, or its run ended first); inside:{superstep} shows the state inside it"
        )
    return point


def _superstep_ids(events: list[EventBase]) -> set[str]:
    return {e.superstep_id for e in events if isinstance(e, SuperstepEvent)}


def _unique(prefix: str, ids: set[str], what: str) -> str:
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
