"""The row codec at the mapper, alone: encoding, decoding and checking the loop's supersteps.

``python -m bench.codec [--supersteps N] [--repeat R]`` encodes ``N`` supersteps of the loop (seven
events each, one row per superstep, as ``LogBuilder`` makes them) and decodes them back, and prints
the CPU time per row of each piece (min and median of ``R`` passes): ``to_row``; ``decode_row`` of
every event; of ``CommittedState``'s types only; every hash checked and no event built; the same
rows without hashes (batch format 1), every event built; ``orjson.loads`` alone; and the mean size
of a row's ``state``. Run it from two checkouts alternately (``PYTHONPATH=...``) to compare them.

``python -m bench.codec --vacuumed-bytes`` runs the loop benchmark's SQLite cases (``python -m
bench --only loop --case sqlite --repeat 1 --no-write``) with every file vacuumed before it is
measured, where ``python -m bench`` measures it after a WAL checkpoint only.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson


def _rows(supersteps: int) -> tuple[list[Any], list[Any]]:
    """The loop's supersteps as event batches, and their rows (chained, as a run writes them)."""
    from kernel._codec._mapper import RowMapper
    from kernel.testing import LogBuilder

    log = LogBuilder("bench-loop-27215573")
    log.start_run()
    log.start_superstep()
    log.drain()
    batches = []
    for n in range(supersteps):
        executor = "a" if n % 2 == 0 else "b"
        log.invoke(executor)
        log.write("a", n)
        log.write("b", n)
        log.send(n + 1, targets=["b" if executor == "a" else "a"])
        log.complete()
        log.commit()
        log.start_superstep()
        batches.append([event for batch in log.drain() for event in batch])
    mapper, previous, rows = RowMapper(), None, []
    for batch in batches:
        row = mapper.to_row(batch, previous)
        previous = row.head
        rows.append(row)
    return batches, rows


def _per_row(work: Callable[[], object], rows: int, repeat: int) -> tuple[float, float]:
    """(min, median) CPU µs per row of ``work`` over ``repeat`` passes."""
    times = []
    for _ in range(repeat):
        start = time.process_time()
        work()
        times.append((time.process_time() - start) / rows * 1e6)
    return min(times), statistics.median(times)


def codec(supersteps: int, repeat: int) -> None:
    from kernel import CommittedState
    from kernel._codec._mapper import RowMapper

    batches, rows = _rows(supersteps)
    mapper = RowMapper()
    plain = []
    for row in rows:
        body = orjson.loads(row.state)
        plain.append(orjson.dumps([1, *body[1:4], *body[5:]]))
    keys = [(r.originator_id, r.originator_version, r.topic, r.state) for r in rows]
    types = CommittedState.EVENT_TYPES
    pieces: list[tuple[str, Callable[[], object]]] = [
        ("to_row", lambda: [mapper.to_row(b) for b in batches]),
        ("decode_row, every event", lambda: [mapper.decode_row(*k) for k in keys]),
        (
            "decode_row, CommittedState's types",
            lambda: [mapper.decode_row(*k, types=types) for k in keys],
        ),
        (
            "every hash checked, no event built",
            lambda: [mapper.decode_row(*k, types=(), check_all=True) for k in keys],
        ),
        (
            "batch format 1 (no hashes), every event",
            lambda: [mapper.decode_row(*k[:3], p) for k, p in zip(keys, plain, strict=True)],
        ),
        ("orjson.loads", lambda: [orjson.loads(k[3]) for k in keys]),
    ]
    format_of = orjson.loads(rows[0].state)[0]
    size = statistics.mean(len(r.state) for r in rows)
    print(f"{len(rows)} rows of batch format {format_of}, {size:.0f} bytes of state each")
    for name, work in pieces:
        low, median = _per_row(work, len(rows), repeat)
        print(f"{name:42s} {median:7.1f} µs/row (min {low:.1f})")


def vacuumed_bytes() -> int:
    import bench._db as db
    from bench.__main__ import main

    checkpointed = db.sqlite_bytes

    def vacuumed(path: Any) -> int:
        conn = sqlite3.connect(Path(path))
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.execute("VACUUM")
        finally:
            conn.close()
        return checkpointed(path)

    db.sqlite_bytes = vacuumed  # type: ignore[assignment]  # this process only
    return main(["--only", "loop", "--case", "sqlite", "--repeat", "1", "--no-write"])


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--supersteps", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--vacuumed-bytes", action="store_true")
    args = parser.parse_args()
    if args.vacuumed_bytes:
        raise SystemExit(vacuumed_bytes())
    codec(args.supersteps, args.repeat)


if __name__ == "__main__":
    main()
