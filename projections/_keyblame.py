"""The blame of a few keys of one instance, read from a store: only what those keys need.

``fold_blame(events, keys=...)`` skips the writes of other keys on sight; ``blame_keys`` feeds it
from a store in bounded pages: windows of the instance's stream read with the store's type filter
(``store.read(instance_id, after=k, upto=k + n, types=BLAME_TYPES)``), so only the event types
blame needs are decoded.

Example::

    blame = blame_keys(store, "order-42", ["plan"])
    for write in blame.writes("plan"):
        print(write.position, write.status)
"""

from __future__ import annotations

from collections.abc import Iterable

from kernel import EventStore, ProjectionError
from projections._blame import KeyBlame

__all__ = ["BLAME_TYPES", "blame_keys"]

BLAME_TYPES = KeyBlame.EVENT_TYPES
"""The event types that change a ``KeyBlame``: folding only these gives the same answers."""


def blame_keys(
    store: EventStore,
    instance_id: str,
    keys: Iterable[str],
    *,
    page_size: int = 2000,
) -> KeyBlame:
    """The ``KeyBlame`` of ``instance_id`` restricted to ``keys`` (see the module docstring).

    Equal, for those keys, to ``fold_blame(store.read(instance_id))``; raises ``StoreError`` if
    the store cannot be read.
    """
    if page_size < 1:
        raise ProjectionError(f"page_size must be >= 1, got {page_size}")
    view = KeyBlame(keys)
    end = store.version(instance_id)
    for after in range(0, end, page_size):  # position windows: filtered pages may be short
        for event in store.read(
            instance_id, after=after, upto=after + page_size, types=BLAME_TYPES
        ):
            view.apply(event)
    return view
