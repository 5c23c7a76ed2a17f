"""A run's log writer: the run's next events, stamped and buffered, appended as atomic batches.

``RunLog`` gives each event its position (after the stream's ``version``) and time, and keeps it
in ``buffer`` until ``flush`` appends the buffer as one batch through the instance's
``RunnerContext``; in "write" durability (``write_through``) every event is appended as it is
made. A superstep's closing goes in with its events (``flush_closing``, ``flush_commit``); when
the store cannot encode that batch, its events are appended one by one, leaving out what cannot
be stored, and the closing again. ``unfinished_closing`` is what closes a run found unfinished.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kernel._base._errors import EncodingError, ExecutionError
from kernel._log._events import (
    AbortReason,
    EventBase,
    RunAbandoned,
    SuperstepAborted,
    trusted_event,
)

if TYPE_CHECKING:
    from kernel._run._instance import RunnerContext

__all__ = ["RunLog", "unfinished_closing"]


class RunLog:
    """The events of run ``run_id`` on their way to its instance's log.

    ``version`` is the stream's version the next batch goes after; ``buffer`` the events made
    and not yet appended; ``write_through`` whether every event is appended as it is made.
    """

    def __init__(self, instance: RunnerContext, run_id: str) -> None:
        self.instance = instance
        self.run_id = run_id
        self.buffer: list[EventBase] = []
        self.version = 0
        self.write_through = instance.durability == "write"
        self._clock = instance.clock
        self._instance_id = instance.instance_id

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

    def append_now(self, cls: type[EventBase], data: dict[str, Any]) -> int:
        """``record`` an event and append it at once, with what is buffered before it (whatever
        the durability); its position. If the append fails, the store's error is raised and the
        event is dropped, but what was buffered before it stays buffered: a superstep's staged
        events still go in with its closing, as if nothing had been tried."""
        before = list(self.buffer)
        self._stamp(cls, data)
        try:
            self.flush()
        except BaseException:
            self.buffer = before
            raise
        position: int = data["position"]
        return position

    def flush(self) -> None:
        """Append the buffered events as one atomic batch (dropped if the append fails)."""
        if not self.buffer:
            return
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
        batch, self.buffer = self.buffer, []
        try:
            pending = self.instance.append_commit(batch, expected_version=self.version)
        except EncodingError as error:
            return self._reflush(batch, opened, reclose, error), 0
        cancels = 0
        if pending is not None:
            try:
                await asyncio.shield(pending)
            except asyncio.CancelledError:
                cancels = 1
                while not pending.done():
                    try:
                        await asyncio.wait((pending,))
                    except asyncio.CancelledError:
                        cancels += 1
                if pending.exception() is not None:
                    raise  # nothing landed: unwind as the cancellation it is
        self.version += len(batch)
        return None, cancels

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
