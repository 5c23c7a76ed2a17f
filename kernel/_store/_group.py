"""Group commit: appends made concurrently on one store share one database commit.

A run in ``"superstep"`` durability hands its commit batch (the superstep's events, its
``SuperstepCommitted`` marker and what follows it) to the store's ``GroupCommitter`` and awaits it.
One committer thread per store takes every batch that is waiting, appends them in one transaction
(``EventStore.append_prepared``: each batch still checked against its own expected version), and
answers each waiting run on its own event loop. While that commit's fsync runs, the event loop is
free: other instances compute their supersteps, and their batches wait for the next commit. So one
fsync serves every superstep that is ready, and none is acknowledged before it is durable.

Nothing here decides anything about a batch: the encoding and the checks happen in the caller
(``EventStore.prepare``), before the batch is queued, so a refused batch never reaches a shared
transaction; a version conflict fails only its own batch; a store error fails the batches of that
one transaction, each with the same error, and nothing of them is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from kernel._base._errors import ConcurrencyConflictError, StoreUnavailableError
from kernel._store._records import Prepared

__all__ = ["Appender", "GroupCommitter", "Pending"]


class Appender(Protocol):
    """What a ``GroupCommitter`` appends through (an ``EventStore``)."""

    url: str

    def append_prepared(
        self, batches: Sequence[Prepared]
    ) -> list[list[int] | ConcurrencyConflictError]:
        """Append the batches in one transaction; each one's global positions, or its conflict."""
        ...


IDLE_SECONDS = 0.5
"""How long the committer thread waits for a batch before it ends."""


@dataclass(slots=True, eq=False)
class Pending:
    """A batch in the queue: where to answer, and what to run first on the caller's loop.

    ``future`` is answered on the caller's loop. ``settle_now`` is for a caller on that loop that
    cannot await (a run closing itself from synchronous code): it blocks until the committer has
    decided the batch, and answers ``future`` at once, so that what follows is appended after it.
    """

    batch: Prepared
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[list[int]]
    landed: Callable[[], None]
    decided: threading.Condition
    """Notified (all) by the committer after each round; ``outcome`` is set under it."""
    outcome: list[int] | BaseException | None = None

    def settle_now(self) -> None:
        """Wait (blocking) for the batch's outcome and answer ``future`` with it."""
        with self.decided:
            self.decided.wait_for(lambda: self.outcome is not None)
        assert self.outcome is not None
        _settle(self, self.outcome)


class GroupCommitter:
    """Appends batches for many runs of one process to one store, one transaction per round.

    Thread-safe; the committer thread starts with the first batch, ends after ``IDLE_SECONDS``
    without one, and stops when the store is closed (``close``). ``EventStore.group_committer()``
    shares one per store. The committer refers to its store weakly: an idle one never keeps a
    store (and its connections) alive.
    """

    def __init__(self, store: Appender) -> None:
        self._store = weakref.ref(store)
        self._url = store.url
        self._queue: list[Pending] = []
        self._ready = threading.Condition()
        self._decided = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.rounds = 0
        """Transactions committed so far (for tests and benchmarks: batches / rounds is the
        number of supersteps one fsync served)."""
        self.batches = 0

    def submit(
        self, batch: Prepared, landed: Callable[[], None] = lambda: None
    ) -> asyncio.Future[list[int]]:
        """``enqueue``'s future."""
        return self.enqueue(batch, landed).future

    def enqueue(self, batch: Prepared, landed: Callable[[], None] = lambda: None) -> Pending:
        """Queue ``batch``; its ``Pending``, whose future (of the running loop) is answered with
        its global positions.

        ``landed`` runs on the caller's loop once the batch is in the log, before the future is
        resolved. The future fails with the batch's ``ConcurrencyConflictError`` or the store's
        error. Cancelling the future does not take the batch back: await it with
        ``asyncio.shield`` and learn its outcome.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[int]] = loop.create_future()
        with self._ready:
            if self._closed:
                raise StoreUnavailableError(f"cannot append: the store {self._url} is closed")
            pending = Pending(batch, loop, future, landed, self._decided)
            self._queue.append(pending)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._commit_rounds, name="steplog-group-commit", daemon=True
                )
                self._thread.start()
            self._ready.notify()
        return pending

    def close(self) -> None:
        """Commit what is queued, then stop the thread."""
        with self._ready:
            self._closed = True
            self._ready.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _commit_rounds(self) -> None:
        while True:
            with self._ready:
                # Idle for IDLE_SECONDS: the thread ends (the next batch starts another), so that
                # it never keeps an unused store, and its connections, alive. The queue is looked
                # at under the lock after the wait, so a batch queued as the wait times out is
                # committed, never stranded.
                if not self._ready.wait_for(lambda: self._queue or self._closed, IDLE_SECONDS):
                    self._thread = None
                    return
                if not self._queue:
                    self._thread = None
                    return
                waiting, self._queue = self._queue, []
            store = self._store()
            try:
                if store is None:
                    raise StoreUnavailableError(f"cannot append: the store {self._url} is gone")
                outcomes: list[list[int] | BaseException] = list(
                    store.append_prepared([w.batch for w in waiting])
                )
            except BaseException as error:  # the transaction failed: every batch of it did
                outcomes = [error, *(_another(error) for _ in waiting[1:])]
            del store
            self.rounds += 1
            self.batches += len(waiting)
            with self._decided:
                for entry, outcome in zip(waiting, outcomes, strict=True):
                    entry.outcome = outcome
                self._decided.notify_all()
            for entry, outcome in zip(waiting, outcomes, strict=True):
                # A closed loop raises RuntimeError: nobody is waiting there any more.
                with contextlib.suppress(RuntimeError):
                    entry.loop.call_soon_threadsafe(_settle, entry, outcome)


def _settle(entry: Pending, outcome: list[int] | BaseException) -> None:
    """On the caller's loop: run ``landed`` for a batch that is in the log, then answer."""
    if entry.future.done():
        return
    if isinstance(outcome, BaseException):
        entry.future.set_exception(outcome)
        return
    try:
        entry.landed()
    except BaseException as error:  # the batch is in the log; the run learns what failed after
        entry.future.set_exception(error)
        return
    entry.future.set_result(outcome)


def _another(error: BaseException) -> BaseException:
    """A copy of ``error`` for another run (each raises its own, with its own traceback), caused
    by the one ``error``."""
    try:
        twin = copy.copy(error)
    except Exception:
        return error
    twin.__cause__ = error
    twin.__traceback__ = None
    return twin
