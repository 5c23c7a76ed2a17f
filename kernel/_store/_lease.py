"""Leases: one writer per workflow instance, across processes.

A lease is a row in the store (``EventStore.acquire_lease`` and friends): the instance, its holder
(``host:pid/token``) and when it expires. A process that advances an instance takes its lease with
a ``LeaseKeeper`` and renews it by a heartbeat while its run is active, so that a second process
that wants the same instance is refused (``RunInProgressError``) rather than racing it.

A lease is taken over, never stolen: only when it has expired, or when its holder's process is
provably gone (``presumed_reason`` of its ``host:pid`` is ``crashed``). The takeover is a
compare-and-set on the exact lease the keeper read, so of several processes taking over the same
dead lease exactly one wins.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

from kernel._base._clock import system_clock
from kernel._base._errors import ExecutionError, RunInProgressError, StoreConfigError, StoreError
from kernel._store._owner import presumed_reason

__all__ = ["Lease", "LeaseKeeper", "LeaseStore", "from_micros", "lease_expiry", "to_micros"]

_log = logging.getLogger(__name__)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Lease:
    """Who may advance ``instance_id`` until ``expires`` (aware, UTC, whole microseconds)."""

    instance_id: str
    holder: str
    expires: datetime

    @property
    def owner(self) -> str:
        """The holder's process, ``host:pid`` (the holder without its ``/token``)."""
        owner, slash, _ = self.holder.rpartition("/")
        return owner if slash else self.holder

    def expired(self, now: datetime) -> bool:
        """Whether the lease has run out at ``now``."""
        return now >= self.expires


class LeaseStore(Protocol):
    """What a ``LeaseKeeper`` keeps its lease in (an ``EventStore``)."""

    stranded_leases: dict[str, str]
    """Leases a keeper of this store could not give back: instance id -> holder."""

    def acquire_lease(
        self,
        instance_id: str,
        holder: str,
        *,
        ttl: float,
        now: datetime,
        replace: Lease | None = None,
    ) -> Lease | None:
        """The lease taken (free, ``holder``'s, or exactly ``replace``), or None."""
        ...

    def renew_lease(
        self, instance_id: str, holder: str, *, ttl: float, now: datetime
    ) -> Lease | None:
        """The lease extended, or None when it is no longer ``holder``'s."""
        ...

    def release_lease(self, instance_id: str, holder: str) -> None:
        """Delete the lease if ``holder`` has it."""
        ...

    def read_lease(self, instance_id: str) -> Lease | None:
        """The lease on ``instance_id``, or None."""
        ...


def to_micros(moment: datetime) -> int:
    """``moment`` (aware) as whole microseconds since the Unix epoch: how stores keep expiries."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise StoreConfigError(f"a lease time must be timezone-aware, got naive {moment!r}")
    return (moment - _EPOCH) // timedelta(microseconds=1)


def from_micros(micros: int) -> datetime:
    """The aware UTC moment ``micros`` microseconds after the Unix epoch."""
    return _EPOCH + timedelta(microseconds=micros)


def lease_expiry(now: datetime, ttl: float) -> datetime:
    """``now + ttl`` seconds, in UTC and whole microseconds (exactly what a store keeps)."""
    return from_micros(to_micros(now) + round(_checked_ttl(ttl) * 1_000_000))


def _checked_ttl(ttl: float) -> float:
    if not (isinstance(ttl, int | float) and math.isfinite(ttl) and ttl > 0):
        raise StoreConfigError(f"a lease ttl must be a positive number of seconds, got {ttl!r}")
    return float(ttl)


def _hex_token() -> str:
    return uuid.uuid4().hex


class LeaseKeeper:
    """Takes, renews and releases one instance's lease for this process.

    ``holder`` is ``owner + "/" + token()``, unique per keeper. ``acquire`` takes the lease (or
    raises ``RunInProgressError`` when a live holder keeps it for longer than ``wait`` seconds),
    ``start_heartbeat`` renews it every ``ttl / 3`` seconds while a run is active, and ``release``
    gives it back.

    Example::

        keeper = LeaseKeeper(store, "order-7", owner=process_owner())
        taken_over = await keeper.acquire()  # True: abort the previous holder's open superstep
        keeper.start_heartbeat(on_lost=cancel_the_run)
        try:
            ...  # advance the instance
        finally:
            await keeper.release()
    """

    def __init__(
        self,
        store: LeaseStore,
        instance_id: str,
        *,
        owner: str,
        ttl: float = 30.0,
        wait: float = 0.0,
        clock: Callable[[], datetime] = system_clock,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        token: Callable[[], str] = _hex_token,
        poll: float | None = None,
    ) -> None:
        """``poll`` is the pause between tries while waiting (default: ``ttl / 10``, between
        0.05 and 1 second)."""
        if not (math.isfinite(wait) and wait >= 0):
            raise StoreConfigError(f"a lease wait must be >= 0 seconds, got {wait!r}")
        if poll is not None and not (math.isfinite(poll) and poll > 0):
            raise StoreConfigError(f"a lease poll interval must be > 0 seconds, got {poll!r}")
        self.store = store
        self.instance_id = instance_id
        self.ttl = _checked_ttl(ttl)
        self.wait = float(wait)
        self.holder = f"{owner}/{token()}"
        """Who holds the lease while this keeper has it: ``owner/token``, unique per keeper."""
        self.lease: Lease | None = None
        """The lease as last taken or renewed; ``None`` before ``acquire`` and after ``release``."""
        self.taken_over: Lease | None = None
        """The lease ``acquire`` took over (expired, or its holder gone), for the caller to log."""
        self._clock = clock
        self._sleep = sleep
        self._poll = poll if poll is not None else min(max(self.ttl / 10, 0.05), 1.0)
        self._heartbeat: asyncio.Task[None] | None = None

    # -- taking -------------------------------------------------------------------------------

    async def acquire(self) -> bool:
        """Take the lease; ``True`` if it was taken over from a holder whose process is gone or
        whose lease had expired (the caller then aborts that holder's open superstep as
        ``crashed``), ``False`` if it was free (or already this keeper's).

        Raises ``RunInProgressError`` naming the holder and its expiry when a live holder keeps
        the lease for ``wait`` seconds (``wait=0``: at once). While waiting it polls, sleeping
        between tries. Store errors propagate (``StoreError``).
        """
        waited = 0.0
        while True:
            try:
                return self.try_acquire()
            except RunInProgressError:
                if waited >= self.wait:
                    raise
            pause = min(self._poll, self.wait - waited)
            await self._sleep(pause)
            waited += pause

    def try_acquire(self) -> bool:
        """One attempt at ``acquire``, without waiting: the same answers, at once."""
        current = self.store.read_lease(self.instance_id)
        now = self._clock()
        if current is not None and self._stranded(current):
            lease = self.store.acquire_lease(
                self.instance_id, self.holder, ttl=self.ttl, now=now, replace=current
            )
            if lease is not None:
                self.store.stranded_leases.pop(self.instance_id, None)
                _log.info(
                    "took back the lease on %r that %s could not release", self.instance_id,
                    current.holder,
                )  # fmt: skip
                return self._took(lease, None)  # not a crash: that run ended in this process
        if current is None or current.holder == self.holder:
            lease = self.store.acquire_lease(self.instance_id, self.holder, ttl=self.ttl, now=now)
            if lease is not None:
                return self._took(lease, None)
        elif self._may_take_over(current, now):
            lease = self.store.acquire_lease(
                self.instance_id, self.holder, ttl=self.ttl, now=now, replace=current
            )
            if lease is not None:
                return self._took(lease, current)
        raise self._in_progress(self.store.read_lease(self.instance_id) or current)

    def _stranded(self, current: Lease) -> bool:
        """Whether ``current`` is a lease a keeper of this store could not give back (its run
        has ended in this process; ``EventStore.stranded_leases``)."""
        return self.store.stranded_leases.get(self.instance_id) == current.holder

    def _may_take_over(self, current: Lease, now: datetime) -> bool:
        if current.expired(now):
            return True
        return presumed_reason(current.owner) == "crashed"

    def _took(self, lease: Lease, previous: Lease | None) -> bool:
        self.lease = lease
        self.taken_over = previous
        if previous is not None:
            _log.warning(
                "took over the lease on %r from %s (expires %s): %s",
                self.instance_id,
                previous.holder,
                previous.expires.isoformat(),
                "expired" if previous.expired(self._clock()) else "its process is gone",
            )
        return previous is not None

    def _in_progress(self, current: Lease | None) -> RunInProgressError:
        if current is None:  # released just now, and taken by no one yet: say so plainly
            return RunInProgressError(
                f"instance {self.instance_id!r} is being taken by another process; retry, or "
                "pass a wait time to wait for it"
            )
        expires = current.expires.isoformat()
        return RunInProgressError(
            f"instance {self.instance_id!r} is being run by {current.holder}, whose lease "
            f"expires at {expires} unless renewed; wait for that run to finish, or pass a wait "
            f"time (waited {self.wait:g} s)",
            holder=current.holder,
            expires=current.expires,
        )

    # -- keeping ------------------------------------------------------------------------------

    def start_heartbeat(self, on_lost: Callable[[], None]) -> None:
        """Renew the lease every ``ttl / 3`` seconds in an asyncio task, until ``release``.

        When a renewal finds the lease gone to another holder, ``on_lost()`` is called once and
        the heartbeat stops. A renewal that fails with a ``StoreError`` is logged and retried at
        the next beat (while the store is unreachable, no one else can take the lease either).
        """
        if self.lease is None:
            raise ExecutionError(
                f"no lease on instance {self.instance_id!r} to keep; call acquire() first"
            )
        if self._heartbeat is not None and not self._heartbeat.done():
            return
        self._heartbeat = asyncio.get_running_loop().create_task(
            self._beat(on_lost), name=f"lease heartbeat {self.instance_id}"
        )

    async def _beat(self, on_lost: Callable[[], None]) -> None:
        while True:
            await self._sleep(self.ttl / 3)
            try:
                lease = self.store.renew_lease(
                    self.instance_id, self.holder, ttl=self.ttl, now=self._clock()
                )
            except StoreError as error:
                _log.warning("could not renew the lease on %r: %s", self.instance_id, error)
                continue
            if lease is not None:
                self.lease = lease
                continue
            self.lease = None
            _log.warning("lost the lease on %r to another holder", self.instance_id)
            try:
                on_lost()
            except Exception:
                _log.exception("on_lost for the lease on %r failed", self.instance_id)
            return

    def release_now(self) -> None:
        """``release`` without waiting for the heartbeat task to finish (it is cancelled): for a
        run that has just recorded its end and may still be handing events to its consumer."""
        task, self._heartbeat = self._heartbeat, None
        self.lease = None
        if task is not None and not task.done():
            # Thread-safe: a dropped stream's finalizer may call this from another thread.
            with contextlib.suppress(RuntimeError):  # its loop is closed: nothing to stop
                task.get_loop().call_soon_threadsafe(task.cancel)
        self._give_back()

    def _give_back(self) -> None:
        """Delete the lease if it is still ours; a store error is logged (it then expires)."""
        try:
            self.store.release_lease(self.instance_id, self.holder)
        except StoreError as error:
            # Stranded: the next keeper of this store takes it back rather than wait out its ttl.
            self.store.stranded_leases[self.instance_id] = self.holder
            _log.warning(
                "could not release the lease on %r (this process takes it back on its next run; "
                "other processes wait for it to expire): %s",
                self.instance_id,
                error,
            )
        else:
            if self.store.stranded_leases.get(self.instance_id) == self.holder:
                del self.store.stranded_leases[self.instance_id]

    async def release(self) -> None:
        """Stop the heartbeat and give the lease back (only if still ours). Never raises a
        ``StoreError``: one is logged, and the lease then simply expires."""
        task, self._heartbeat = self._heartbeat, None
        self.lease = None
        try:
            if task is not None and task is not asyncio.current_task():
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    current = asyncio.current_task()
                    if current is not None and current.cancelling():
                        raise  # release itself is being cancelled, not just the heartbeat
                except Exception:
                    _log.exception("the lease heartbeat on %r failed", self.instance_id)
        finally:
            self._give_back()

    def __repr__(self) -> str:
        return f"LeaseKeeper({self.instance_id!r}, holder={self.holder!r})"
