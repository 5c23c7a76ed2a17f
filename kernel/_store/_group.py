"""Group commit: appends made concurrently on one store share one database commit.

A run in ``"superstep"`` durability hands its commit batch (the superstep's events, its
``SuperstepCommitted`` marker and what follows it) to the store's ``GroupCommitter`` and awaits it.
Each round takes every batch that is waiting and appends them in one transaction
(``EventStore.append_prepared``: each batch still checked against its own expected version), so
one fsync serves every superstep that is ready, and none is acknowledged before it is durable.

Who commits a round:

* **The caller's event loop, when the committer is idle** (no round in flight). The first batch
  queued schedules a *leader* on its loop (``loop.call_soon``); the leader runs after the tasks
  that were ready with it have had their turn, so every batch those tasks made meanwhile (other
  instances on the loop, a run's other steps) goes in the same round. The leader commits inline,
  on the loop's thread, and answers the batches of its loop directly: a lone instance pays no
  hand-off to another thread (its wake-up, the answer through the loop's self-pipe), which cost
  more than the statements. The loop is blocked for the round, as it is for the superstep's own
  CPU and for ``durability="write"``'s appends. A batch that a leader would find alone (nothing
  queued, no round in flight, nothing else ready on the loop) is committed at once by its caller
  (``commit_alone``), without the leader's turns of the loop.
* **The committer thread, otherwise**: a batch queued while a round is in flight (from another
  thread's loop) is taken by the thread once that round ends, and answered on its own loop
  (``call_soon_threadsafe``). When inline rounds are slow (over ``INLINE_LIMIT`` on a moving
  average: a slow disk, a lock held by another process), the rounds of the next
  ``THREAD_SECONDS`` go to the thread, which keeps the loops free during the fsync; then the loop
  tries again.

Nothing here decides anything about a batch: the encoding and the checks happen in the caller
(``EventStore.prepare``), before the batch is queued, so a refused batch never reaches a shared
transaction; a version conflict fails only its own batch; a store error fails the batches of that
one transaction (and only those), each with the same error, and nothing of them is written.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from time import monotonic
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

INLINE_LIMIT = 0.005
"""Inline rounds that take longer than this (seconds), on a moving average, send the rounds of
the next ``THREAD_SECONDS`` to the thread."""

THREAD_SECONDS = 1.0


@dataclass(slots=True, eq=False)
class Pending:
    """A batch in the queue: where to answer, and what to run first on the caller's loop.

    ``future`` is answered on the caller's loop. ``settle_now`` is for a caller on that loop that
    cannot await (a run closing itself from synchronous code): it decides the batch at once (it
    leads the round itself when none is in flight), or blocks until it is decided, and answers
    ``future``, so that what follows is appended after it.
    """

    batch: Prepared
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[list[int]]
    landed: Callable[[], None]
    committer: GroupCommitter
    outcome: list[int] | BaseException | None = None

    def settle_now(self) -> None:
        """Decide the batch (blocking) and answer ``future`` with its outcome."""
        self.committer.decide(self)
        assert self.outcome is not None
        _settle(self, self.outcome)


class GroupCommitter:
    """Appends batches for many runs of one process to one store, one transaction per round.

    Thread-safe. Rounds are led inline by the caller's loop while the committer is idle, and by
    the committer thread when a round is in flight or inline rounds are slow (see the module's
    docstring); the thread starts when needed, ends after ``IDLE_SECONDS`` without a batch, and
    stops when the store is closed (``close``). ``EventStore.group_committer()`` shares one per
    store. The committer refers to its store weakly: an idle one never keeps a store (and its
    connections) alive.
    """

    def __init__(self, store: Appender) -> None:
        self._store = weakref.ref(store)
        self._url = store.url
        self._queue: list[Pending] = []
        self._ready = threading.Condition()
        """Guards the queue and the round's state; notified when either changes."""
        self._decided = threading.Condition()
        self._thread: threading.Thread | None = None
        self._busy = False
        """A round is in flight (inline or in the thread)."""
        self._leaders: set[asyncio.AbstractEventLoop] = set()
        """The loops where a leader is scheduled."""
        self._closed = False
        self.inline = True
        """Whether rounds may be led inline by the caller's loop (False: every round goes to
        the thread, as before inline rounds existed; tests and benchmarks set it)."""
        self._seconds = 0.0
        """The moving average of an inline round's time."""
        self._thread_until = 0.0
        """Until then (``time.monotonic``), rounds go to the thread, which keeps the loops free:
        the inline rounds were slow (a slow disk, a lock held by another process)."""
        self.rounds = 0
        """Transactions committed so far (for tests and benchmarks: batches / rounds is the
        number of supersteps one fsync served)."""
        self.batches = 0
        self.inline_rounds = 0
        """Of ``rounds``, those led inline on a caller's loop."""

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
            pending = Pending(batch, loop, future, landed, self)
            self._queue.append(pending)
            if self._busy or not self.inline or monotonic() < self._thread_until:
                self._wake_thread()
            elif loop not in self._leaders:
                self._leaders.add(loop)
                loop.call_soon(self._lead, loop)
        return pending

    def commit_alone(self, batch: Prepared) -> list[int] | None:
        """Commit ``batch`` at once, in a round of its own led by the caller, when a leader would
        find it alone: no round in flight, nothing queued, rounds led inline, and nothing else
        ready to run on the caller's event loop. Its global positions; None when it cannot go
        alone (queue it: ``enqueue``). Raises its ``ConcurrencyConflictError`` or the store's
        error, as ``EventStore.append`` does.

        A lone run appends so without the leader's turns of the loop (the leader's callback, the
        answer, the task's wake-up). Whether anything else is ready is read from asyncio's own
        queue of ready callbacks (``BaseEventLoop._ready``); a loop without one (uvloop) always
        queues."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return None
        runnable = getattr(loop, "_ready", None)
        if not isinstance(runnable, collections.deque) or runnable:
            return None
        with self._ready:
            if self._closed:
                raise StoreUnavailableError(f"cannot append: the store {self._url} is closed")
            if self._queue or self._busy or not self.inline or loop in self._leaders:
                return None
            if monotonic() < self._thread_until:
                return None
            self._busy = True
        outcomes, failure = self._append([batch], inline=True)
        if failure is not None:
            raise failure
        (outcome,) = outcomes
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def decide(self, entry: Pending) -> None:
        """Block until ``entry`` is decided: lead its round now if none is in flight, else wait
        for the round that holds it (or the thread's next one)."""
        with self._ready:
            waiting = None
            mine = any(w is entry for w in self._queue)
            if entry.outcome is None and mine and not self._busy and self.inline:
                waiting = self._take()
            elif entry.outcome is None:
                self._wake_thread()
        if waiting is not None:
            self._round(waiting)
        with self._decided:
            self._decided.wait_for(lambda: entry.outcome is not None)

    def close(self) -> None:
        """Commit what is queued, then stop the thread."""
        with self._ready:
            self._closed = True
            if self._queue:
                self._wake_thread()
            self._ready.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        with self._ready:  # an inline round of another thread's loop, still in flight
            self._ready.wait_for(lambda: not self._busy)

    def _wake_thread(self) -> None:
        """(Under ``_ready``.) Have the thread take the queue: start it if it is not running."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._commit_rounds, name="steplog-group-commit", daemon=True
            )
            self._thread.start()
        self._ready.notify_all()

    def _take(self) -> list[Pending]:
        """(Under ``_ready``.) The queued batches, for a round that starts now."""
        waiting, self._queue = self._queue, []
        self._busy = True
        return waiting

    def _lead(self, loop: asyncio.AbstractEventLoop) -> None:
        """On ``loop``, after the tasks that were ready: commit what is queued, inline, unless a
        round is in flight (the thread then takes it after that one)."""
        with self._ready:
            self._leaders.discard(loop)
            if not self._queue:
                return
            if self._busy or not self.inline or monotonic() < self._thread_until:
                self._wake_thread()
                return
            waiting = self._take()
        self._round(waiting, inline=True)

    def _commit_rounds(self) -> None:
        def ready() -> bool:
            return not self._busy and (bool(self._queue) or self._closed)

        while True:
            with self._ready:
                # Idle for IDLE_SECONDS: the thread ends (the next batch starts another, or is
                # led inline), so that it never keeps an unused store, and its connections,
                # alive. The queue is looked at under the lock after the wait, so a batch queued
                # as the wait times out is committed, never stranded; a batch queued during a
                # round in flight is taken by whoever ends it (``_round`` wakes the thread).
                if not self._ready.wait_for(ready, IDLE_SECONDS) or not self._queue:
                    self._thread = None
                    return
                waiting = self._take()
            self._round(waiting)

    def _round(self, waiting: list[Pending], *, inline: bool = False) -> None:
        """Commit ``waiting`` in one transaction and answer each batch; ends the round."""
        outcomes, failure = self._append([w.batch for w in waiting], inline=inline)
        with self._decided:
            for entry, outcome in zip(waiting, outcomes, strict=True):
                entry.outcome = outcome
            self._decided.notify_all()
        try:
            here: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        for entry, outcome in zip(waiting, outcomes, strict=True):
            if entry.loop is here:
                _settle(entry, outcome)
                continue
            # A closed loop raises RuntimeError: nobody is waiting there any more.
            with contextlib.suppress(RuntimeError):
                entry.loop.call_soon_threadsafe(_settle, entry, outcome)
        if failure is not None and threading.current_thread() is not self._thread:
            raise failure  # in a caller's thread; the committer thread goes on with its rounds

    def _append(
        self, batches: list[Prepared], *, inline: bool
    ) -> tuple[list[list[int] | BaseException], BaseException | None]:
        """The round's transaction: each batch's outcome, and an interrupt (not an ``Exception``)
        that failed it, to raise once every batch is answered. Ends the round."""
        store = self._store()
        started = monotonic()
        failure: BaseException | None = None
        try:
            if store is None:
                raise StoreUnavailableError(f"cannot append: the store {self._url} is gone")
            outcomes: list[list[int] | BaseException] = list(store.append_prepared(batches))
        except BaseException as error:  # the transaction failed: every batch of it did
            outcomes = [error, *(_another(error) for _ in batches[1:])]
            if not isinstance(error, Exception):
                failure = error  # an interrupt in the leader's thread goes on after the answers
        del store
        with self._ready:
            self._busy = False
            self.rounds += 1
            self.batches += len(batches)
            if inline:
                self.inline_rounds += 1
                self._seconds += (monotonic() - started - self._seconds) / 8
                if self._seconds > INLINE_LIMIT:
                    self._seconds = 0.0
                    self._thread_until = monotonic() + THREAD_SECONDS
            if self._queue:
                self._wake_thread()
            else:
                self._ready.notify_all()
        return outcomes, failure


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
