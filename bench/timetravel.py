"""Benchmark 4: time travel in one instance of 100,000 supersteps.

State as of a random superstep (median latency over random samples), with and without
snapshots; blame of one key, through the key index and by a scan of the stream; diff of two
distant points. Every answer is checked against the generator's definition of the log
(``LogSpec.state_at``).
"""

from __future__ import annotations

import hashlib
import random
import shutil
import sqlite3
import statistics
import time
from pathlib import Path
from typing import Any

import projections as p
from bench._core import Benchmark, Case, Config, Measurement, Target, expect
from bench._db import remove_sqlite, sqlite_bytes
from bench._logs import LogSpec, ensure_log
from bench._rows import RawFold
from kernel import CommittedState, fold_committed, open_store

__all__ = ["BENCHMARK"]

FULL_FOLD = "full fold (store.read pages up to the point + fold_committed)"
SNAPSHOTS = "steplog state as of superstep (with snapshots)"
BLAME = "steplog blame of one key (key index)"
BLAME_SCAN = "steplog blame of one key (scan, no index)"
SNAPSHOT_EVERY = 50
FOLD_PAGE = 1000


def _spec(cfg: Config) -> LogSpec:
    s = cfg.sizes
    return LogSpec(
        "timetravel", 1, s.tt_supersteps, run_length=max(10, s.tt_supersteps // 10), key_mod=1000
    )


def _instance(cfg: Config) -> str:
    return f"{_spec(cfg).name}-0000"


def _samples(cfg: Config, case: str, count: int) -> list[int]:
    """Random supersteps; the k-th run of every case draws the same ones (seeded by k)."""
    draws: dict[str, int] = cfg.shared.setdefault("tt_draws", {})
    draws[case] = draws.get(case, 0) + 1
    rng = random.Random(1000 + draws[case])
    return [rng.randint(1, cfg.sizes.tt_supersteps) for _ in range(count)]


def _latencies(samples: list[int], cfg: Config, query: Any) -> Measurement:
    spec = _spec(cfg)
    times = []
    for g in samples:
        start = time.perf_counter()
        values = query(spec.end_position(g))
        times.append((time.perf_counter() - start) * 1000)
        expect(values, spec.state_at(g), f"state as of superstep {g}")
    return Measurement(statistics.median(times), extra={"max_ms": max(times)})


def full_fold(cfg: Config) -> Measurement:
    """What a fold without snapshots costs: the stream up to the point, read page by page
    (``store.read(after=..., upto=..., limit=...)``) and folded as it streams, never held."""
    store = _open(cfg)
    instance = _instance(cfg)

    def query(upto: int) -> dict[str, Any]:
        view, after = CommittedState(), 0
        while True:
            page = store.read(instance, after=after, upto=upto, limit=FOLD_PAGE)
            fold_committed(page, view)
            if len(page) < FOLD_PAGE:
                return dict(view.values)
            after = page[-1].position

    try:
        return _latencies(_samples(cfg, "full_fold", cfg.sizes.tt_fold_samples), cfg, query)
    finally:
        store.close()


def raw_fold(cfg: Config) -> Measurement:
    """The floor for a fold without snapshots: raw rows up to the point, orjson, commit rule."""
    conn = sqlite3.connect(f"file:{cfg.shared['tt_snap_log']}?mode=ro", uri=True)
    instance = _instance(cfg)

    def query(upto: int) -> dict[str, Any]:
        values: dict[str, Any] = {}
        fold = RawFold()
        rows = conn.execute(  # up to the first row that reaches the point
            "SELECT originator_version, topic, state FROM steplog_events WHERE originator_id = ? "
            "AND originator_version <= coalesce((SELECT min(originator_version) FROM "
            "steplog_events WHERE originator_id = ? AND originator_version >= ?), ?) "
            "ORDER BY originator_version",
            (instance, instance, upto, upto),
        )
        for version, topic, state in rows:
            fold.row(values, version, topic, state, upto)
        return values

    try:
        return _latencies(_samples(cfg, "raw_fold", cfg.sizes.tt_fold_samples), cfg, query)
    finally:
        conn.close()


def _open(cfg: Config) -> Any:
    return open_store(f"sqlite:///{cfg.shared['tt_snap_log']}")


def _travel(cfg: Config, *, snapshots: bool) -> Measurement:
    store = _open(cfg)
    instance = _instance(cfg)
    try:
        travel = p.TimeTravel(store, snapshots=snapshots)
        count = cfg.sizes.tt_samples if snapshots else cfg.sizes.tt_fold_samples
        name = "snapshots" if snapshots else "plain"
        return _latencies(
            _samples(cfg, name, count),
            cfg,
            lambda upto: dict(travel.state(instance, p.AtPosition(upto)).values),
        )
    finally:
        store.close()


def steplog_as_of_snapshots(cfg: Config) -> Measurement:
    """``TimeTravel(store).state(id, AtPosition(marker of g))``: nearest snapshot + tail."""
    return _travel(cfg, snapshots=True)


def steplog_as_of_plain(cfg: Config) -> Measurement:
    """The same with ``snapshots=False``: folds the stream from the start."""
    return _travel(cfg, snapshots=False)


def _blame(cfg: Config, *, index: bool) -> Measurement:
    spec = _spec(cfg)
    key = "k7"
    want = [g for g in range(1, spec.supersteps + 1) if spec.second_key(g) == key]
    store = _open(cfg)
    try:
        start = time.perf_counter()
        writes = p.blame_keys(store, _instance(cfg), [key], index=index).writes(key)
        ms = (time.perf_counter() - start) * 1000
    finally:
        store.close()
    expect([w.value for w in writes], want, f"blame of {key}: values written, in order")
    statuses = {w.value: w.status for w in writes}
    aborted = [g for g in want if not spec.committed(g)]
    expect(
        sorted(g for g, status in statuses.items() if status == "aborted"),
        aborted,
        f"blame of {key}: aborted writes",
    )
    return Measurement(ms, extra={"max_ms": ms})


def steplog_blame(cfg: Config) -> Measurement:
    """Every write of one key with its fate: ``blame_keys(store, id, [key]).writes(key)``, with
    the ``keyindex`` view caught up (built with the snapshots): reads only that key's writes,
    their supersteps' starts and markers and their runs' ends, and folds them."""
    return _blame(cfg, index=True)


def steplog_blame_scan(cfg: Config) -> Measurement:
    """The same with ``index=False``: reads every event of ``BLAME_TYPES``, page by page, and
    keeps only that key."""
    return _blame(cfg, index=False)


def steplog_diff(cfg: Config) -> Measurement:
    """Diff of two distant points: two ``TimeTravel`` lookups (snapshots) and ``diff``."""
    spec = _spec(cfg)
    store = _open(cfg)
    instance = _instance(cfg)
    draws: dict[str, int] = cfg.shared.setdefault("tt_draws", {})
    draws["diff"] = draws.get("diff", 0) + 1
    rng = random.Random(2000 + draws["diff"])
    times = []
    try:
        travel = p.TimeTravel(store)
        for _ in range(cfg.sizes.tt_samples):
            low = rng.randint(1, max(1, spec.supersteps // 10))
            high = rng.randint(spec.supersteps - spec.supersteps // 10, spec.supersteps)
            start = time.perf_counter()
            before = travel.state(instance, p.AtPosition(spec.end_position(low))).values
            after = travel.state(instance, p.AtPosition(spec.end_position(high))).values
            changes = p.diff(before, after)
            times.append((time.perf_counter() - start) * 1000)
            want_before, want_after = spec.state_at(low), spec.state_at(high)
            expect(
                dict(changes.added),
                {k: v for k, v in want_after.items() if k not in want_before},
                "diff: added",
            )
            expect(
                {k: (c.old, c.new) for k, c in changes.changed.items()},
                {
                    k: (want_before[k], v)
                    for k, v in want_after.items()
                    if k in want_before and want_before[k] != v
                },
                "diff: changed",
            )
    finally:
        store.close()
    return Measurement(statistics.median(times), extra={"max_ms": max(times)})


def prepare(cfg: Config) -> str:
    spec = _spec(cfg)
    start = time.perf_counter()
    path, meta, generated = ensure_log(spec, cfg.cache_dir)
    cfg.shared["tt_log"] = path
    how = f"generated in {time.perf_counter() - start:.0f} s" if generated else "cached"
    note = (
        f"one instance, {spec.supersteps:,} supersteps, {meta['events']:,} events, "
        f"{len(spec.runs())} runs ({how}: {path.name})"
    )
    snap_path, snap_note = _ensure_snapshots(cfg, path)
    cfg.shared["tt_snap_log"] = snap_path
    return f"{note}; {snap_note}"


def _ensure_snapshots(cfg: Config, log: Path) -> tuple[Path, str]:
    """A copy of the log with ``SnapshotView``, ``KeyIndexView`` and ``HistoryView`` built by
    ``Projector.catch_up`` (cached, keyed by the projections code, so a change to it rebuilds
    them)."""
    root = Path(__file__).resolve().parent.parent / "projections"
    digest = hashlib.sha256()
    for source in sorted(root.glob("*.py")):
        digest.update(source.read_bytes())
    path = log.with_name(f"{log.stem}-snap{SNAPSHOT_EVERY}h-{digest.hexdigest()[:10]}.db")
    if path.exists():
        return path, (
            f"snapshots every {SNAPSHOT_EVERY} supersteps, the key index and the history view "
            "(cached)"
        )
    for old in log.parent.glob(f"{log.stem}-snap*.db"):
        remove_sqlite(old)
    partial = path.with_suffix(".partial")
    remove_sqlite(partial)
    shutil.copyfile(log, partial)
    start = time.perf_counter()
    store = open_store(f"sqlite:///{partial}")
    try:
        views = [p.SnapshotView(SNAPSHOT_EVERY), p.KeyIndexView(), p.HistoryView()]
        p.Projector(store, views, page_size=1000).catch_up()
    finally:
        store.close()
    sqlite_bytes(partial)  # checkpoint the WAL into the file before it is renamed
    partial.rename(path)
    for suffix in ("-wal", "-shm"):
        Path(f"{partial}{suffix}").unlink(missing_ok=True)
    return path, (
        f"snapshots every {SNAPSHOT_EVERY} supersteps, the key index and the history view "
        "built in "
        f"{time.perf_counter() - start:.0f} s"
    )


BENCHMARK = Benchmark(
    name="timetravel",
    title="4. Time travel at 100,000 supersteps",
    description=(
        "Latency of one query at a random superstep (median over the samples of a run, then "
        "the median over runs). The full fold streams the instance up to the point in pages of "
        f"{FOLD_PAGE} (store.read(after, upto, limit)) and folds each page: the cost without "
        "snapshots."
    ),
    metric="ms per query",
    higher_is_better=False,
    baseline=FULL_FOLD,
    extra_columns=[("max_ms", "max ms")],
    max_repeat=3,
    prepare=prepare,
    cases=[
        Case(SNAPSHOTS, steplog_as_of_snapshots, steplog=True),
        Case("steplog state as of superstep (no snapshots)", steplog_as_of_plain, steplog=True),
        Case(BLAME, steplog_blame, steplog=True),
        Case(BLAME_SCAN, steplog_blame_scan, steplog=True),
        Case("steplog diff of two distant points", steplog_diff, steplog=True),
        Case(FULL_FOLD, full_fold),
        Case("raw sqlite3 + orjson fold up to the point", raw_fold),
    ],
    targets=[
        Target("as-of with snapshots: median < 5 ms", SNAPSHOTS, "<=", 5.0),
        Target("as-of with snapshots < 1% of a full fold", SNAPSHOTS, "<=", 0.01, FULL_FOLD),
        Target("blame of one key (key index) <= 50 ms", BLAME, "<=", 50.0),
    ],
)
