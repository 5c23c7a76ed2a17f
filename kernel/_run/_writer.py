"""A run's log writer: the run's next events, stamped and buffered, appended as atomic batches.

``RunLog`` gives each event its position (after the stream's ``version``) and time, and keeps it
in ``buffer`` until ``flush`` appends the buffer as one batch through the instance's
``RunnerContext``; in "write" durability (``write_through``) every event is appended as it is
made. A superstep's closing goes in with its events (``flush_closing``, ``flush_commit``); when
the store cannot encode that batch, its events are appended one by one, leaving out what cannot
be stored, and the closing again. A step's record goes in at once (``append_now``).
``unfinished_closing`` is what closes a run found unfinished.

Where the store has a group commit, ``flush_commit`` and ``append_now`` hand their batch to it
and await it, so that the event loop is free during the fsync and batches of many runs share one.
A run has at most one batch in flight (its ``_Flight``): the next one is made after it lands, of
everything buffered meanwhile (the records of the run's other steps that finished meanwhile go in
together), and a synchronous ``flush`` waits for it first (``Pending.settle_now``). Positions are
given as events are made, counting the batch in flight. If a batch of records fails, nothing of it
is in the log: its records, and the records waiting behind it, are dropped (each of their steps
raises the store's error), and the staged events of both stay buffered, renumbered.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kernel._base._errors import EncodingError, ExecutionError
from kernel._log._events import (
    AbortReason,
    EventBase,
    RunAbandoned,
    StepRecorded,
    SuperstepAborted,
    trusted_event,
)

if TYPE_CHECKING:
    from kernel._run._instance import RunnerContext
    from kernel._store._group import Pending

__all__ = ["RunLog", "unfinished_closing"]


@dataclass(slots=True, eq=False)
class _Flight:
    """A batch of the run in the store's group commit, after stream version ``base``; ``records``
    if it was made for step records (``append_now``), not for a closing."""

    pending: Pending
    batch: list[EventBase]
    base: int
    records: bool
    done: bool = False


def _appended_now(event: EventBase) -> bool:
    """Whether ``event`` is a step's record appended at once (a served call's note is staged)."""
    return isinstance(event, StepRecorded) and event.reused is None


class RunLog:
    """The events of run ``run_id`` on their way to its instance's log.

    ``version`` is the stream's version the next batch goes after (counting the batch in flight,
    if any); ``buffer`` the events made and not yet appended; ``write_through`` whether every
    event is appended as it is made.
    """

    def __init__(self, instance: RunnerContext, run_id: str) -> None:
        self.instance = instance
        self.run_id = run_id
        self.buffer: list[EventBase] = []
        self.version = 0
        self.write_through = instance.durability == "write"
        self._clock = instance.clock
        self._instance_id = instance.instance_id
        self._flight: _Flight | None = None
        self._drops = 0  # how many times records waiting to be appended were dropped
        self._dropped: BaseException | None = None  # why, the last time

    def log(self, cls: type[EventBase], **fields: Any) -> None:
        """Create the next event of this run; append it now in "write" durability."""
        fields["run_id"] = self.run_id
        self.log_for(cls, fields)
        if self.write_through:
            self.flush()

    def head(self, cls: type[EventBase], superstep_id: str) -> dict[str, Any]:
        """The fields every event of ``cls`` in superstep ``superstep_id`` of this run has alike,
        in declared order, with position and time left for ``record`` to set. A superstep makes
        its heads once; each event is then one dict, ``{**head, <its own fields>}``."""
        return {
            **_envelope(cls),
            "instance_id": self._instance_id,
            "position": 0,
            "timestamp": None,
            "run_id": self.run_id,
            "superstep_id": superstep_id,
        }

    def record(self, cls: type[EventBase], data: dict[str, Any]) -> None:
        """``log`` on a superstep's hot path: ``data`` holds every field of the event (from a
        ``head``) but its position and time, which are set here. It becomes the event's own."""
        self._stamp(cls, data)
        if self.write_through:
            self.flush()

    async def append_now(self, cls: type[EventBase], data: dict[str, Any]) -> int | None:
        """``record`` an event (a step's record) and append it at once, with what is buffered
        before it (whatever the durability; through the store's group commit where it has one):
        its position, once it is durable. None if it went in with a closing appended meanwhile
        (the run is ending). If the append fails, the store's error is raised and the event is
        dropped, but what was buffered before it stays buffered: a superstep's staged events
        still go in with its closing, as if nothing had been tried.

        Cancelling this does not take the record back: its batch's outcome is awaited first,
        then the cancellation unwinds."""
        self._stamp(cls, data)
        mine = self.buffer[-1]
        drops = self._drops
        cancels = 0
        try:
            while True:
                flight = self._flight
                if flight is None:
                    if self._drops != drops:  # a batch ahead of it failed: it was dropped
                        assert self._dropped is not None
                        raise self._dropped
                    if not any(event is mine for event in self.buffer):
                        return None  # appended with a closing (``flush``)
                    batch, self.buffer = self.buffer, []
                    try:
                        flight = self._launch(batch, records=True)
                    except BaseException as refused:
                        self._drop(batch, refused)
                        raise
                    if flight is None:  # appended at once
                        return mine.position
                cancels += await self._outcome(flight)
                if any(event is mine for event in flight.batch):
                    failed = flight.pending.future.exception()
                    if failed is not None:
                        raise failed
                    return mine.position
        finally:
            if cancels:
                raise asyncio.CancelledError

    def flush(self) -> None:
        """Append the buffered events as one atomic batch (dropped if the append fails)."""
        if not self.buffer:
            return
        flight = self._flight
        if flight is not None:  # it goes in first (this blocks the loop until it is decided)
            flight.pending.settle_now()
            self._landed(flight)
        batch, self.buffer = self.buffer, []
        self.instance.append(batch, expected_version=self.version)
        self.version += len(batch)

    def flush_closing(
        self, opened: int, reclose: Callable[[EncodingError], None] | None = None
    ) -> EncodingError | None:
        """Append the buffer: the superstep's events before index ``opened``, then its closing.

        If the store cannot encode the batch, append the superstep's events one at a time (leaving
        out those it cannot encode), then the closing again, or what ``reclose(error)`` logs.
        Returns the encoding error in that case, None when the batch went in whole.
        """
        batch = self.buffer
        try:
            self.flush()
        except EncodingError as error:
            return self._reflush(batch, opened, reclose, error)
        return None

    async def flush_commit(
        self, opened: int, reclose: Callable[[EncodingError], None]
    ) -> tuple[EncodingError | None, int]:
        """``flush_closing`` for a superstep's commit batch, through the store's group commit
        where it has one. Returns the encoding error (as ``flush_closing``) and how many times
        this task was cancelled while the batch was in flight: the batch cannot be taken back,
        so its outcome is awaited first, and the caller records it before the cancellation
        unwinds (or withdraws it: ``_commit``)."""
        cancels = 0
        flight = self._flight
        if flight is not None:  # a step's record on its way: the closing goes after it
            cancels += await self._outcome(flight)
        batch, self.buffer = self.buffer, []
        try:
            flight = self._launch(batch, records=False)
        except EncodingError as error:
            return self._reflush(batch, opened, reclose, error), cancels
        if flight is not None:
            cancels += await self._outcome(flight)
            failed = flight.pending.future.exception()
            if failed is not None:
                if cancels:
                    raise asyncio.CancelledError  # nothing landed: unwind as the cancellation
                raise failed
        return None, cancels

    def _launch(self, batch: list[EventBase], *, records: bool) -> _Flight | None:
        """Hand ``batch`` (the buffer, taken) to the store: appended at once (None), or queued
        for its group commit (the run's flight). What the store refuses before queuing, or
        appending at once, is raised (the version unchanged)."""
        pending = self.instance.append_commit(batch, expected_version=self.version)
        base = self.version
        self.version += len(batch)
        if pending is None:
            return None
        flight = _Flight(pending, batch, base, records)
        self._flight = flight
        pending.future.add_done_callback(lambda _: self._landed(flight))
        return flight

    async def _outcome(self, flight: _Flight) -> int:
        """Wait until ``flight`` is decided; how many times this task was cancelled meanwhile
        (the batch cannot be taken back, so its outcome comes first)."""
        future = flight.pending.future
        cancels = 0
        while not future.done():
            try:
                await asyncio.shield(future)
            except asyncio.CancelledError:
                cancels += int(not future.cancelled())  # ours, not the batch's
            except Exception:  # the batch failed: the caller reads it from the future
                break
        self._landed(flight)
        return cancels

    def _landed(self, flight: _Flight) -> None:
        """``flight`` is decided: no longer in flight. If it failed, nothing of it is in the log:
        the version goes back, and a batch of records is dropped (``_drop``); the events made
        after a closing's batch take its positions."""
        if flight.done:
            return
        flight.done = True
        if self._flight is flight:
            self._flight = None
        future = flight.pending.future
        failed = None if future.cancelled() else future.exception()
        if future.cancelled() or failed is not None:
            self.version = flight.base
            if flight.records:
                self._drop(flight.batch, failed or asyncio.CancelledError())
            else:
                self._renumber(self.buffer)

    def _drop(self, batch: list[EventBase], error: BaseException) -> None:
        """``batch`` (of step records) did not go in: it and what was buffered behind it go back
        to the buffer but the records, which are dropped (their steps raise ``error``)."""
        self._drops += 1
        self._dropped = error
        self._renumber([e for e in [*batch, *self.buffer] if not _appended_now(e)])

    def _renumber(self, events: list[EventBase]) -> None:
        """Buffer ``events`` at the positions after ``version``."""
        version = self.version
        self.buffer = [
            event
            if event.position == version + i
            else event.model_copy(update={"position": version + i})
            for i, event in enumerate(events, 1)
        ]

    def _reflush(
        self,
        batch: list[EventBase],
        opened: int,
        reclose: Callable[[EncodingError], None] | None,
        refused: EncodingError,
    ) -> EncodingError:
        """After the store refused to encode ``batch``: its superstep's events one at a time
        (those it can encode), then the closing again, or what ``reclose(refused)`` logs."""
        for event in batch[:opened]:
            self.buffer = [event.model_copy(update={"position": self.version + 1})]
            with contextlib.suppress(EncodingError):
                self.flush()
        self.buffer = []
        if reclose is not None:
            reclose(refused)
        else:
            for event in batch[opened:]:
                position = self.version + len(self.buffer) + 1
                self.buffer.append(event.model_copy(update={"position": position}))
        self.flush()
        return refused

    def log_for(self, cls: type[EventBase], fields: dict[str, Any]) -> None:
        """Buffer the next event of the stream (of this run, or of a run this one closes)."""
        data = {
            **_envelope(cls),
            "instance_id": self._instance_id,
            "position": 0,
            "timestamp": None,
            **fields,
        }
        self._stamp(cls, data)

    def _stamp(self, cls: type[EventBase], data: dict[str, Any]) -> None:
        """Give ``data`` the next position and the time, and buffer it as an event of ``cls``.

        The runner's own fields are trusted, so the event is constructed without re-validation
        (the store's mapper validates on the way back); only the injected clock is checked.
        ``data`` starts with the envelope, so a caller that gives every other field of ``cls``
        hands ``trusted_event`` a complete set, which it takes as the event's own without filling
        in defaults: that is every event of a superstep's hot path.
        """
        timestamp = self._clock()
        if timestamp.tzinfo is None:
            raise ExecutionError(f"the workflow's clock returned a naive datetime: {timestamp!r}")
        data["position"] = self.version + len(self.buffer) + 1
        data["timestamp"] = timestamp
        event = trusted_event(cls, data)
        self.buffer.append(event if event is not None else cls.model_validate(data))


@functools.cache
def _envelope(cls: type[EventBase]) -> dict[str, Any]:
    """The fields every event of ``cls`` has alike: its ``type`` and ``schema_version``."""
    fields = cls.model_fields
    return {"type": fields["type"].default, "schema_version": fields["schema_version"].default}


def unfinished_closing(
    run_id: str, superstep_id: str | None, reason: AbortReason, closed_by: str | None
) -> list[tuple[type[EventBase], dict[str, Any]]]:
    """The events that close a run found unfinished: its open superstep's abort, and its end.

    ``closed_by`` is who closes it: the run that does, or ``recover@`` and its lease holder.
    """
    closing: list[tuple[type[EventBase], dict[str, Any]]] = []
    if superstep_id is not None:
        closing.append(
            (
                SuperstepAborted,
                {"run_id": run_id, "superstep_id": superstep_id, "reason": reason},
            )
        )
    ended = "crashed" if reason == "crashed" else "abandoned"
    closing.append(
        (
            RunAbandoned,
            {
                "run_id": run_id,
                "reason": ended,
                "superstep_id": superstep_id,
                "closed_by": closed_by,
            },
        )
    )
    return closing
