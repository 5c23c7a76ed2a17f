"""``backend_for(store)``: the view backend that lives in a store's own database.

The SQLite file, the PostgreSQL schema, or, for ``memory://``, one ``MemoryViewBackend`` tied to
that store (kept while the store lives).
"""

from __future__ import annotations

import threading
import weakref

import kernel
from kernel import EventStore, ProjectionError
from projections._views._backends import MemoryViewBackend, ViewBackend
from projections._views._postgres import PostgresViewBackend
from projections._views._sqlite import SQLiteViewBackend

__all__ = ["backend_for"]

_memory_backends: weakref.WeakKeyDictionary[EventStore, MemoryViewBackend] = (
    weakref.WeakKeyDictionary()
)
_memory_lock = threading.Lock()


def backend_for(store: EventStore) -> ViewBackend:
    """The view backend in ``store``'s own database (one shared object per memory store).

    The adapter classes are looked up in this order (``kernel`` loads its adapters on first use),
    so that a memory or SQLite store never loads psycopg."""
    if isinstance(store, kernel.MemoryStore):
        with _memory_lock:
            backend = _memory_backends.get(store)
            if backend is None:
                backend = _memory_backends[store] = MemoryViewBackend()
            return backend
    if isinstance(store, kernel.SQLiteStore):
        return SQLiteViewBackend(
            store.datastore,
            store.url,
            store.path,
            keyring=store.keyring,
            classify=store.classify_error,
            write_transaction=store.write_transaction,
        )
    if isinstance(store, kernel.PostgresStore):
        return PostgresViewBackend(
            store.datastore,
            store.url,
            store.schema,
            keyring=store.keyring,
            classify=store.classify_error,
        )
    raise ProjectionError(f"no view backend for {type(store).__name__}: pass backend= explicitly")
