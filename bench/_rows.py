"""What one superstep writes, for the raw baselines to write the same bytes.

A ``RowShape`` is a cycle of supersteps, each a list of ``(topic, state)`` rows as steplog's store
keeps them (``steplog_events``: originator_id, originator_version, topic, state). The raw
sqlite3/psycopg baselines insert exactly these rows, one transaction per superstep.

Where the rows come from: ``calibrate`` runs the benchmark's own workflow on a steplog SQLite
store and reads back the rows of one cycle of supersteps from the middle of the run;
``--raw-shape ROWSxBYTES`` on the command line overrides that (``parse_shape``).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import sqlite3
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench._db import remove_sqlite

__all__ = [
    "RowShape",
    "calibrate",
    "calibrate_from_sqlite",
    "parse_shape",
    "row_time",
    "stamp",
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


def parse_shape(text: str) -> RowShape:
    """``"7x173"``: 7 rows of 173 state bytes each per superstep (JSON padded to length)."""
    rows_text, _, size_text = text.lower().partition("x")
    rows, size = int(rows_text), int(size_text)
    if rows < 1 or size < 16:
        raise ValueError(f"--raw-shape {text!r}: need >= 1 rows of >= 16 bytes")
    pad = size - len(b'{"p":""}')
    state = orjson.dumps({"p": "x" * pad})
    return RowShape((tuple(("state_staged@1", state) for _ in range(rows)),), f"--raw-shape {text}")


def calibrate(workdir: Path, workflow: Callable[[Any, str], Any], cycle: int = 1) -> RowShape:
    """The rows a real steplog run writes: ``workflow(store, instance_id)`` is built on a fresh
    SQLite store, run with input 0, and ``cycle`` supersteps of its rows are read back."""
    from kernel import open_store

    path = workdir / f"calibrate-{uuid.uuid4().hex[:8]}.db"
    instance = "bench-calibrate"
    try:
        store = open_store(f"sqlite:///{path}")
        try:
            asyncio.run(workflow(store, instance).run(0))
        finally:
            store.close()
        return calibrate_from_sqlite(path, instance, cycle)
    finally:
        remove_sqlite(path)


def calibrate_from_sqlite(path: Path, instance_id: str, cycle: int = 1) -> RowShape:
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
    if rows and str(rows[0][0]).isdigit():
        # Batch rows: one row per append, and a run appends each superstep's events as one row
        # (its first row holds the run's start and the first superstep's opening).
        steps = [[(topic, bytes(state))] for topic, state in rows[1:]]
    current: list[Row] | None = None
    for topic, state in rows if not steps else ():  # event rows (the old format)
        if topic.startswith("superstep_started@"):
            current = []
        if current is not None:
            current.append((topic, bytes(state)))
        if topic.startswith(("superstep_committed@", "superstep_aborted@")) and current is not None:
            steps.append(current)
            current = None
    if len(steps) < 2 * cycle + 1:
        raise ValueError(
            f"calibration run of {instance_id!r} closed {len(steps)} supersteps; "
            f"need {2 * cycle + 1} to take a cycle of {cycle} from the middle"
        )
    middle = (len(steps) // 2 // cycle) * cycle
    chosen = tuple(tuple(s) for s in steps[middle : middle + cycle])
    return RowShape(chosen, f"calibrated from a steplog SQLite run ({len(steps)} supersteps)")


def stamp(state: bytes, when: dt.datetime) -> bytes:
    """``state`` with its ``"timestamp"`` value replaced by ``when``, in the template's own style
    (``...+00:00`` or ``...Z``, microseconds), so the row keeps its length and a follower can
    measure lag from it. A batch row (``[format, base_us, ...]``) gets ``when`` as its base time,
    in whole microseconds. Raises ``ValueError`` when the row has no timestamp."""
    if state.startswith(b"["):
        head, _, rest = state.partition(b",")
        _, _, tail = rest.partition(b",")  # the old base time
        micros = int(when.timestamp() * 1_000_000)
        return head + b"," + str(micros).encode() + b"," + tail
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


def row_time(state: bytes) -> float:
    """The time (Unix seconds) a row was stamped with (see ``stamp``): a batch row's base time,
    or an event row's ``"timestamp"``."""
    obj = orjson.loads(state)
    if isinstance(obj, list):
        return float(obj[1]) / 1_000_000
    return dt.datetime.fromisoformat(obj["timestamp"]).timestamp()


class RawFold:
    """The raw baselines' fold: the commit rule applied to stored rows with ``orjson`` and plain
    dicts, no event objects, no checks (no hash chain either). Reads both row formats: a batch
    row is walked item by item by type code and field position (``_codec._rows``'s layout), an
    event row by topic."""

    def __init__(self) -> None:
        from kernel._codec._rows import BATCH_CODES, layouts

        codes = {name: code for code, (name, _) in enumerate(BATCH_CODES)}
        self.staged_code = codes["state_staged"]
        self.committed_code = codes["superstep_committed"]
        self.aborted_code = codes["superstep_aborted"]
        self.key_at = 2 + layouts()[0]["state_staged"].names.index("key")
        self.staged: dict[str, list[tuple[str, Any]]] = {}

    def row(
        self, values: dict[str, Any], last: int, topic: str, state: bytes, upto: int | None = None
    ) -> int:
        """Fold one row's events (those at positions up to ``upto``) into ``values`` (one
        instance's committed state); how many events the row holds."""
        obj = orjson.loads(state)
        staged = self.staged
        if not topic.isdigit():  # an event row
            if upto is not None and last > upto:
                return 1
            if topic.startswith("state_staged"):
                staged.setdefault(obj["superstep_id"], []).append((obj["key"], obj["value"]))
            elif topic.startswith("superstep_committed"):
                for key, value in staged.pop(obj["superstep_id"], ()):
                    values[key] = value
            elif topic.startswith("superstep_aborted"):
                staged.pop(obj["superstep_id"], None)
            return 1
        strings, items = obj[3], obj[4 if obj[0] == 1 else 5 :]  # formats 2 and 3 carry a chain
        if upto is not None and last > upto:
            items = items[: len(items) - (last - upto)]
        key_at = self.key_at
        for item in items:
            code = item[0]
            if code == self.staged_code:  # [code, dt, run, superstep, executor, key, op, value]
                value = item[key_at + 2] if len(item) > key_at + 2 else None
                staged.setdefault(strings[item[3]], []).append((item[key_at], value))
            elif code == self.committed_code:
                for key, value in staged.pop(strings[item[3]], ()):
                    values[key] = value
            elif code == self.aborted_code:
                staged.pop(strings[item[3]], None)
        return int(topic)
