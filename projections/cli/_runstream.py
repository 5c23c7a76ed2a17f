"""``steplog runs``, streamed: each run of an instance as soon as it has ended, folded by the
projections' run history window by window, in memory that does not grow with the log.

A run's status, times, superstep counts, error, lineage (``continues``, ``checkpoint``, and
``continued_by``, found by a first pass over the run starts), responses and ``closed_by`` are
final once its end is folded; its superstep records are then
dropped (``_PassingRows``), and the run is printed. Runs of an instance are sequential (one
lease holder at a time), so printing them as they end keeps start order. A run still open at the
end of the log is printed last, as ``running``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Set
from typing import Any

from kernel import EventStore, RunStarted
from projections import MemoryHistoryRows, RunHistory, RunRecord
from projections._folds._runrecords import continued, given_up
from projections._frontend._ids import events_of

__all__ = ["continuations", "run_row", "stream_history", "stream_runs", "with_continuations"]


class _PassingRows(MemoryHistoryRows):
    """``HistoryRows`` that forget a run (and its supersteps) once it was printed."""

    __slots__ = ()

    def forget(self, run: RunRecord) -> None:
        self.runs.pop(run.run_id, None)
        for superstep_id in run.superstep_ids:
            self.steps.pop(superstep_id, None)


def stream_runs(store: EventStore, instance_id: str) -> Iterator[RunRecord]:
    """The runs of ``instance_id`` in start order, each as soon as it has ended, with the runs
    that continue it (``continuations``, found first: they come later in the log)."""
    later, superseded = _starts(store, instance_id)
    rows = _PassingRows()
    fold = RunHistory(rows)
    started: deque[str] = deque()
    for event in events_of(store, instance_id, RunHistory.EVENT_TYPES):
        fold.apply(event)
        if event.type == "run_started":
            run_id = getattr(event, "run_id", "")
            if run_id in rows.runs and run_id not in started:
                started.append(run_id)
        while started:
            run = rows.runs.get(started[0])
            if run is None or run.status == "running":
                break
            started.popleft()
            rows.forget(run)
            yield with_continuations(run, later, superseded)
    for run_id in started:
        run = rows.runs.get(run_id)
        if run is not None:
            yield with_continuations(run, later, superseded)


def with_continuations(
    run: RunRecord, later: dict[str, list[str]], superseded: Set[str] = frozenset()
) -> RunRecord:
    """``run`` as the whole history folds it: continued by the runs ``later`` names, and
    ``superseded`` if it is one of ``superseded`` (followed by a run that continues nothing)."""
    for run_id in later.get(run.run_id, ()):
        continued(run, run_id)
    if run.run_id in superseded:
        given_up(run)
    return run


def continuations(store: EventStore, instance_id: str) -> dict[str, list[str]]:
    """The runs continuing each run of ``instance_id`` (``RunRecord.continued_by``, as the run
    history folds it), from its run starts alone (found by their rows' bytes)."""
    return _starts(store, instance_id)[0]


def _starts(store: EventStore, instance_id: str) -> tuple[dict[str, list[str]], set[str]]:
    """From the run starts of ``instance_id`` alone (found by their rows' bytes): the runs
    continuing each run, and the runs followed by a run that continues nothing (which gives up
    what they waited for)."""
    seen: set[str] = set()
    found: dict[str, list[str]] = {}
    followed: set[str] = set()
    last: str | None = None
    for event in store.find_events(instance_id, ("run_started",)):
        if not isinstance(event, RunStarted) or event.run_id in seen:
            continue
        seen.add(event.run_id)
        if event.continues is None:
            if last is not None:
                followed.add(last)
        elif event.continues in seen:
            later = found.setdefault(event.continues, [])
            if event.run_id not in later:
                later.append(event.run_id)
        last = event.run_id
    return found, followed


def stream_history(store: EventStore, history: RunHistory, instance_id: str) -> Iterator[RunRecord]:
    """Fold the events of ``instance_id`` into ``history`` window by window, and yield each run
    as soon as it has ended (then in start order those still open): ``history`` is complete
    once the iterator is. A run yielded is final but for ``continued_by``
    (``continuations`` gives it)."""
    started: deque[str] = deque()
    seen: set[str] = set()
    for event in events_of(store, instance_id, RunHistory.EVENT_TYPES):
        history.apply(event)
        if isinstance(event, RunStarted) and event.run_id not in seen:
            seen.add(event.run_id)
            started.append(event.run_id)
        while started:
            run = history.run(started[0])
            if run is None or run.status == "running":
                break
            started.popleft()
            yield run
    for run_id in started:
        run = history.run(run_id)
        if run is not None:
            yield run


def run_row(run: RunRecord, instance_id: str) -> dict[str, Any]:
    """A run as ``runs --json`` prints it: what is final once the run has ended."""
    row = run.to_row()
    row.pop("pending_requests", None)
    return {"instance_id": instance_id, **row, "continued_by": list(run.continued_by)}
