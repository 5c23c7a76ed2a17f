"""What one superstep writes, for the raw baselines to write the same bytes.

A ``RowShape`` is a cycle of supersteps, each a list of ``(topic, state)`` rows as steplog's store
keeps them (``steplog_events``: originator_id, originator_version, topic, state). The raw
sqlite3/psycopg baselines insert exactly these rows, one transaction per superstep.

Where the rows come from, best first:
1. ``calibrate_from_sqlite``: the rows of a real steplog run (once the runner exists);
2. ``--raw-shape ROWSxBYTES`` on the command line;
3. ``synthetic_*``: the events steplog's event model produces for that superstep, encoded by
   steplog's own ``EventMapper`` (what the runner is expected to write).
"""

from __future__ import annotations

import datetime as dt
import sqlite3
import uuid
from dataclasses import dataclass
from pathlib import Path

import orjson

__all__ = [
    "RowShape",
    "calibrate_from_sqlite",
    "parse_shape",
    "stamp",
    "synthetic_fanout",
    "synthetic_loop",
]

Row = tuple[str, bytes]


@dataclass(frozen=True)
class RowShape:
    steps: tuple[tuple[Row, ...], ...]
    source: str

    def rows(self, superstep: int) -> tuple[Row, ...]:
        return self.steps[superstep % len(self.steps)]

    @property
    def rows_per_step(self) -> float:
        return sum(len(s) for s in self.steps) / len(self.steps)

    @property
    def bytes_per_step(self) -> float:
        """Payload bytes (topic + state) per superstep, averaged over the cycle."""
        total = sum(len(t) + len(s) for step in self.steps for t, s in step)
        return total / len(self.steps)

    def describe(self) -> str:
        return (
            f"{self.rows_per_step:g} rows, {self.bytes_per_step:.0f} payload B/superstep "
            f"({self.source})"
        )


def _now() -> dt.datetime:
    return dt.datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=dt.UTC)


def _encode(events: list[object]) -> tuple[Row, ...]:
    from kernel._mapper import EventMapper

    mapper = EventMapper()
    rows = []
    for event in events:
        stored = mapper.to_stored(event)  # type: ignore[arg-type]
        rows.append((stored.topic, bytes(stored.state)))
    return tuple(rows)


def synthetic_loop(instance_id: str = "bench-loop") -> RowShape:
    """The loop benchmark's superstep: started, invoked, 2 state writes, 1 message, completed,
    committed."""
    from kernel import (
        ExecutorCompleted,
        ExecutorInvoked,
        MessageStaged,
        StateStaged,
        SuperstepCommitted,
        SuperstepStarted,
    )

    common = {
        "instance_id": instance_id,
        "timestamp": _now(),
        "run_id": str(uuid.UUID(int=1)),
        "superstep_id": str(uuid.UUID(int=2)),
    }
    pos = iter(range(1, 100))
    events = [
        SuperstepStarted(position=next(pos), index=1000, **common),
        ExecutorInvoked(position=next(pos), executor_id="a", **common),
        StateStaged(position=next(pos), executor_id="a", key="a", op="set", value=1000, **common),
        StateStaged(position=next(pos), executor_id="a", key="b", op="set", value=1000, **common),
        MessageStaged(position=next(pos), source="a", targets=["b"], message=1001, **common),
        ExecutorCompleted(position=next(pos), executor_id="a", **common),
        SuperstepCommitted(position=next(pos), **common),
    ]
    return RowShape((_encode(events),), "synthetic: steplog's event model, 7 events/superstep")


def synthetic_fanout(width: int, keys: int, instance_id: str = "bench-fanout") -> RowShape:
    """The fan-out benchmark's two supersteps: the source (1 write, 1 message to ``width``
    targets), then ``width`` executors each writing ``keys`` keys (w0 sends back)."""
    from kernel import (
        ExecutorCompleted,
        ExecutorInvoked,
        MessageStaged,
        StateStaged,
        SuperstepCommitted,
        SuperstepStarted,
    )

    targets = [f"w{i}" for i in range(width)]

    def common(step: int) -> dict[str, object]:
        return {
            "instance_id": instance_id,
            "timestamp": _now(),
            "run_id": str(uuid.UUID(int=1)),
            "superstep_id": str(uuid.UUID(int=10 + step)),
        }

    pos = iter(range(1, 10_000))
    c = common(0)
    source = [
        SuperstepStarted(position=next(pos), index=100, **c),
        ExecutorInvoked(position=next(pos), executor_id="source", **c),
        StateStaged(position=next(pos), executor_id="source", key="round", op="set", value=50, **c),
        MessageStaged(position=next(pos), source="source", targets=targets, message=50, **c),
        ExecutorCompleted(position=next(pos), executor_id="source", **c),
        SuperstepCommitted(position=next(pos), **c),
    ]
    c = common(1)
    wide: list[object] = [SuperstepStarted(position=next(pos), index=101, **c)]
    for w in targets:
        wide.append(ExecutorInvoked(position=next(pos), executor_id=w, **c))
        for k in range(keys):
            wide.append(
                StateStaged(
                    position=next(pos), executor_id=w, key=f"{w}.k{k}", op="set", value=50, **c
                )
            )
        if w == "w0":
            wide.append(
                MessageStaged(position=next(pos), source=w, targets=["source"], message=50, **c)
            )
        wide.append(ExecutorCompleted(position=next(pos), executor_id=w, **c))
    wide.append(SuperstepCommitted(position=next(pos), **c))
    return RowShape(
        (_encode(source), _encode(wide)),
        f"synthetic: steplog's event model, {len(source)}+{len(wide)} events/2 supersteps",
    )


def parse_shape(text: str) -> RowShape:
    """``"7x173"``: 7 rows of 173 state bytes each per superstep (JSON padded to length)."""
    rows_text, _, size_text = text.lower().partition("x")
    rows, size = int(rows_text), int(size_text)
    if rows < 1 or size < 16:
        raise ValueError(f"--raw-shape {text!r}: need >= 1 rows of >= 16 bytes")
    pad = size - len(b'{"p":""}')
    state = orjson.dumps({"p": "x" * pad})
    return RowShape((tuple(("state_staged@1", state) for _ in range(rows)),), f"--raw-shape {text}")


def calibrate_from_sqlite(path: Path, instance_id: str, cycle: int = 1) -> RowShape | None:
    """The rows of ``cycle`` consecutive supersteps from the middle of a real steplog run."""
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(
            "SELECT topic, state FROM steplog_events WHERE originator_id = ? "
            "ORDER BY originator_version",
            (instance_id,),
        ).fetchall()
    finally:
        conn.close()
    steps: list[list[Row]] = []
    current: list[Row] | None = None
    for topic, state in rows:
        if topic.startswith("superstep_started@"):
            current = []
        if current is not None:
            current.append((topic, bytes(state)))
        if topic.startswith(("superstep_committed@", "superstep_aborted@")) and current is not None:
            steps.append(current)
            current = None
    if len(steps) < 2 * cycle + 1:
        return None
    middle = (len(steps) // 2 // cycle) * cycle
    chosen = tuple(tuple(s) for s in steps[middle : middle + cycle])
    return RowShape(chosen, f"calibrated from a steplog SQLite run ({len(steps)} supersteps)")


def stamp(state: bytes, when: dt.datetime) -> bytes:
    """``state`` with its ``"timestamp"`` value replaced by ``when``, in the template's own style
    (``...+00:00`` or ``...Z``, microseconds), so the row keeps its length and a follower can
    measure lag from it. Raises ``ValueError`` when the row has no timestamp."""
    key = b'"timestamp":"'
    begin = state.find(key)
    if begin < 0:
        raise ValueError(f"row has no timestamp to stamp: {state[:80]!r}")
    begin += len(key)
    end = state.index(b'"', begin)
    iso = when.astimezone(dt.UTC).isoformat(timespec="microseconds")
    if state[end - 1 : end] == b"Z":
        iso = iso.replace("+00:00", "Z")
    return state[:begin] + iso.encode() + state[end:]
