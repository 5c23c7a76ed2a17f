"""View tables in the store's SQLite file: ``SQLiteViewBackend``, and its file locks.

Every transaction that writes view rows starts with ``BEGIN IMMEDIATE`` (``_views._sqlbackends``
says why); a lock (``lock``) is a hidden lock file beside the database, held with ``flock``
(``_file_lock``).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from kernel import Keyring, ProjectionError, StoreError
from projections._views._backends import check_table
from projections._views._sqlbackends import _SQLBackend

__all__ = ["SQLiteViewBackend"]


class SQLiteViewBackend(_SQLBackend):
    """View tables in the store's SQLite file (at ``path``, where lock files go beside it)."""

    # A write opens every claim, so the transaction holds SQLite's write lock from its start.
    sql_claim_insert = (
        "INSERT INTO {p} (name, position) VALUES (?, 0) "
        "ON CONFLICT (name) DO UPDATE SET position=position"
    )
    sql_claim_select = "SELECT position FROM {p} WHERE name=?"
    sql_exists = "SELECT 1 FROM sqlite_master WHERE type='table' AND name=?"

    def __init__(
        self,
        datastore: Any,
        url: str,
        path: Path,
        *,
        keyring: Keyring | None = None,
        classify: Callable[[BaseException], type[StoreError] | None],
        write_transaction: Callable[[], AbstractContextManager[Any]],
    ) -> None:
        super().__init__(datastore, url, keyring=keyring, classify=classify)
        self._path = path
        self._write_transaction = write_transaction

    @contextmanager
    def _transaction(self, *, commit: bool) -> Iterator[Any]:
        """Reads: a deferred transaction, rolled back. Writes: ``BEGIN IMMEDIATE``, which takes
        the write lock first, waiting for it under the busy timeout (module docstring)."""
        if not commit:
            with self._datastore.transaction(commit=False) as cursor:
                yield cursor
            return
        with self._write_transaction() as cursor:  # the store's (``SQLiteStore.write_transaction``)
            yield cursor

    @contextmanager
    def lock(self, name: str, timeout: float) -> Iterator[bool]:
        path = self._path.with_name(f".{self._path.name}.{check_table(name)}.lock")
        with _file_lock(path, timeout, f"cannot take the lock {name!r} of {self._url}") as held:
            yield held


@contextmanager
def _file_lock(path: Path, timeout: float, failed: str) -> Iterator[bool]:
    """Hold an exclusive lock on the file at ``path`` for the ``with`` block (True), or give up
    after ``timeout`` seconds (False). The file is created for the lock and removed when it is
    released, so none is left behind; the OS releases the lock if the process dies (the next
    holder then removes the file). A waiter that locked a file its previous holder had removed
    meanwhile sees that ``path`` no longer names it, and tries again on the file there now, so
    two holders never hold two files of one path. Windows has no ``flock``: ``filelock``. A
    file that cannot be created is a ``ProjectionError`` opening with ``failed``."""
    if sys.platform == "win32":  # pragma: no cover - the tests run on POSIX
        with _filelock(path, timeout) as held:
            yield held
        return
    import fcntl

    deadline = time.monotonic() + max(timeout, 0)
    pause = 0.005
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as error:
            raise ProjectionError(
                f"{failed}: cannot create {path}: {error.strerror or error}"
            ) from error
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            if time.monotonic() >= deadline:
                yield False
                return
            time.sleep(pause)
            pause = min(pause * 2, 0.1)
            continue
        except BaseException:
            os.close(fd)
            raise
        if _same_file(fd, path):
            break
        os.close(fd)  # its holder removed it as we took it: lock the file there now
    try:
        yield True
    finally:
        try:
            os.unlink(path)  # still held: a waiter on this file then finds it gone
        except FileNotFoundError:  # pragma: no cover - removed by hand meanwhile
            pass
        finally:
            os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


@contextmanager
def _filelock(path: Path, timeout: float) -> Iterator[bool]:  # pragma: no cover - Windows
    """``filelock``'s lock (it removes the file on Windows when released)."""
    held = FileLock(path, timeout=max(timeout, 0))
    try:
        held.acquire()
    except Timeout:
        yield False
        return
    try:
        yield True
    finally:
        held.release()
