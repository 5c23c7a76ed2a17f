"""Points of an instance's log named on the command line, and the error for bad input."""

from __future__ import annotations

from datetime import datetime

from kernel import EventBase, RunEvent, StepLogError, SuperstepEvent
from projections import AtPosition, AtSuperstep, AtTime, InsideSuperstep, Point

__all__ = ["UsageError", "parse_point"]


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


def _superstep_ids(events: list[EventBase]) -> set[str]:
    return {e.superstep_id for e in events if isinstance(e, SuperstepEvent)}


def _unique(prefix: str, ids: set[str], what: str) -> str:
    matches = sorted(i for i in ids if i.startswith(prefix)) if prefix else []
    if len(matches) != 1:
        found = (
            "none" if not matches else f"{len(matches)}: {', '.join(m[:12] for m in matches[:5])}"
        )
        raise UsageError(
            f"{what} {prefix!r} must name exactly one {what} of the instance ({found})"
        )
    return matches[0]
