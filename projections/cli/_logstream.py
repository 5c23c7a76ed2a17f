"""``steplog log``, streamed: the events of an instance window by window, each write with the
verdict of the blame fold, in memory that does not grow with the log.

Whether a write counts is known once its superstep is decided (its first marker, or its run's
end), and so is whether a dropped message (``MessageStaged.dropped``) was dropped: the fold's
tracker says how each superstep was decided. The fold (``KeyBlame``) is fed every event as it
is read; an event is shown as soon as it and every event before it are decided, so only the
events of undecided supersteps wait. The fold keeps its records in a ``_PassingRows``, which
forgets a record once shown.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterator

from kernel import (
    RUN_END_TYPES,
    SUPERSTEP_MARKER_TYPES,
    EventBase,
    EventStore,
    MessageStaged,
    StateStaged,
    SuperstepEvent,
)
from projections import BLAME_TYPES, KeyBlame, SensitiveKeys, WriteRecord, WriteStatus
from projections._folds._tracker import Outcome

__all__ = ["LOG_WINDOW", "stream_log"]

LOG_WINDOW = 1000
"""Stream positions read per window."""


class _PassingRows:
    """``WriteRows`` that forget a record once it was shown: a later change to it (a committed
    write superseded by a newer one) goes to a scratch record, since the line is out already."""

    __slots__ = ("by_position", "forked")

    def __init__(self) -> None:
        self.by_position: dict[int, WriteRecord] = {}
        self.forked: dict[str, WriteRecord] = {}

    def add(self, record: WriteRecord) -> None:
        if record.origin_instance is not None:
            self.forked[record.key] = record
        else:
            self.by_position[record.position] = record

    def get(self, position: int) -> WriteRecord:
        found = self.by_position.get(position)
        return found if found is not None else _scratch()

    def get_forked(self, position: int, key: str) -> WriteRecord:
        found = self.forked.get(key)
        return found if found is not None else _scratch()

    def status(self, position: int) -> WriteStatus | None:
        found = self.by_position.get(position)
        return None if found is None else found.status

    def forget(self, position: int) -> None:
        self.by_position.pop(position, None)


def _scratch() -> WriteRecord:
    return WriteRecord.model_construct(status="committed")


def stream_log(
    store: EventStore,
    instance_id: str,
    redact: SensitiveKeys,
    *,
    run: str | None = None,
    superstep: str | None = None,
    types: Collection[str] = (),
    start: int = 1,
    limit: int | None = None,
    window: int = LOG_WINDOW,
) -> Iterator[tuple[EventBase, WriteStatus | None]]:
    """The events of ``instance_id`` (redacted by ``redact``) that pass the filters, in order,
    each with its write status (None for an event that is neither a write nor a dropped message).
    A dropped message's status is its superstep's fate: ``committed`` (it was dropped),
    ``aborted`` (inert, as everything of its superstep) or ``pending``. The fold sees every event
    it needs, filtered or not, so a verdict is the same as in ``blame``."""
    rows = _PassingRows()
    fold = KeyBlame(rows=rows)
    wanted = frozenset(types)
    read_types = (wanted | BLAME_TYPES) if wanted else ()
    held: dict[str, list[int]] = {}  # superstep id -> positions of its dropped messages shown
    fates: dict[int, WriteStatus] = {}  # position of a dropped message -> its superstep's fate
    version = store.version(instance_id)
    waiting: deque[EventBase] = deque()
    shown = 0

    def shows(event: EventBase) -> bool:
        if event.position < start or (wanted and event.type not in wanted):
            return False
        if run is not None and getattr(event, "run_id", None) != run:
            return False
        return superstep is None or (
            isinstance(event, SuperstepEvent) and event.superstep_id == superstep
        )

    after = 0
    while after < version:
        for event in store.read(instance_id, after=after, upto=after + window, types=read_types):
            fold.apply(event)
            if shows(event):
                waiting.append(event)
                if isinstance(event, MessageStaged) and event.dropped is not None:
                    held.setdefault(event.superstep_id, []).append(event.position)
            if held and (event.type in SUPERSTEP_MARKER_TYPES or event.type in RUN_END_TYPES):
                _decide(fold.last_outcome, event, held, fates)
        after += window
        while waiting:
            head = waiting[0]
            if isinstance(head, StateStaged):
                status = rows.status(head.position)
            elif isinstance(head, MessageStaged) and head.dropped is not None:
                status = fates.pop(head.position, "pending")
            else:
                status = None
            if status == "pending" and after < version:
                break  # its superstep is not decided yet: read on
            waiting.popleft()
            rows.forget(head.position)
            (event,) = redact.events([head])
            yield event, status
            shown += 1
            if limit is not None and shown >= limit:
                return
        if not waiting:
            rows.by_position = {p: r for p, r in rows.by_position.items() if r.status == "pending"}


def _decide(
    outcome: Outcome, event: EventBase, held: dict[str, list[int]], fates: dict[int, WriteStatus]
) -> None:
    """Record the fate of the dropped messages whose superstep ``event`` decided."""
    if outcome.kind in ("committed", "aborted") and isinstance(event, SuperstepEvent):
        for position in held.pop(event.superstep_id, ()):
            fates[position] = outcome.kind
    elif outcome.kind == "run_ended":
        for superstep_id in outcome.unmarked:
            for position in held.pop(superstep_id, ()):
                fates[position] = "aborted"
