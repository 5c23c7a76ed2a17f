"""The blame of a few keys of one instance, read from a store: only what those keys need.

``fold_blame(events, keys=...)`` skips the writes of other keys on sight; ``blame_keys`` feeds it
from a store in bounded pages. By default it pages through the instance's stream
(``store.read(instance_id, after=..., limit=...)``). With ``global_scan=True`` it reads the global
log with the store's type filter instead (``store.iter_all(types=BLAME_TYPES)``): only the event
types blame needs are decoded, but every instance's are, so this pays off only when the instance
holds most of the log.

Example::

    blame = blame_keys(store, "order-42", ["plan"])
    for write in blame.writes("plan"):
        print(write.position, write.status)
"""

from __future__ import annotations

from collections.abc import Iterable

from kernel._errors import ProjectionError
from kernel._store import EventStore
from projections._blame import _BLAME_TYPES, KeyBlame

__all__ = ["BLAME_TYPES", "blame_keys"]

BLAME_TYPES = _BLAME_TYPES
"""The event types that change a ``KeyBlame``: folding only these gives the same answers."""


def blame_keys(
    store: EventStore,
    instance_id: str,
    keys: Iterable[str],
    *,
    page_size: int = 2000,
    global_scan: bool = False,
) -> KeyBlame:
    """The ``KeyBlame`` of ``instance_id`` restricted to ``keys`` (see the module docstring).

    Equal, for those keys, to ``fold_blame(store.read(instance_id))``; raises ``StoreError`` if
    the store cannot be read.
    """
    if page_size < 1:
        raise ProjectionError(f"page_size must be >= 1, got {page_size}")
    view = KeyBlame(keys)
    if global_scan:
        for recorded in store.iter_all(types=BLAME_TYPES, page_size=page_size):
            if recorded.event.instance_id == instance_id:
                view.apply(recorded.event)
        return view
    after = 0
    while True:
        page = store.read(instance_id, after=after, limit=page_size)
        for event in page:
            view.apply(event)
        if len(page) < page_size:
            return view
        after = page[-1].position
