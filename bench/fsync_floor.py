"""The disk's durable-commit floor: how many synced writes per second this disk takes.

A durable superstep ends in at least one synced write (SQLite in WAL mode with
``synchronous=FULL`` syncs the WAL once per commit; PostgreSQL with ``fsync=on`` flushes its WAL
once per commit). So one writer that commits once per superstep can never beat the disk's synced
writes per second, and several writers can beat it only by sharing a sync (group commit). This
module measures that ceiling, in the directory where the benchmarks' databases live:

* ``os.fsync`` (and ``os.fdatasync``, which SQLite and PostgreSQL's ``wal_sync_method`` use on
  Linux) after appending one 4 KiB block, one writer;
* raw ``sqlite3`` commits per second, one 1-row transaction each, WAL, ``synchronous=FULL``.

    python -m bench.fsync_floor                 # in the system's temp directory
    python -m bench.fsync_floor --dir /some/disk --count 2000

The group-commit benchmark (``bench/concurrent.py``) runs the same functions as its "floor"
cases, so the report carries the floor measured beside the rates it bounds.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

__all__ = ["fdatasync_rate", "fsync_rate", "sqlite_commit_rate"]

BLOCK = 4096  # one page: what a one-superstep WAL commit appends, give or take


def _synced_appends(directory: Path, count: int, sync: Callable[[int], None]) -> float:
    """Appends of one block, each followed by ``sync(fd)``, per second."""
    path = directory / f"fsync-floor-{uuid.uuid4().hex[:8]}.bin"
    block = b"\x5a" * BLOCK
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, block)
        sync(fd)  # the file's creation is synced off the clock
        start = time.perf_counter()
        for _ in range(count):
            os.write(fd, block)
            sync(fd)
        seconds = time.perf_counter() - start
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return count / seconds


def fsync_rate(directory: Path, count: int) -> float:
    """``os.fsync`` calls per second, each after appending one 4 KiB block to one file."""
    return _synced_appends(directory, count, os.fsync)


def fdatasync_rate(directory: Path, count: int) -> float:
    """``os.fdatasync`` calls per second (what SQLite and PostgreSQL use on Linux); falls back to
    ``os.fsync`` where the platform has no ``fdatasync``."""
    return _synced_appends(directory, count, getattr(os, "fdatasync", os.fsync))


def sqlite_commit_rate(
    directory: Path, count: int, row_bytes: int = 200, journal: str = "WAL"
) -> float:
    """One-row transactions per second on a fresh SQLite file: WAL mode, ``synchronous=FULL``
    (steplog's store settings), or another ``journal`` mode (``DELETE``: SQLite's default
    rollback journal). Raises ``AssertionError`` if a row is missing afterwards."""
    path = directory / f"sqlite-floor-{uuid.uuid4().hex[:8]}.db"
    payload = b"\x5a" * row_bytes
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        mode = conn.execute(f"PRAGMA journal_mode={journal}").fetchone()[0]
        if mode.upper() != journal.upper():
            raise AssertionError(f"sqlite floor: journal mode {mode}, expected {journal}")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE floor (id INTEGER PRIMARY KEY, value BLOB)")
        execute = conn.execute
        start = time.perf_counter()
        for i in range(count):
            execute("BEGIN")
            execute("INSERT INTO floor VALUES (?, ?)", (i, payload))
            execute("COMMIT")
        seconds = time.perf_counter() - start
        rows = conn.execute("SELECT COUNT(*) FROM floor").fetchone()[0]
        if rows != count:
            raise AssertionError(f"sqlite floor: {rows} rows committed, expected {count}")
    finally:
        conn.close()
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
    return count / seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.fsync_floor", description=__doc__)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--count", type=int, default=1000, help="synced writes per measurement")
    args = parser.parse_args(argv)
    directory = args.dir.resolve()
    print(f"directory: {directory}")
    print(f"os.fsync (4 KiB append):      {fsync_rate(directory, args.count):8,.0f} /s")
    print(f"os.fdatasync (4 KiB append):  {fdatasync_rate(directory, args.count):8,.0f} /s")
    print(f"sqlite3 commits (WAL, FULL):  {sqlite_commit_rate(directory, args.count):8,.0f} /s")


if __name__ == "__main__":
    main()
