"""The blame of a few keys of one instance, read from a store: only what those keys need.

``fold_blame(events, keys=...)`` skips the writes of other keys on sight; ``blame_keys`` feeds it
from a store. With a key index (the ``keyindex`` view, ``KeyIndexView``, kept by ``Projector``)
it reads only the events the keys' verdicts depend on: their writes, the starts and markers of
the supersteps they were written in, the ends of those runs and the fork, located by the index
and read in short position windows (``store.read_ranges(instance_id, windows, types=BLAME_TYPES)``,
one query for them all, and one more for the rows around them: ``read_ranges`` checks that the
rows of each window link up with each other and with the rows before and after it, so a row
forged between the rows it does not link with is refused, as a read of the whole stream would),
then the tail of the stream the index has not folded yet (read first: a write there may depend
on a marker or a run's end the index has folded). The cost follows the keys' writes, not
the length of the log. The verdicts still come from folding those events through ``KeyBlame``
(the kernel's fold): the index says where to look, never what happened.

Without an index (none built, or ``index=False``) the whole stream is read in bounded position
windows with the store's type filter, so only the event types blame needs are decoded. Either
way the answer is the same. Reading never writes: a missing index table is not created.

Example::

    blame = blame_keys(store, "order-42", ["plan"])
    for write in blame.writes("plan"):
        print(write.position, write.status)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from kernel import EventBase, EventStore, ProjectionError, StateStaged
from projections._folds._blame import KeyBlame
from projections._folds._keyindex import indexed_upto, relevant_positions, windows
from projections._views._backend_for import backend_for
from projections._views._backends import ViewBackend
from projections._views._manifest import MANIFEST_KEY, check_anchor, checked_rows
from projections._views._viewspecs import KeyIndexView

__all__ = ["BLAME_TYPES", "blame_keys", "key_index_position"]

BLAME_TYPES = KeyBlame.EVENT_TYPES
"""The event types that change a ``KeyBlame``: folding only these gives the same answers."""


class _IndexRows:
    """The key index rows of one instance in a view backend, read without creating anything.

    ``checked`` reads every row of the instance in one statement and checks them against the
    instance's manifest (their number and digest: a row deleted, added, edited, or put back
    from an older copy, sealed or not) and its anchor against the log; ``get`` and ``read``
    then answer from those rows. The rows are positions, a few per key, superstep and run:
    reading them all costs far less than reading the events they point to."""

    __slots__ = ("_instance", "_rows", "_table", "_views")

    def __init__(self, views: ViewBackend, table: str, instance_id: str) -> None:
        self._views, self._table, self._instance = views, table, instance_id
        self._rows: dict[str, Any] | None = None

    @classmethod
    def find(
        cls, store: EventStore, instance_id: str, backend: ViewBackend | None
    ) -> _IndexRows | None:
        """The rows of ``instance_id`` if the index table exists, else None."""
        views = backend or backend_for(store)
        table = KeyIndexView().table
        return cls(views, table, instance_id) if views.exists(table) else None

    def checked(self, store: EventStore) -> _IndexRows:
        """Read the instance's rows and check them (``projections._views._manifest``):
        ``LogIntegrityError`` when they no longer match their manifest or the log."""
        docs = self._views.documents(self._table, self._instance)
        self._rows = checked_rows("keyindex", self._instance, docs)
        check_anchor(store, "keyindex", self._instance, docs.get(MANIFEST_KEY))
        return self

    def get(self, key: str) -> Any:
        if self._rows is None:
            return self._views.get(self._table, self._instance, key)
        return self._rows.get(key)

    def read(self, keys: list[str]) -> dict[str, Any]:
        assert self._rows is not None  # only checked rows say where to look
        return {key: self._rows[key] for key in keys if key in self._rows}


def key_index_position(
    store: EventStore, instance_id: str, *, backend: ViewBackend | None = None
) -> int | None:
    """The last stream position of ``instance_id`` the key index has folded (in ``backend``, by
    default the store's own database); None when there is no index or it has not seen the
    instance. Creates nothing."""
    rows = _IndexRows.find(store, instance_id, backend)
    return None if rows is None else indexed_upto(rows.get)


def blame_keys(
    store: EventStore,
    instance_id: str,
    keys: Iterable[str],
    *,
    page_size: int = 2000,
    index: bool = True,
    backend: ViewBackend | None = None,
) -> KeyBlame:
    """The ``KeyBlame`` of ``instance_id`` restricted to ``keys`` (see the module docstring).

    Equal, for those keys, to ``fold_blame(store.read(instance_id))``. ``index=False`` ignores
    the key index and reads the whole stream; ``backend`` is where the index lives (by default
    the store's own database). The tail the index has not folded is held in memory (without
    other keys' writes) while the index is asked, so keep the index caught up (``Projector``).
    Raises ``StoreError`` if the store cannot be read.
    """
    if page_size < 1:
        raise ProjectionError(f"page_size must be >= 1, got {page_size}")
    keys = list(keys)
    view = KeyBlame(keys)
    found = _IndexRows.find(store, instance_id, backend) if index else None
    rows = None if found is None else found.checked(store)
    upto = None if rows is None else indexed_upto(rows.get)
    if rows is None or upto is None:
        for events in _pages(store, instance_id, 0, page_size):
            view.apply_all(events)
        return view
    # The tail the index has not folded, without other keys' writes: its writes of ``keys`` may
    # depend on indexed markers and run ends, so it is read before the index is asked.
    wanted = set(keys)
    tail = [
        event
        for events in _pages(store, instance_id, upto, page_size)
        for event in events
        if not isinstance(event, StateStaged) or event.key in wanted
    ]
    ranges = [
        (first - 1, last)
        for first, last in windows(relevant_positions(rows.read, keys, upto, tail))
    ]
    view.apply_all(store.read_ranges(instance_id, ranges, types=BLAME_TYPES))
    return view.apply_all(tail)


def _pages(
    store: EventStore, instance_id: str, after: int, page_size: int
) -> Iterator[list[EventBase]]:
    """The events of ``BLAME_TYPES`` after ``after``, in position windows of ``page_size``
    (filtered pages may be short, so they are paged by position, not by count). Each window is
    read with ``read_ranges``, which checks that its rows link up with the rows around it."""
    end = store.version(instance_id)
    for start in range(after, end, page_size):
        yield store.read_ranges(instance_id, [(start, start + page_size)], types=BLAME_TYPES)
