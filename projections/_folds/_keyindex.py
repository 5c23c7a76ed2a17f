"""The key index: where each key's writes are in an instance's stream, and what they depend on.

Blame of one key folds the key's writes through ``KeyBlame`` (and so through the kernel's
committed-state fold, via ``SuperstepTracker``). Which of the other events a key's verdicts
depend on is small and known: the markers and the start of every superstep the key was written
in, the ends of the runs those events belong to, and the instance's fork event. Every other
event changes nothing the fold says about that key's writes (other keys' writes are skipped on
sight, other supersteps' markers only close other supersteps), so folding that subsequence of
the log, in stream order, gives the same answers as folding the whole log; any larger
subsequence does too. ``tests/projections/test_keyindex.py`` checks it against the full fold on
disorderly logs (aborted supersteps, late writes, crashes, forks, deletes).

The index records only *where* those events are (stream positions), never a verdict: verdicts
are always made by folding the events themselves. ``KeyIndexFold`` is the pure fold that builds
the rows of one instance (``KeyIndexView`` in ``projections._views._viewspecs`` keeps them in a view
table, maintained, rebuilt and verified by ``Projector`` like every view):

``k:<key>``
    ``{"n": writes indexed, "tail": [[position, superstep id, run id], ...]}``: the key's latest
    writes (fewer than ``CHUNK``); older ones are sealed in chunks of ``CHUNK``,
``c:<key>|<i>``
    the ``i``-th sealed chunk (``i`` zero-padded to 6 digits), never rewritten,
``s:<superstep id>``
    ``[[position, run id], ...]``: the superstep's ``SuperstepStarted`` and markers,
``r:<run id>``
    the positions of the run's ends (``RUN_END_TYPES``),
``f``
    the positions of the instance's ``InstanceForked`` events,
``t``
    ``{"upto": position}``: the last stream position folded. Events after it are not indexed:
    a reader folds them from the log (the tail), so an index that is behind is never wrong.

``indexed_upto(get)`` and ``relevant_positions(read, keys, upto, tail)`` read those rows (a
few rounds of ``read``, each of many rows) and return the positions to fold for ``keys``;
``windows`` groups them into ranges to read. A write of the keys in the tail (after ``upto``)
depends on indexed events too (its superstep may have been marked, its run ended, before
``upto``), so the tail is read first and its writes' supersteps and runs are looked up as well.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from kernel import (
    RUN_END_TYPES,
    SUPERSTEP_MARKER_TYPES,
    EventBase,
    Fold,
    RunEvent,
    StateStaged,
    SuperstepEvent,
    folds,
)

__all__ = [
    "CHUNK",
    "KeyIndexFold",
    "RowReader",
    "RowsReader",
    "chunk_row",
    "indexed_upto",
    "key_row",
    "one_by_one",
    "relevant_positions",
    "windows",
]

CHUNK = 128
"""Writes per sealed chunk of a key: a page rewrites at most this many entries of a hot key."""
TRACKER_ROW = "t"
FORKS_ROW = "f"

RowReader = Callable[[str], Any]
"""Reads one row of an instance by its key; None when there is none."""
RowsReader = Callable[[list[str]], dict[str, Any]]
"""Reads rows of an instance by their keys: the rows found, by key."""


def key_row(key: str) -> str:
    """The row holding ``key``'s count and latest writes."""
    return f"k:{key}"


def chunk_row(key: str, index: int) -> str:
    """The row of ``key``'s ``index``-th sealed chunk (the key is everything before the last
    ``|``, so any key names its rows unambiguously)."""
    return f"c:{key}|{index:06d}"


def step_row(superstep_id: str) -> str:
    """The row of a superstep's start and markers."""
    return f"s:{superstep_id}"


def run_row(run_id: str) -> str:
    """The row of a run's ends."""
    return f"r:{run_id}"


class KeyIndexFold(Fold):
    """The index rows of one instance, folded from its events (see the module docstring).

    ``load`` reads a stored row (None if missing); rows the fold changes are kept in ``out``
    (what a view writes back), and ``upto`` is the last position folded. No I/O besides ``load``.
    """

    __slots__ = ("_load", "out", "upto")

    def __init__(self, load: RowReader) -> None:
        self._load = load
        self.out: dict[str, Any] = {}
        tracker = load(TRACKER_ROW)
        self.upto = 0 if tracker is None else int(tracker["upto"])

    @staticmethod
    def rows_read(events: Iterable[EventBase]) -> set[str]:
        """The rows folding ``events`` reads (besides what it wrote first): the tracker, and
        the rows of their keys, supersteps, runs and forks."""
        keys = {TRACKER_ROW}
        for event in events:
            if isinstance(event, StateStaged):
                keys.add(key_row(event.key))
            elif event.type == "instance_forked":
                keys.add(FORKS_ROW)
            elif event.type in RUN_END_TYPES and isinstance(event, RunEvent):
                keys.add(run_row(event.run_id))
            elif isinstance(event, SuperstepEvent):
                keys.add(step_row(event.superstep_id))
        return keys

    def _row(self, key: str, empty: Callable[[], Any]) -> Any:
        row = self.out.get(key)
        if row is None:
            row = self._load(key)
            self.out[key] = row = empty() if row is None else row
        return row

    def _saw(self, event: EventBase) -> None:
        self.upto = max(self.upto, event.position)

    @folds("state_staged")
    def _staged(self, event: StateStaged) -> None:
        self._saw(event)
        head = self._row(key_row(event.key), lambda: {"n": 0, "tail": []})
        head["tail"].append([event.position, event.superstep_id, event.run_id])
        head["n"] += 1
        if len(head["tail"]) >= CHUNK:
            self.out[chunk_row(event.key, head["n"] // CHUNK - 1)] = head["tail"]
            head["tail"] = []

    @folds("superstep_started", *SUPERSTEP_MARKER_TYPES)
    def _superstep(self, event: SuperstepEvent) -> None:
        self._saw(event)
        self._row(step_row(event.superstep_id), list).append([event.position, event.run_id])

    @folds(*RUN_END_TYPES)
    def _run_ended(self, event: RunEvent) -> None:
        self._saw(event)
        self._row(run_row(event.run_id), list).append(event.position)

    @folds("instance_forked")
    def _forked(self, event: EventBase) -> None:
        self._saw(event)
        self._row(FORKS_ROW, list).append(event.position)

    def flush(self) -> dict[str, Any]:
        """The rows to write: every row changed since the last flush, and the ``t`` row (how
        far the index has folded)."""
        rows, self.out = self.out, {}
        rows[TRACKER_ROW] = {"upto": self.upto}
        return rows


def indexed_upto(get: RowReader) -> int | None:
    """The last stream position the index has folded for an instance (its ``t`` row, read
    through ``get``); None when the index has not seen the instance."""
    tracker = get(TRACKER_ROW)
    return None if tracker is None else int(tracker["upto"])


def relevant_positions(
    read: RowsReader, keys: Iterable[str], upto: int, tail: Iterable[EventBase] = ()
) -> list[int]:
    """The positions up to ``upto`` that the blame of ``keys`` depends on, sorted, read from an
    instance's index rows through ``read`` in four rounds (key heads and forks, sealed chunks,
    supersteps, runs), so a backend that reads many rows in one statement answers in four.

    ``upto`` is what ``indexed_upto`` returned (read first: rows that grow while they are read,
    a catch-up committing in between, never add a position after it). ``tail`` is the events
    after ``upto`` the caller will fold (other keys' writes may be left out): a write of ``keys``
    there depends on its superstep's start and markers and on its run's ends, which may lie
    before ``upto``, so they are looked up too.
    """
    wanted = set(keys)
    heads = read([*(key_row(key) for key in sorted(wanted)), FORKS_ROW])
    sealed = [
        chunk_row(key, index)
        for key in sorted(wanted)
        if (head := heads.get(key_row(key))) is not None
        for index in range(int(head["n"]) // CHUNK)  # sealed before the head was written
    ]
    writes: list[list[Any]] = [entry for chunk in read(sealed).values() for entry in chunk]
    for key in wanted:
        writes.extend(heads.get(key_row(key), {"tail": ()})["tail"])
    positions = {p for p in heads.get(FORKS_ROW, ()) if p <= upto}
    steps: set[str] = set()
    runs: set[str] = set()
    for position, superstep_id, run_id in writes:
        if position <= upto:
            positions.add(position)
            steps.add(superstep_id)
            runs.add(run_id)
    later = list(tail)
    for event in later:
        if isinstance(event, StateStaged) and event.key in wanted:
            steps.add(event.superstep_id)
            runs.add(event.run_id)
    for event in later:
        if isinstance(event, SuperstepEvent) and event.superstep_id in steps:
            runs.add(event.run_id)
    for entries in read(sorted(step_row(superstep_id) for superstep_id in steps)).values():
        for position, run_id in entries:
            if position <= upto:
                positions.add(position)
                runs.add(run_id)
    for ends in read(sorted(run_row(run_id) for run_id in runs)).values():
        positions.update(p for p in ends if p <= upto)
    return sorted(positions)


def one_by_one(get: RowReader) -> RowsReader:
    """A ``RowsReader`` over a reader of single rows."""

    def read(keys: list[str]) -> dict[str, Any]:
        found = {key: get(key) for key in keys}
        return {key: row for key, row in found.items() if row is not None}

    return read


def windows(positions: Iterable[int], *, gap: int = 16) -> list[tuple[int, int]]:
    """Sorted ``positions`` as inclusive ranges ``(first, last)``; positions at most ``gap``
    apart share a range (one read then serves a superstep's start, writes and marker)."""
    ranges: list[tuple[int, int]] = []
    for position in positions:
        if ranges and position - ranges[-1][1] <= gap:
            ranges[-1] = (ranges[-1][0], position)
        else:
            ranges.append((position, position))
    return ranges
