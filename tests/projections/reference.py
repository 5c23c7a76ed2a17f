"""A simple reference model of the log, written from the rules, sharing no code with projections.

It answers by scanning the whole list of events each time: slow and obvious on purpose.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from kernel import ErrorInfo, EventBase

RUN_END = {"run_completed", "run_failed", "run_cancelled", "run_abandoned"}
MARKERS = {"superstep_committed", "superstep_aborted"}


class Reference:
    def __init__(self, events: list[EventBase]) -> None:
        self.events = events
        self.run_end: dict[str, EventBase] = {}
        for e in events:
            if e.type in RUN_END and e.run_id not in self.run_end:
                self.run_end[e.run_id] = e
        # The marker that decides each superstep: its first, if its run had not ended yet.
        self.marker: dict[str, EventBase] = {}
        self.first_marker: dict[str, EventBase] = {}
        for e in events:
            if e.type in MARKERS and e.superstep_id not in self.first_marker:
                self.first_marker[e.superstep_id] = e
                if e.position < self._end_pos(e.run_id):
                    self.marker[e.superstep_id] = e
        self.writes = [e for e in events if e.type == "state_staged"]
        # Writes that count, in the order they take effect.
        self.counting = sorted(
            (w for w in self.writes if self._counts(w)),
            key=lambda w: (self.marker[w.superstep_id].position, w.position),
        )

    def _end_pos(self, run_id: str) -> float:
        end = self.run_end.get(run_id)
        return math.inf if end is None else end.position

    def _counts(self, w: EventBase) -> bool:
        m = self.marker.get(w.superstep_id)
        return (
            m is not None
            and m.type == "superstep_committed"
            and w.position < m.position
            and w.position < self._end_pos(w.run_id)
        )

    # -- committed state ------------------------------------------------------------------------

    def state(self, upto: float = math.inf) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for w in self.counting:
            if self.marker[w.superstep_id].position <= upto:
                if w.op == "set":
                    values[w.key] = w.value
                else:
                    values.pop(w.key, None)
        return values

    def position_at_time(self, when: datetime) -> int:
        last = 0
        for e in self.events:
            if e.timestamp > when:
                break
            last = e.position
        return last

    def inside(self, superstep_id: str) -> tuple[dict[str, Any], str]:
        start = next(
            e
            for e in self.events
            if e.type == "superstep_started" and e.superstep_id == superstep_id
        )
        first = self.first_marker.get(superstep_id)
        end = self.run_end.get(start.run_id)
        stops = [e.position for e in (first, end) if e is not None]
        stop = min(stops) if stops else math.inf
        if first is not None and first.position == stop:
            status = (
                "committed" if first.type == "superstep_committed" else f"aborted: {first.reason}"
            )
        elif end is not None and end.position == stop:
            status = "unmarked"
        else:
            status = "open"
        values = self.state(stop - 1)
        for w in self.writes:
            if w.superstep_id == superstep_id and w.position < stop:
                if w.op == "set":
                    values[w.key] = w.value
                else:
                    values.pop(w.key, None)
        return values, status

    # -- blame ----------------------------------------------------------------------------------

    def blame(self) -> dict[str, list[tuple[int, str, str | None]]]:
        """key -> [(position, status, reason)] in stream order."""
        order = {w.position: i for i, w in enumerate(self.counting)}
        result: dict[str, list[tuple[int, str, str | None]]] = {}
        for w in self.writes:
            m = self.marker.get(w.superstep_id)
            reason = None
            if w.position > self._end_pos(w.run_id) or (m is not None and w.position > m.position):
                status = "late"
            elif m is not None and m.type == "superstep_committed":
                later = [
                    c
                    for c in self.counting
                    if c.key == w.key and order[c.position] > order[w.position]
                ]
                status = "superseded" if later else "committed"
            elif m is not None:
                status, reason = "aborted", m.reason
            elif w.run_id in self.run_end:
                status = "unmarked"
            else:
                status = "pending"
            result.setdefault(w.key, []).append((w.position, status, reason))
        return result

    # -- history --------------------------------------------------------------------------------

    def runs(self) -> list[dict[str, Any]]:
        found = []
        for start in (e for e in self.events if e.type == "run_started"):
            run_id = start.run_id
            end = self.run_end.get(run_id)
            if end is None:
                status = "running"
            elif end.type == "run_abandoned":
                status = end.reason
            else:
                status = end.type.removeprefix("run_")
            steps = [
                e.superstep_id
                for e in self.events
                if e.type == "superstep_started"
                and e.run_id == run_id
                and e.position < self._end_pos(run_id)
            ]
            outputs = sorted(
                (
                    (self.marker[e.superstep_id].position, e.position, e.value)
                    for e in self.events
                    if e.type == "output_yielded"
                    and e.superstep_id in steps
                    and self._output_counts(e)
                ),
            )
            found.append(
                {
                    "run_id": run_id,
                    "status": status,
                    "started_at": start.timestamp,
                    "ended_at": None if end is None else end.timestamp,
                    "supersteps": len(steps),
                    "committed": sum(
                        1
                        for s in steps
                        if s in self.marker and self.marker[s].type == "superstep_committed"
                    ),
                    "outputs": [value for _, _, value in outputs],
                    "error": _end_error(end),
                    "superstep_ids": steps,
                }
            )
        return found

    def _output_counts(self, e: EventBase) -> bool:
        m = self.marker.get(e.superstep_id)
        return m is not None and m.type == "superstep_committed" and e.position < m.position

    def supersteps(self) -> list[dict[str, Any]]:
        found = []
        for start in (e for e in self.events if e.type == "superstep_started"):
            if start.position > self._end_pos(start.run_id):
                continue
            sid = start.superstep_id
            m = self.marker.get(sid)
            mine = [e for e in self.events if getattr(e, "superstep_id", None) == sid]
            keys: list[str] = []
            for e in mine:
                if e.type == "state_staged" and e.key not in keys:
                    keys.append(e.key)
            found.append(
                {
                    "superstep_id": sid,
                    "index": start.index,
                    "status": "open" if m is None else m.type.removeprefix("superstep_"),
                    "reason": None if m is None or m.type == "superstep_committed" else m.reason,
                    "position": None if m is None else m.position,
                    "executors": [e.executor_id for e in mine if e.type == "executor_invoked"],
                    "keys": keys,
                }
            )
        return found

    # -- bisect ---------------------------------------------------------------------------------

    def bisect(self, predicate: Any) -> tuple[str | None, int] | None:
        def holds(values: dict[str, Any]) -> bool:
            try:
                return bool(predicate(values))
            except (LookupError, TypeError):
                return False

        if holds({}):
            return None, 0
        commits = sorted(
            (m for m in self.marker.values() if m.type == "superstep_committed"),
            key=lambda m: m.position,
        )
        for m in commits:
            if holds(self.state(m.position)):
                return m.superstep_id, m.position
        return None


_WHY = {
    "crashed": "its process died (or its lease ran out) before the run ended",
    "abandoned": "it stopped before it ended (its stream was dropped, or its task stopped)",
}


def _end_error(end: Any) -> ErrorInfo | None:
    """A failed run's error; for a run found unfinished and closed, what the log says of it:
    why, the superstep aborted, who closed it (``recover`` when the event names no one) and
    when."""
    if end is None:
        return None
    if end.type == "run_failed":
        return end.error
    if end.type != "run_abandoned":
        return None
    aborted = (
        "" if end.superstep_id is None else f"; its open superstep {end.superstep_id} was aborted"
    )
    closer = end.closed_by or "recover"
    return ErrorInfo(
        type=end.reason,
        message=f"{_WHY[end.reason]}{aborted}; closed by {closer} at {end.timestamp.isoformat()}",
    )
