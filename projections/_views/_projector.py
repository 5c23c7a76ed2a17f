"""Materialized views with tracking: catch-up, follow, rebuild and verify.

A ``Projector`` keeps views (``state``, ``history``, ``blame``, ``snapshots``, ``keyindex``, or
your own ``ViewSpec``) in tables next to the event store. ``catch_up()`` reads the global log in
pages; each page is folded and written with the view's new position in one transaction, after
checking that the position is still the one the page was read from. A crash mid-page rolls the
page back, and two projectors on one view never fold an event twice: every event is processed
exactly once.

``follow(stop)`` keeps catching up until ``stop`` is set, and ``run_follower(url, names, stop)``
does it in a process of its own (for PostgreSQL: one projection process for many workflow
processes). ``rebuild(name)`` refolds a view into a shadow table and swaps it in at the end, in one
transaction; until then readers see the old view, and an interrupted rebuild leaves it intact.
``verify(name)`` refolds in memory and reports every row that differs; it writes nothing.

Beside writers and each other. A rebuild holds a lock on its shadow table for as long as it uses
it, shared by every process on the database
(``ViewBackend.lock``): a second rebuild of the same view waits for the first to finish, up to
``lock_wait`` seconds, then fails with ``ProjectionError`` saying that another rebuild is running.
Catch-ups need no such lock (their claims keep them exactly-once). A follower never stops for
contention: when the database stays locked past its busy timeout, or the server cannot be reached
(``StoreUnavailableError``), ``follow`` waits, with exponential backoff and jitter (tenacity), and
tries again until it is stopped; any other error stops it, a missing or damaged store
(``StoreNotFoundError``, ``StoreDamagedError``) included.

Example::

    projector = Projector(store)
    projector.catch_up()
    print(projector.state("order-42"))
    print(projector.history("order-42").runs())
    assert projector.verify("blame").ok
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    wait_exponential,
    wait_random,
)

from kernel import (
    EventBase,
    EventStore,
    ProjectionError,
    Recorded,
    StoreDamagedError,
    StoreNotFoundError,
    StoreUnavailableError,
    open_store,
)
from projections._folds._blame import KeyBlame
from projections._folds._history import ForkRecord, RunHistory
from projections._views._backend_for import backend_for
from projections._views._backends import MemoryViewBackend, RowKey, ViewBackend, ViewTx
from projections._views._manifest import (
    MANIFEST_KEY,
    Anchor,
    check_anchor,
    checked_rows,
    update_manifests,
)
from projections._views._snapshots import SnapshotView
from projections._views._viewspecs import (
    DOC_KEY,
    BlameView,
    HistoryView,
    KeyIndexView,
    StateView,
    ViewSpec,
)

__all__ = ["VIEW_NAMES", "Projector", "VerifyReport", "default_views", "run_follower"]

VIEW_NAMES = ("state", "history", "blame", "snapshots", "keyindex")

RetryReport = Callable[[StoreUnavailableError, float], None]
"""Told by ``follow`` of each retry: the error, and the seconds it waits before the next try."""


def default_views(names: Iterable[str] = VIEW_NAMES, *, snapshot_every: int = 50) -> list[ViewSpec]:
    """The built-in views named in ``names``."""
    made: dict[str, ViewSpec] = {
        "state": StateView(),
        "history": HistoryView(),
        "blame": BlameView(),
        "snapshots": SnapshotView(snapshot_every),
        "keyindex": KeyIndexView(),
    }
    unknown = sorted(set(names) - made.keys())
    if unknown:
        raise ProjectionError(f"unknown views {unknown}; the views are {list(VIEW_NAMES)}")
    return [made[name] for name in names]


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """The outcome of ``verify``: rows only in the live view, only in the rebuilt one, or
    different in both (``different`` maps a row to ``(live, rebuilt)``), and ``log_end`` when
    the log ends before the view's position. True when they agree."""

    view: str
    position: int
    log_end: int | None = None
    """Where the log ends, when that is before ``position``: events the view folded were
    removed from the log's end (None when the log reaches the view's position)."""
    only_live: list[RowKey] = field(default_factory=list)
    only_rebuilt: list[RowKey] = field(default_factory=list)
    different: dict[RowKey, tuple[Any, Any]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.log_end is None and not (self.only_live or self.only_rebuilt or self.different)

    def __bool__(self) -> bool:
        return self.ok


class Projector:
    """Maintains materialized views of ``store`` (see the module docstring).

    ``views`` are ``ViewSpec`` objects or names of built-in views (all of them by default);
    ``backend`` is where the tables live (by default the store's own database); each page holds
    at most ``page_size`` events. ``rebuild`` and ``verify`` wait up to ``lock_wait`` seconds for
    another rebuild (or verify) of the same view to finish.
    """

    def __init__(
        self,
        store: EventStore,
        views: Sequence[ViewSpec | str] = VIEW_NAMES,
        *,
        page_size: int = 500,
        backend: ViewBackend | None = None,
        snapshot_every: int = 50,
        lock_wait: float = 60.0,
    ) -> None:
        if page_size < 1:
            raise ProjectionError(f"page_size must be >= 1, got {page_size}")
        if lock_wait < 0:
            raise ProjectionError(f"lock_wait must be >= 0 seconds, got {lock_wait}")
        self.lock_wait = lock_wait
        self.store = store
        self.backend = backend or backend_for(store)
        self.page_size = page_size
        self.views: dict[str, ViewSpec] = {}
        for view in views:
            spec = (
                default_views([view], snapshot_every=snapshot_every)[0]
                if isinstance(view, str)
                else view
            )
            self.views[spec.name] = spec

    def _spec(self, name: str) -> ViewSpec:
        spec = self.views.get(name)
        if spec is None:
            raise ProjectionError(f"this projector has no view {name!r}; it has {list(self.views)}")
        return spec

    # -- tracking -----------------------------------------------------------------------------

    def position(self, name: str) -> int:
        """The last global position folded into view ``name``."""
        return self.backend.position(self._spec(name).table)

    def catch_up(self, *, upto: int | None = None) -> int:
        """Fold every event not yet in each view (up to global position ``upto``); returns how
        many events were folded, summed over the views."""
        return sum(self._catch_up(spec, spec.table, upto) for spec in self.views.values())

    def _catch_up(
        self,
        spec: ViewSpec,
        table: str,
        upto: int | None,
        progress: Callable[[int, int], None] | None = None,
        *,
        backend: ViewBackend | None = None,
    ) -> int:
        backend = backend or self.backend
        backend.ensure(table)  # a view's table is made by its first catch-up, not by a reader
        done = 0
        while True:
            position = backend.position(table)
            # Everything up to the horizon is scanned by the time a page comes back short, even
            # when the view reads only some event types: the position then moves to the horizon.
            horizon = self.store.last_position()
            if upto is not None:
                horizon = min(horizon, upto)
            if position >= horizon:
                return done
            page = self.store.read_all(
                after=position, limit=self.page_size, upto=horizon, types=spec.event_types
            )
            complete = len(page) < self.page_size
            anchors = self._anchors(page)
            with backend.transaction() as tx:
                if not tx.claim(table, position):
                    continue  # another projector folded this page first: read on from its position
                if page:
                    self._fold_page(spec, tx, table, page, anchors)
                tx.set_position(table, horizon if complete else page[-1].global_position)
            done += len(page)
            if progress is not None:
                progress(done, horizon if complete else page[-1].global_position)
            if complete:
                return done

    def _anchors(self, page: list[Recorded]) -> dict[str, Anchor]:
        """Each instance's last event in ``page``, with its chain hash from the log (read before
        the page's transaction, so that it holds the write lock no longer)."""
        last: dict[str, int] = {}
        for recorded in page:
            last[recorded.event.instance_id] = recorded.event.position
        return {i: (at, self.store.event_hash(i, at)) for i, at in last.items()}

    @staticmethod
    def _fold_page(
        spec: ViewSpec, tx: ViewTx, table: str, page: list[Recorded], anchors: dict[str, Anchor]
    ) -> None:
        by_instance: dict[str, list[EventBase]] = {}
        for recorded in page:
            by_instance.setdefault(recorded.event.instance_id, []).append(recorded.event)
        # The rows the page will read, in one statement (or a few) instead of one per row; its
        # writes go out together at the commit (``ViewTx.put``), with the position.
        tx.prefetch(
            table,
            [
                (i, key)
                for i, events in by_instance.items()
                for key in (*spec.rows_read(i, events), MANIFEST_KEY)
            ],
        )
        # An instance's events up to its manifest's ``at`` are in its rows already: a view
        # position moved back (it is plain text) never folds them twice.
        for instance_id in list(by_instance):
            manifest = tx.get(table, instance_id, MANIFEST_KEY)
            folded = 0 if manifest is None else int(manifest["at"])
            events = [e for e in by_instance[instance_id] if e.position > folded]
            if events:
                by_instance[instance_id] = events
            else:
                del by_instance[instance_id]
                anchors.pop(instance_id, None)
        for instance_id, events in by_instance.items():
            state = spec.load(tx, table, instance_id)
            for event in events:
                state = spec.apply(state, event)
            spec.save(tx, table, instance_id, state)
        # Each instance's manifest: the log its rows now reflect, and what rows they are.
        update_manifests(tx, table, anchors)

    def follow(
        self,
        stop: threading.Event,
        *,
        poll_interval: float = 0.2,
        max_backoff: float = 5.0,
        on_retry: RetryReport | None = None,
    ) -> None:
        """Catch up, then keep catching up with new events until ``stop`` is set.

        Contention and a lost server (``StoreUnavailableError``) never stop it: it waits, from
        ``poll_interval`` doubling up to ``max_backoff`` seconds (with jitter), telling
        ``on_retry`` each time, and tries again; a page is folded exactly once whatever failed.
        Any other error is raised."""

        def report(attempt: RetryCallState) -> None:
            error = attempt.outcome.exception() if attempt.outcome else None
            delay = attempt.next_action.sleep if attempt.next_action else 0.0
            if on_retry is not None and isinstance(error, StoreUnavailableError):
                on_retry(error, delay)

        def pause(seconds: float) -> None:
            stop.wait(seconds)  # a stop ends the wait at once

        retrying = Retrying(
            retry=retry_if_exception(_transient),
            wait=wait_exponential(multiplier=poll_interval, max=max_backoff)
            + wait_random(0, poll_interval),
            stop=lambda _: stop.is_set(),
            sleep=pause,
            before_sleep=report,
            reraise=True,
        )
        while not stop.is_set():
            try:
                folded = retrying(self.catch_up)
            except StoreUnavailableError as error:
                if stop.is_set() and _transient(error):
                    return  # stopped while waiting out contention
                raise
            if folded == 0:
                stop.wait(poll_interval)

    # -- rebuild and verify -------------------------------------------------------------------

    def rebuild(
        self,
        name: str,
        *,
        resume: bool = False,
        progress: Callable[[int, int], None] | None = None,
    ) -> int:
        """Refold view ``name`` from the whole log into a shadow table, then swap it in.

        Readers see the old view until the swap. ``resume=True`` continues an interrupted rebuild
        from its shadow's position instead of starting over. Returns the events folded.
        ``progress(events folded, global position reached)`` is called after each page.
        """
        spec = self._spec(name)
        shadow = f"{spec.table}__shadow"
        with self.backend.lock(shadow, self.lock_wait) as held:
            if not held:
                raise self._busy("rebuild", name)
            if not resume:
                self.backend.drop(shadow)
            self.backend.ensure(shadow)
            done = self._catch_up(spec, shadow, None, progress)
            self.backend.swap(shadow, spec.table)
        return done

    def _busy(self, what: str, name: str) -> ProjectionError:
        return ProjectionError(
            f"another {what} of view {name!r} is running on {self.store.url} (waited "
            f"{self.lock_wait:g} s for it to finish); try again when it is done"
        )

    def verify(
        self, name: str, *, progress: Callable[[int, int], None] | None = None
    ) -> VerifyReport:
        """Refold view ``name`` from the log, in memory, up to the live view's position and
        compare. It writes nothing (no table, row or file) and so needs no lock. When the log
        ends before the live view's position (events it folded were removed from the log's
        end), the report says where (``log_end``) and compares with a refold of what is left.
        ``progress(events folded, global position reached)`` is called after each page."""
        spec = self._spec(name)
        position, live = self.backend.rows(spec.table)
        scratch = MemoryViewBackend()
        scratch.ensure(spec.table)
        self._catch_up(spec, spec.table, position, progress, backend=scratch)
        rebuilt_position, rebuilt = scratch.rows(spec.table)
        return VerifyReport(
            view=name,
            position=position,
            log_end=rebuilt_position if rebuilt_position < position else None,
            only_live=sorted(live.keys() - rebuilt.keys()),
            only_rebuilt=sorted(rebuilt.keys() - live.keys()),
            different={
                row: (live[row], rebuilt[row])
                for row in sorted(live.keys() & rebuilt.keys())
                if live[row] != rebuilt[row]
            },
        )

    def drop(self, name: str) -> None:
        """Drop view ``name``'s table and position (the next catch-up refolds it from the start)."""
        spec = self._spec(name)
        self.backend.drop(spec.table)
        self.backend.ensure(spec.table)

    # -- reading ------------------------------------------------------------------------------

    def _rows(self, name: str, instance_id: str) -> dict[str, Any]:
        """Every row of ``instance_id`` in view ``name`` (one statement), checked against the
        instance's manifest and the log (``projections._views._manifest``): refused with
        ``LogIntegrityError`` when they no longer match."""
        docs = self.backend.documents(self._spec(name).table, instance_id)
        rows = checked_rows(name, instance_id, docs)
        check_anchor(self.store, name, instance_id, docs.get(MANIFEST_KEY))
        return rows

    def state(self, instance_id: str) -> dict[str, Any]:
        """The committed state of ``instance_id`` in the ``state`` view (wire JSON trees),
        checked against the log (``LogIntegrityError`` if the view no longer matches it)."""
        doc = self._rows("state", instance_id).get(DOC_KEY)
        return {} if doc is None else dict(doc["values"])

    def history(self, instance_id: str) -> RunHistory:
        """The run history of ``instance_id`` in the ``history`` view (read in one statement),
        with the forks of the instance (``forks()``), checked against the log."""
        return HistoryView.read(self._rows("history", instance_id))

    def forks(self, origin_instance: str) -> list[ForkRecord]:
        """The instances forked from ``origin_instance``, oldest first, from the ``history`` view
        (a fork's record is kept under its origin)."""
        return self.history(origin_instance).forks()

    def blame(self, instance_id: str) -> KeyBlame:
        """The key provenance of ``instance_id`` in the ``blame`` view (read in one statement),
        checked against the log."""
        return BlameView.read(self._rows("blame", instance_id))


def run_follower(
    store_url: str,
    view_names: Sequence[str],
    stop_event: threading.Event,
    *,
    page_size: int = 500,
    poll_interval: float = 0.2,
    snapshot_every: int = 50,
    on_retry: RetryReport | None = None,
) -> None:
    """Open the store at ``store_url`` and keep the named views caught up until ``stop_event``.

    Meant for a process of its own (``steplog project --follow``): any number of workflow
    processes append while this one folds. It waits out contention (``Projector.follow``,
    which tells ``on_retry``) and stops only on another error.
    """
    with open_store(store_url) as store:
        projector = Projector(
            store, list(view_names), page_size=page_size, snapshot_every=snapshot_every
        )
        projector.follow(stop_event, poll_interval=poll_interval, on_retry=on_retry)


def _transient(error: BaseException) -> bool:
    """Whether ``error`` is worth waiting out: contention or a lost server, not a missing or
    damaged store."""
    return isinstance(error, StoreUnavailableError) and not isinstance(
        error, StoreNotFoundError | StoreDamagedError
    )
