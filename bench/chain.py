"""Benchmark: what the hash chain costs, reading and appending a realistic log.

The log is the loop-shaped log of ``bench._logs`` (seven events per superstep: started, invoked,
two state writes, a message, completed, committed; one run in five fails in its last superstep),
appended through steplog's store, so its rows are exactly what steplog writes: batch format 3,
one row per superstep, each carrying its hashes.

Each steplog case times the same work twice, alternating, on the same events: with the chain and
without it, and reports both (``no chain events/s``) and ``chain cost`` (time with the chain /
time without, per run, median). Without the chain means:

* reading (``decode``, ``read from SQLite``): the same rows in batch format 1 (the format before
  the chain: the same array without its ``chain`` element), decoded by the same code, which then
  has no hash to check; the SQLite copy also has no recorded heads, as a log written before the
  chain. Both must give back exactly the same events.
* writing (``encode``, ``append to SQLite``): the same code with the two functions that make a
  hash (``_codec._hashing.canonical``, the event's canonical bytes, and ``link``, BLAKE2b over
  it) stubbed out for the twin's run. Everything else is the same (the row keeps a chain field of
  the same size, the store still writes the head), so the cost shown is the hashing alone; what
  the chain adds besides is its bytes, shown as ``chain bytes/superstep`` (file size with the
  chain minus the format-1 copy's, after VACUUM, per superstep).

The baseline is the floor of any reader of these rows: ``orjson.loads`` of every row's state.
"""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

from bench._core import Benchmark, Case, Config, Measurement, expect
from bench._db import remove_sqlite
from bench._logs import EVENTS_PER_SUPERSTEP, LogSpec, ensure_log

__all__ = ["BENCHMARK"]

RAW = "orjson.loads of every row (the floor)"
DECODE = "decode + verify (RowMapper.decode_row)"
READ = "read + verify from SQLite (store.iter_all)"
ENCODE = "encode + hash (RowMapper.to_row)"
APPEND = "append to SQLite (store.append_many, 64 supersteps per transaction)"
APPEND_BATCH = 64

Row = tuple[str, int, str, bytes]
"""(instance, last position, topic, state) of one stored row."""


def _spec(cfg: Config) -> LogSpec:
    s = cfg.sizes
    per_instance = round(s.chain_events / s.chain_instances / (EVENTS_PER_SUPERSTEP + 2 / 1000))
    return LogSpec("chain", s.chain_instances, per_instance, run_length=1000)


def _rows(path: Path) -> list[Row]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return [
            (str(i), int(v), str(t), bytes(s))
            for i, v, t, s in conn.execute(
                "SELECT originator_id, originator_version, topic, state FROM steplog_events "
                "ORDER BY rowid"
            )
        ]
    finally:
        conn.close()


def _unchained(state: bytes) -> bytes:
    """The same batch row in batch format 1: no ``chain`` element."""
    body = orjson.loads(state)
    expect(body[0], 3, "batch format of the generated rows")
    return orjson.dumps([1, *body[1:4], *body[5:]])


def _sqlite_bytes(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("VACUUM")
        (pages,) = conn.execute("PRAGMA page_count").fetchone()
        (size,) = conn.execute("PRAGMA page_size").fetchone()
        return int(pages) * int(size)
    finally:
        conn.close()


def prepare(cfg: Config) -> str:
    from kernel._codec._mapper import RowMapper

    spec = _spec(cfg)
    chained, meta, generated = ensure_log(spec, cfg.cache_dir)
    rows = _rows(chained)
    plain = [(i, v, t, _unchained(s)) for i, v, t, s in rows]
    # The format-1 copy of the file: the same rows without hashes, no recorded heads, and no
    # integrity mark (a store written before the chain has none; with it, rows without hashes
    # are refused as a downgrade).
    copy = cfg.workdir / "chain-unchained.db"
    remove_sqlite(copy)
    shutil.copyfile(chained, copy)
    conn = sqlite3.connect(copy)
    try:
        conn.executemany(
            "UPDATE steplog_events SET state = ? "
            "WHERE originator_id = ? AND originator_version = ?",
            [(s, i, v) for i, v, _, s in plain],
        )
        conn.execute("DELETE FROM steplog_chain")
        conn.execute("DELETE FROM steplog_meta WHERE key = 'integrity'")
        conn.commit()
    finally:
        conn.close()
    mapper = RowMapper()
    events = [mapper.decode_row(i, v, t, s) for i, v, t, s in rows]
    expect([mapper.decode_row(i, v, t, s) for i, v, t, s in plain], events, "format-1 rows' events")
    expect(sum(map(len, events)), meta["events"], "events in the log")
    previous = [mapper.row_link(i, v, t, s).previous for i, v, t, s in rows]
    scratch = cfg.workdir / "chain-sizes.db"
    shutil.copyfile(chained, scratch)
    with_chain = _sqlite_bytes(scratch)
    shutil.copyfile(copy, scratch)
    without = _sqlite_bytes(scratch)
    remove_sqlite(scratch)
    cfg.shared["chain"] = {
        "path": chained,
        "copy": copy,
        "rows": rows,
        "plain": plain,
        "events": events,
        "previous": previous,
        "count": meta["events"],
        "bytes": (with_chain - without) / len(rows),
    }
    return (
        f"log: {meta['events']:,} events, {len(rows):,} rows, {spec.instances} instances "
        f"({'generated' if generated else 'cached'}: {chained.name}); the chain adds "
        f"{(with_chain - without) / len(rows):,.0f} B per superstep row "
        f"({with_chain / 2**20:,.1f} MiB with it, {without / 2**20:,.1f} MiB without)"
    )


def _shared(cfg: Config) -> dict[str, Any]:
    return cfg.shared["chain"]  # type: ignore[no-any-return]


@contextlib.contextmanager
def _no_hashing() -> Iterator[None]:
    """Stub out the two functions that make a hash (the twin's run of the writing cases)."""
    import kernel._codec._hashing as hashing

    canonical, link = hashing.canonical, hashing.link
    hashing.canonical = lambda *args, **kwargs: b""  # type: ignore[assignment]
    hashing.link = lambda previous, covered: previous  # type: ignore[assignment]
    try:
        yield
    finally:
        hashing.canonical, hashing.link = canonical, link  # type: ignore[assignment]


def _pair(
    cfg: Config,
    chained: Callable[[], int],
    unchained: Callable[[], int],
    *,
    bytes_per_row: bool = False,
) -> Measurement:
    """Time ``unchained`` and ``chained`` (each returns the events it handled, checked), in
    turns: unchained first on one call, chained first on the next."""
    import gc

    count = _shared(cfg)["count"]
    key = f"chain order {chained.__qualname__}"  # (one per case)
    flip = cfg.shared[key] = not cfg.shared.get(key, False)
    order = [("plain", unchained), ("chain", chained)]
    seconds: dict[str, float] = {}
    for name, work in order if flip else order[::-1]:
        gc.collect()
        start = time.perf_counter()
        handled = work()
        seconds[name] = time.perf_counter() - start
        expect(handled, count, "events handled")
    plain, with_chain = seconds["plain"], seconds["chain"]
    extra = {"plain_events_s": count / plain, "cost": with_chain / plain}
    if bytes_per_row:
        extra["chain_bytes"] = _shared(cfg)["bytes"]
    return Measurement(count / with_chain, extra=extra)


# -- the cases ----------------------------------------------------------------------------------


def raw(cfg: Config) -> Measurement:
    rows = _shared(cfg)["rows"]
    start = time.perf_counter()
    events = sum(len(orjson.loads(state)) - 5 for _, _, _, state in rows)
    seconds = time.perf_counter() - start
    expect(events, _shared(cfg)["count"], "events in the rows")
    return Measurement(events / seconds)


def decode(cfg: Config) -> Measurement:
    from kernel._codec._mapper import RowMapper

    shared = _shared(cfg)
    mapper = RowMapper()

    def run(rows: list[Row]) -> Callable[[], int]:
        return lambda: sum(len(mapper.decode_row(i, v, t, s)) for i, v, t, s in rows)

    return _pair(cfg, run(shared["rows"]), run(shared["plain"]))


def read(cfg: Config) -> Measurement:
    from kernel import open_store

    shared = _shared(cfg)

    def run(path: Path) -> Callable[[], int]:
        def work() -> int:
            with open_store(f"sqlite:///{path}") as store:
                return sum(1 for _ in store.iter_all())

        return work

    return _pair(cfg, run(shared["path"]), run(shared["copy"]), bytes_per_row=True)


def encode(cfg: Config) -> Measurement:
    from kernel._codec._mapper import RowMapper

    shared = _shared(cfg)
    mapper = RowMapper()
    pairs = list(zip(shared["events"], shared["previous"], strict=True))
    written: list[bytes] = []

    def chained() -> int:
        written[:] = [mapper.to_row(events, previous).state for events, previous in pairs]
        return sum(len(events) for events, _ in pairs)

    def unchained() -> int:
        with _no_hashing():
            for events, previous in pairs:
                mapper.to_row(events, previous)
        return sum(len(events) for events, _ in pairs)

    measured = _pair(cfg, chained, unchained)
    expect(written == [s for _, _, _, s in shared["rows"]], True, "rows encoded as stored")
    return measured


def append(cfg: Config) -> Measurement:
    from kernel import open_store

    shared = _shared(cfg)
    batches = [
        (events[0].instance_id, events, events[0].position - 1) for events in shared["events"]
    ]
    chained, plain = cfg.workdir / "chain-append.db", cfg.workdir / "chain-append-plain.db"

    def work(target: Path) -> int:
        remove_sqlite(target)
        with open_store(f"sqlite:///{target}") as store:
            for at in range(0, len(batches), APPEND_BATCH):
                for outcome in store.append_many(batches[at : at + APPEND_BATCH]):
                    if isinstance(outcome, Exception):
                        raise outcome
            return sum(store.version(i) for i in store.instances())

    def unchained() -> int:
        with _no_hashing():
            return work(plain)

    measured = _pair(cfg, lambda: work(chained), unchained)
    with open_store(f"sqlite:///{chained}") as store:
        expect(store.verify_chain().ok, True, "the appended log's chain verifies")
    remove_sqlite(chained)
    remove_sqlite(plain)
    return measured


BENCHMARK = Benchmark(
    name="chain",
    title="Chain cost: reading and appending a log with and without the hash chain",
    description=(
        "Every steplog case runs its work twice per repeat on the same events, without the chain "
        "then with it, and reports both rates and the chain's cost (time with / time without). "
        "Reading without the chain: the same rows in batch format 1 (no hashes), by the same "
        "code; writing without it: the same code with the hashing (canonical bytes + BLAKE2b) "
        "stubbed out. events/s = events in the log / seconds. Baseline: orjson.loads of every "
        "row's state (the floor of any reader)."
    ),
    metric="events/s",
    higher_is_better=True,
    baseline=RAW,
    extra_columns=[
        ("plain_events_s", "no chain events/s"),
        ("cost", "chain cost (time x)"),
        ("chain_bytes", "chain bytes/superstep"),
    ],
    prepare=prepare,
    warmup=True,
    cases=[
        Case(RAW, raw),
        Case(DECODE, decode, steplog=True),
        Case(READ, read, steplog=True),
        Case(ENCODE, encode, steplog=True),
        Case(APPEND, append, steplog=True),
    ],
)
