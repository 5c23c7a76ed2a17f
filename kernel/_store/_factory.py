"""``open_store``: the store at a URL, its adapter imported on first use.

Above the adapters (``_memory``, ``_sqlite``, ``_postgres``), which are above the store and its
port: nothing below imports this module, and a program that opens only ``memory://`` never loads
sqlite3's or psycopg's adapter.
"""

from __future__ import annotations

import os
from typing import Any

from kernel._base._errors import StoreConfigError
from kernel._base._urls import mask_url, split_url
from kernel._codec._cipher import FROM_ENV, KeyringChoice, keyring_from
from kernel._store._eventstore import EventStore

__all__ = ["DEFAULT_STORE_ENV", "open_store"]

DEFAULT_STORE_ENV = "STEPLOG_STORE"


def open_store(
    url: str | None = None,
    *,
    create: bool = True,
    read_only: bool = False,
    keyring: KeyringChoice = FROM_ENV,
    allow_broken_chain: bool = False,
    **options: Any,
) -> EventStore:
    """Open the event store at ``url``.

    ``memory://`` keeps events in this process; ``sqlite:///relative.db`` and
    ``sqlite:////absolute/path.db`` use a SQLite file;
    ``postgresql://user[:password]@host[:port]/database[?schema=name]`` uses PostgreSQL, in the
    ``public`` schema unless one is named. Without a URL, ``$STEPLOG_STORE`` is used, else memory.

    With ``create=True`` (the default) a store that does not exist is created: the SQLite file and
    its tables, the PostgreSQL schema and tables. With ``create=False`` nothing is ever created
    (no file, no schema, no table, no row): a missing store raises ``StoreNotFoundError``. Use it
    for programs that only read. A ``memory://`` store is always new and empty.

    SQLite: a file that holds another application's tables (and no steplog store) is refused with
    ``StoreConfigError``, leaving it untouched, unless ``adopt=True`` is passed (steplog then adds
    its tables and switches the file to WAL mode). ``sqlite:///path.db?mode=ro`` opens a store
    read-only (never creating it); so does ``create=False`` when this user cannot write the file
    or its directory.

    ``read_only=True`` opens the store only to read, and implies ``create=False``: a SQLite file
    is opened as with ``?mode=ro`` (SQLite's ``mode=ro``; ``immutable=1`` where the directory
    or mount is read-only), so it is never written, its write-ahead log is read but never folded
    into it (no checkpoint), and no file is removed; the empty ``-wal`` and the ``-shm`` that
    SQLite makes to read a WAL-mode file are removed on ``close`` if they were not there before
    and no other connection uses them (docs/cli.md, "Reading never writes"). Elsewhere it is
    ``create=False``. The CLI's reading commands and ``steplog ui`` open their store so.

    A password in the URL is never shown: ``store.url``, ``repr(store)`` and every error message
    show it as ``***`` (the user name is kept).

    With a ``keyring`` (``Keyring``), rows are written encrypted and read back with its keys; a
    store once written with a key refuses writers without one. By default (``kernel.FROM_ENV``)
    the keys are those in ``$STEPLOG_KEYS``, so that a program opening its store by URL encrypts
    as the CLI and the builder's default store do; ``keyring=None`` opens it without keys, even
    when ``$STEPLOG_KEYS`` is set (``kernel._codec._cipher.keyring_from`` is the rule). Every read
    checks the hash chain and raises ``LogIntegrityError`` at the first event that does not match
    its hash or row that does not link up; ``allow_broken_chain=True`` reads such a log anyway,
    noting each problem in ``store.chain_problems`` for the reader to show.

    Raises ``StoreConfigError`` for a URL that is wrong or malformed (naming what is wrong), or
    keys that are not keys, ``StoreUnavailableError`` when the database cannot be reached or
    opened (``StoreDamagedError``, one of those, when its file is damaged; ``StoreNotFoundError``,
    another, when it does not exist and ``create`` is false), and ``SchemaVersionError`` when it
    was written by a newer steplog.
    """
    if url is None:
        url = os.environ.get(DEFAULT_STORE_ENV) or "memory://"
    if not isinstance(url, str) or not url.strip():
        shown = mask_url(url) if isinstance(url, str) else url
        raise StoreConfigError(f"a store URL must be a non-empty string, got {shown!r}")
    keys = keyring_from(keyring, os.environ)
    create = create and not read_only
    scheme = split_url(url).scheme.lower()
    store: EventStore
    if scheme == "memory":
        from kernel._store._memory import MemoryStore

        store = MemoryStore(url, create=create, **options)
    elif scheme == "sqlite":
        from kernel._store._sqlite import SQLiteStore

        store = SQLiteStore(url, create=create, read_only=read_only, **options)
    elif scheme in ("postgresql", "postgres"):
        from kernel._store._postgres import PostgresStore

        store = PostgresStore(url, create=create, **options)
    else:
        raise _unknown_scheme(scheme, url)
    try:
        store._configure(keyring=keys, allow_broken_chain=allow_broken_chain, create=create)
    except BaseException:
        store.close()
        raise
    return store


def _unknown_scheme(scheme: str, url: str) -> StoreConfigError:
    return StoreConfigError(
        f"unknown store URL {mask_url(url)!r}: use memory://, sqlite:///path/to/file.db or "
        "postgresql://user@host:port/database"
    )
