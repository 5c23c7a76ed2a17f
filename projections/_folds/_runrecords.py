"""The records of run history: ``RunRecord``, ``SuperstepRecord``, ``RequestRecord``,
``ForkRecord``, ``DroppedMessage``, and where a fold keeps them.

Each is the one form of its record: the fold changes it in place, readers get copies
(``copy()``), and a materialized view stores its JSON row (``to_row`` / ``from_row``).
``HistoryRows`` is the sink a ``RunHistory`` keeps its records in; ``MemoryHistoryRows`` keeps
them in dictionaries, a materialized view passes one over its table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from typing import Any, Literal, Protocol, TypeVar

from kernel import ErrorInfo, ProjectionError

__all__ = [
    "STATUS_TEXT",
    "DroppedMessage",
    "ForkRecord",
    "HistoryRows",
    "MemoryHistoryRows",
    "RequestRecord",
    "RunRecord",
    "RunStatus",
    "StepStatus",
    "SuperstepRecord",
    "closer_label",
    "continued",
    "given_up",
    "in_memory",
    "status_text",
    "waiting_status",
]

RunStatus = Literal[
    "running",
    "completed",
    "failed",
    "cancelled",
    "abandoned",
    "crashed",
    "awaiting_input",
    "answered",
    "continued",
    "superseded",
]
StepStatus = Literal["open", "committed", "aborted"]

STATUS_TEXT: dict[str, str] = {
    "awaiting_input": "waiting for input",
    "answered": "answered: resume() continues",
}
"""How a run status reads where it is shown to a person (the CLI's tables, the UI); a status not
named here reads as it is."""


def status_text(status: str) -> str:
    """``status`` as a person reads it (``STATUS_TEXT``)."""
    return STATUS_TEXT.get(status, status)


def _time(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def _time_text(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def _error(tree: dict[str, Any] | None) -> ErrorInfo | None:
    return None if tree is None else ErrorInfo.model_validate(tree)


def _error_tree(error: ErrorInfo | None) -> dict[str, Any] | None:
    return None if error is None else error.model_dump(mode="json")


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """A request for input that counts (its superstep committed): ``request_id``, the executor
    that asked, the ``response_type`` it named, ``data`` (the request as a wire JSON tree), and
    the superstep it was made in."""

    request_id: str
    executor_id: str
    response_type: str
    data: Any
    superstep_id: str

    def to_row(self) -> dict[str, Any]:
        """The record as a JSON row."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> RequestRecord:
        """The record of a row written by ``to_row``."""
        return cls(**{f.name: row[f.name] for f in fields(cls)})


@dataclass(frozen=True, slots=True)
class ForkRecord:
    """Instance ``instance_id`` was forked from ``origin_instance`` as of its stream position
    ``origin_position``; ``checkpoint`` is the origin's last committed superstep there (of run
    ``origin_run``), ``forked_at`` the time of the fork's ``InstanceForked`` event."""

    instance_id: str
    origin_instance: str
    origin_position: int
    checkpoint: str | None
    origin_run: str | None
    forked_at: datetime

    def to_row(self) -> dict[str, Any]:
        """The record as a JSON row."""
        row = {f.name: getattr(self, f.name) for f in fields(self)}
        row["forked_at"] = self.forked_at.isoformat()
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> ForkRecord:
        """The record of a row written by ``to_row``."""
        values = {f.name: row[f.name] for f in fields(cls)}
        values["forked_at"] = datetime.fromisoformat(row["forked_at"])
        return cls(**values)


@dataclass(frozen=True, slots=True)
class DroppedMessage:
    """A message no edge delivered, dropped as ``MessageStaged.dropped`` recorded: who sent it,
    the ``target`` it named (if any), the ``reason`` (a ``kernel.DropReason``), the message as a
    wire JSON tree, and the stream position of its ``MessageStaged``."""

    source: str
    target: str | None
    reason: str
    message: Any
    position: int

    def to_row(self) -> dict[str, Any]:
        """The record as a JSON row."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> DroppedMessage:
        """The record of a row written by ``to_row``."""
        return cls(**{f.name: row[f.name] for f in fields(cls)})


def _dropped_rows(dropped: tuple[DroppedMessage, ...]) -> list[dict[str, Any]]:
    return [drop.to_row() for drop in dropped]


def _dropped(rows: list[dict[str, Any]]) -> tuple[DroppedMessage, ...]:
    return tuple(DroppedMessage.from_row(row) for row in rows)


def _requests_rows(requests: list[RequestRecord]) -> list[dict[str, Any]]:
    return [request.to_row() for request in requests]


def _requests(rows: list[dict[str, Any]]) -> list[RequestRecord]:
    return [RequestRecord.from_row(row) for row in rows]


# How a field goes into a record's JSON row and back: (to the row, from the row).
_Codec = tuple[Callable[[Any], Any], Callable[[Any], Any]]
_CODECS: dict[str, _Codec] = {
    "index": (_same, int),
    "start_position": (_same, int),
    "supersteps": (_same, int),
    "committed": (_same, int),
    "aborted": (_same, int),
    "started_at": (datetime.isoformat, datetime.fromisoformat),
    "ended_at": (_time_text, _time),
    "error": (_error_tree, _error),
    "executors": (list, tuple),
    "failed_executors": (list, tuple),
    "keys": (list, tuple),
    "outputs": (list, tuple),
    "requests": (list, tuple),
    "events": (list, tuple),
    "responses": (list, list),
    "pending_requests": (_requests_rows, _requests),
    "dropped": (_dropped_rows, _dropped),
}
_ADDED = frozenset({"dropped", "events"})
"""Fields added to a record after views first stored its rows: an older row lacks them, and the
record then has the field's default."""
_PLAIN: _Codec = (_same, _same)
R = TypeVar("R")
M = TypeVar("M")


def in_memory(rows: object, kind: type[M], fold: str) -> M:
    """``rows`` as the in-memory sink ``kind``; a fold whose rows live in a view's table is read
    from that view, so asking the fold itself is a ``ProjectionError``."""
    if not isinstance(rows, kind):
        raise ProjectionError(f"this {fold} keeps its rows in a view: read it from the view")
    return rows


def _row_codecs(cls: type, *leave_out: str) -> tuple[tuple[str, _Codec], ...]:
    """The fields of ``cls`` that its row keeps (all but ``leave_out``), in order, with codecs."""
    return tuple(
        (f.name, _CODECS.get(f.name, _PLAIN)) for f in fields(cls) if f.name not in leave_out
    )


def _to_row(record: Any, codecs: tuple[tuple[str, _Codec], ...]) -> dict[str, Any]:
    return {name: encode(getattr(record, name)) for name, (encode, _) in codecs}


def _from_row(cls: type[R], row: dict[str, Any], codecs: tuple[tuple[str, _Codec], ...]) -> R:
    return cls(
        **{
            name: decode(row[name])
            for name, (_, decode) in codecs
            if name in row or name not in _ADDED
        }
    )


@dataclass(slots=True)
class SuperstepRecord:
    """One superstep: ``status`` is ``open``, ``committed`` or ``aborted`` (``reason`` says why).

    ``executors`` are the executors invoked, in order; ``failed_executors`` those that failed;
    ``keys`` the keys written (staged, whether or not they counted), in first-write order;
    ``outputs`` the outputs yielded before the marker (delivered only if ``committed``);
    ``requests`` the ids of the requests for input it made (they count only if ``committed``);
    ``events`` the types of the custom events its executors added (``ctx.add_event``), in order
    (delivered only if ``committed``); ``dropped`` the messages it sent that no edge delivered
    (``DroppedMessage``; dropped only if ``committed``: an aborted superstep's messages are inert
    anyway). ``start_position`` is the stream position of its ``superstep_started``,
    ``position`` that of its marker (None while open).
    """

    superstep_id: str
    run_id: str
    index: int
    started_at: datetime
    start_position: int
    status: StepStatus = "open"
    reason: str | None = None
    error: ErrorInfo | None = None
    ended_at: datetime | None = None
    position: int | None = None
    # Tuples, not lists: a history holds a record per superstep, and most of these stay empty
    # (one shared empty tuple instead of four lists each).
    executors: tuple[str, ...] = ()
    failed_executors: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()
    outputs: tuple[Any, ...] = ()
    requests: tuple[str, ...] = ()
    events: tuple[str, ...] = ()
    dropped: tuple[DroppedMessage, ...] = ()

    def copy(self) -> SuperstepRecord:
        """An independent copy."""
        return replace(self)

    def to_row(self) -> dict[str, Any]:
        """The record as a JSON row."""
        return _to_row(self, _STEP_ROW)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> SuperstepRecord:
        """The record of a row written by ``to_row``."""
        return _from_row(cls, row, _STEP_ROW)


@dataclass(slots=True)
class RunRecord:
    """One run: its ``status``, times, number of supersteps started, committed outputs, error.

    ``outputs`` are wire JSON trees of the outputs of committed supersteps, in order (decode them
    with ``ValueCodec().decode``). ``closed_by`` says who closed an abandoned or crashed run: the
    run that did, or ``recover`` (``recover@HOLDER`` since it names the lease holder it closed it
    as); its ``error`` then says what happened (``type`` the status).
    ``start_position`` is the stream position of its ``run_started``.

    Lineage: a run that continues another names it in ``continues`` and the committed superstep
    it went on from in ``checkpoint`` (None: that run's beginning; the continued run may be in
    the instance this one was forked from); ``continued_by`` lists the runs of this instance that
    continue it. A run that stopped waiting for input and was continued (answered, or resumed)
    no longer waits: its status is ``continued`` (see ``continued``), and the runs it is
    continued by say how it went on. ``pending_requests`` are the requests it made that count
    and that no response has answered yet (status ``awaiting_input`` when it stopped waiting for
    them), while they can still be answered: a later run that continues nothing (started with
    ``supersede_requests=True``) drops them, and the run that was waiting for them is then
    ``superseded``; ``responses``
    the ids of the requests whose responses this run recorded. A run that recorded responses and
    ended waiting without committing a superstep (``record_response``'s, ``steplog respond``'s:
    nothing executed) waits for nothing: its status is ``answered`` (see ``waiting_status``)
    until the run that delivers the responses (``resume()``) continues it.

    ``dropped`` are the messages its committed supersteps sent that no edge delivered, in order
    (``DroppedMessage``).

    ``outputs``, ``superstep_ids``, ``continued_by`` and ``dropped`` follow from the other
    records, so its row leaves them out.
    """

    run_id: str
    workflow_name: str
    started_at: datetime
    start_position: int
    status: RunStatus = "running"
    ended_at: datetime | None = None
    supersteps: int = 0
    committed: int = 0
    aborted: int = 0
    error: ErrorInfo | None = None
    closed_by: str | None = None
    continues: str | None = None
    checkpoint: str | None = None
    pending_requests: list[RequestRecord] = field(default_factory=list)
    responses: list[str] = field(default_factory=list)
    outputs: list[Any] = field(default_factory=list)
    superstep_ids: list[str] = field(default_factory=list)
    continued_by: list[str] = field(default_factory=list)
    dropped: list[DroppedMessage] = field(default_factory=list)

    def copy(self) -> RunRecord:
        """An independent copy (its lists are new)."""
        return replace(
            self,
            dropped=list(self.dropped),
            pending_requests=list(self.pending_requests),
            responses=list(self.responses),
            outputs=list(self.outputs),
            superstep_ids=list(self.superstep_ids),
            continued_by=list(self.continued_by),
        )

    def to_row(self) -> dict[str, Any]:
        """The record as a JSON row, without the derived ``outputs``, ``superstep_ids``,
        ``continued_by`` and ``dropped``."""
        return _to_row(self, _RUN_ROW)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> RunRecord:
        """The record of a row written by ``to_row`` (the derived lists empty)."""
        return _from_row(cls, row, _RUN_ROW)


def closer_label(closed_by: str, width: int = 8) -> str:
    """``RunRecord.closed_by`` as a table shows it: a run id cut to ``width``; ``recover`` (and
    the lease holder it closed the run as) whole."""
    return closed_by if closed_by.startswith("recover") else closed_by[:width]


_STOPPED_FOR_INPUT = frozenset({"awaiting_input", "answered"})
"""The statuses of a run that stopped for input (waiting for it, or holding responses for the
next ``resume()``): the ones a later run changes (``continued``, ``superseded``)."""


def waiting_status(run: RunRecord) -> RunStatus:
    """The status of ``run`` as it ends waiting for input (``RunAwaitingInput``): ``answered``
    if it recorded responses and committed no superstep (nothing executed: the responses wait
    for ``resume()``, as the kernel's ``PendingRequestsError`` says), else ``awaiting_input``."""
    return "answered" if run.responses and run.committed == 0 else "awaiting_input"


def continued(run: RunRecord, by: str) -> None:
    """Record that run ``by`` continues ``run``: ``by`` joins its ``continued_by``, and a run
    that stopped for input (waiting, or ``answered``) no longer waits (status ``continued``). A
    run that ended otherwise (failed, crashed, ...) keeps that status: it is what happened to
    it."""
    if by not in run.continued_by:
        run.continued_by.append(by)
    if run.status in _STOPPED_FOR_INPUT:
        run.status = "continued"


def given_up(run: RunRecord) -> None:
    """Record that a run that continues nothing started after ``run``: if it stopped for input,
    what it waited for (or the responses it held) was given up (``supersede_requests=True``),
    so it waits no more (status ``superseded``)."""
    if run.status in _STOPPED_FOR_INPUT:
        run.status = "superseded"


_STEP_ROW = _row_codecs(SuperstepRecord)
_RUN_ROW = _row_codecs(RunRecord, "outputs", "superstep_ids", "continued_by", "dropped")


class HistoryRows(Protocol):
    """Where a ``RunHistory`` keeps its records: the fold finds, adds and changes them in place."""

    def run(self, run_id: str) -> RunRecord | None:
        """The record of ``run_id``, or None."""

    def step(self, superstep_id: str) -> SuperstepRecord | None:
        """The record of ``superstep_id``, or None."""

    def add_run(self, record: RunRecord) -> None:
        """Keep a new run record."""

    def add_step(self, record: SuperstepRecord) -> None:
        """Keep a new superstep record."""


class MemoryHistoryRows:
    """``HistoryRows`` in dictionaries, in start order: what ``RunHistory`` reads from."""

    __slots__ = ("runs", "steps")

    def __init__(self) -> None:
        self.runs: dict[str, RunRecord] = {}
        self.steps: dict[str, SuperstepRecord] = {}

    def run(self, run_id: str) -> RunRecord | None:
        return self.runs.get(run_id)

    def step(self, superstep_id: str) -> SuperstepRecord | None:
        return self.steps.get(superstep_id)

    def add_run(self, record: RunRecord) -> None:
        self.runs[record.run_id] = record

    def add_step(self, record: SuperstepRecord) -> None:
        self.steps[record.superstep_id] = record
