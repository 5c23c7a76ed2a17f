"""Where the history rebuild's time goes: the rebuild benchmark's log read in stages, each stage
doing what the one before did and one thing more, in one process, the stages alternating.

    python -m bench.rebuild_floor [--repeat 3]

Stages (all over the log of ``python -m bench --only rebuild``, generated first if missing):

1. ``rows``: every row fetched, by rowid, a page at a time (as the raw fold reads them).
2. ``+ orjson.loads``: each row's JSON array parsed.
3. ``+ hash of each event``: every event's canonical bytes and BLAKE2b, each row's chain
   recomputed from the hash before it to its last (batch format 3 checks a row whole, so a read of
   any of its events pays for all of them; the codec's own check, ``decode_row(types=(),
   check_all=True)``), nothing built: what any checked read pays before building anything.
4. ``store.iter_all(types=RunHistory.EVENT_TYPES)``: today's read, every event decoded, its
   fields checked and built as an event object, and hash-checked.
5. ``+ RunHistory folds``: the rebuild benchmark's history case (in this process).

And beside them: ``raw fold`` (the rebuild benchmark's baseline, rows + orjson + the commit rule
on plain dicts) and ``folds alone`` (stage 5's folds over events decoded beforehand). Rates are
events in the log / seconds, as the rebuild benchmark counts them. Nothing here is asserted; it
measures what is left once reading and folding are separated (docs/benchmarks.md, issue 25).
"""

from __future__ import annotations

import argparse
import gc
import sqlite3
import statistics
import time
from collections.abc import Callable
from itertools import groupby
from operator import attrgetter
from pathlib import Path
from typing import Any

from bench._core import CACHE_DIR, Config, Sizes
from bench._logs import ensure_log
from bench.rebuild import _spec, child_raw_fold

__all__ = ["main"]

_PAGE = 1000
_QUERY = (
    "SELECT rowid, originator_id, originator_version, topic, state FROM steplog_events "
    "WHERE rowid > ? ORDER BY rowid LIMIT ?"
)


def _rows(path: Path, each: Callable[[str, int, str, bytes], None]) -> None:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    last = 0
    try:
        while True:
            rows = conn.execute(_QUERY, (last, _PAGE)).fetchall()
            if not rows:
                return
            for _, instance, version, topic, state in rows:
                each(instance, version, topic, state)
            last = rows[-1][0]
    finally:
        conn.close()


def stage_rows(path: Path) -> None:
    _rows(path, lambda *row: None)


def stage_loads(path: Path) -> None:
    import orjson

    loads = orjson.loads
    _rows(path, lambda instance, version, topic, state: loads(state))


def stage_hashes(path: Path) -> None:
    """Every event of every row hashed (the chain recomputed as a read of the history must: in
    batch format 3 a row is checked whole), nothing built: the codec's own check, with no type
    wanted (``decode_row(types=(), check_all=True)``)."""
    from kernel import open_store

    store = open_store(f"sqlite:///{path}", create=False)
    decode_row = store._mapper.decode_row
    try:
        _rows(
            path,
            lambda instance, last, topic, state: decode_row(
                instance, last, topic, state, types=(), check_all=True
            ),
        )
    finally:
        store.close()


def _light_reader(path: Path) -> Callable[[], Any]:
    """A prototype of a light decode, to measure what one would gain (not a way to read a log:
    it lives here, outside the codec, only to be timed). Each event of the history's hot types
    (superstep started and committed, executor invoked, state and message staged) becomes a
    named tuple with the event's attribute names, its row's interned strings resolved once for
    both its hash check and its fields, its fields' types checked as the codec checks them; the
    rare types (run starts and ends, aborts, forks) are decoded by the mapper as today. Yields
    pages of ``(instance_id, events)`` in log order."""
    import itertools
    from collections import namedtuple
    from datetime import timedelta

    from kernel import open_store
    from kernel._codec._fieldcheck import _checks
    from kernel._codec._hashing import CHAIN_BYTES, canonical, link, parse_chain
    from kernel._codec._rows import Stamps, fresh, layouts, parse_batch, row_count
    from projections import RunHistory

    hot = {
        "superstep_started",
        "executor_invoked",
        "state_staged",
        "message_staged",
        "superstep_committed",
    }
    wanted = RunHistory.EVENT_TYPES
    rare = wanted - hot
    kinds: dict[int, Any] = {}
    for layout in layouts()[1]:
        if layout is None or layout.type_name not in hot:
            continue
        if layout.version != layout.cls.SCHEMA_VERSION:
            continue
        light = namedtuple(  # type: ignore[misc]
            f"Light_{layout.type_name}",
            ("type", "instance_id", "position", "timestamp", *layout.names),
        )
        checks = [c for c in _checks(layout.cls) if c.name in layout.names]
        at = [layout.names.index(c.name) for c in checks]
        kinds[layout.code] = (
            layout,
            light,
            (lambda values, at=at: tuple(type(values[i]) for i in at)),
            frozenset(itertools.product(*(c.types for c in checks))),
            [(layout.names.index(c.name), c.values) for c in checks if c.values is not None],
        )

    def pages() -> Any:
        store = open_store(f"sqlite:///{path}", create=False)
        mapper = store._mapper  # the rare types, as today
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        last = 0
        try:
            while True:
                rows = conn.execute(_QUERY, (last, _PAGE)).fetchall()
                if not rows:
                    return
                page: list[Any] = []
                enabled = gc.isenabled()
                gc.disable()  # as the store's reads do (``bulk``): no collector passes while
                # a page is built
                for _, instance, version, topic, state in rows:
                    count = row_count(instance, version, topic)
                    first = version - count + 1
                    body = parse_batch("row", state, count)
                    batch_format = body[0]
                    chain = parse_chain("row", body[4], count, batch_format)
                    whole = batch_format != 2  # format 3: the row's chain is checked whole
                    head = chain[:CHAIN_BYTES]
                    stamps = Stamps("row", body[1], body[2], count)
                    strings, base, base_us = body[3], stamps.base, stamps.base_us
                    offset_us = stamps.offset_us
                    built = None
                    events: list[Any] = []
                    for i in range(count):
                        item = body[5 + i]
                        kind = kinds.get(item[0])
                        if kind is None:
                            if built is None:
                                built = {
                                    e.position: e
                                    for e in mapper.decode_row(
                                        instance,
                                        version,
                                        topic,
                                        state,
                                        types=rare,
                                        check_all=True,  # (format 3: the mapper checks the row)
                                    )
                                }
                            event = built.get(first + i)
                            if event is not None:
                                events.append(event)
                            continue
                        layout, light, types_of, combinations, values_in = kind
                        position = first + i
                        values = item[2:]
                        for n in layout.interned:
                            if n < len(values) and values[n] is not None:
                                values[n] = strings[values[n]]
                        end = len(values)
                        defaults = layout.defaults
                        while end and values[end - 1] == defaults[end - 1]:
                            end -= 1
                        delta = item[1]
                        stored = canonical(
                            layout.type_name,
                            layout.version,
                            instance,
                            position,
                            base_us + delta,
                            offset_us,
                            values[:end],
                        )
                        if whole:
                            head = link(head, stored)
                        else:
                            here = i * CHAIN_BYTES
                            if (
                                link(chain[here : here + CHAIN_BYTES], stored)
                                != chain[here + CHAIN_BYTES : here + 2 * CHAIN_BYTES]
                            ):
                                raise ValueError(f"{instance}#{position} does not match its hash")
                        for n in range(len(values), len(defaults)):
                            values.append(fresh(defaults[n]))
                        if types_of(values) not in combinations:
                            raise ValueError(f"{instance}#{position}: a field of the wrong type")
                        for n, allowed in values_in:
                            if values[n] not in allowed:
                                raise ValueError(f"{instance}#{position}: a field's value")
                        stamp = base + timedelta(0, 0, delta)
                        events.append(light(layout.type_name, instance, position, stamp, *values))
                    if whole and built is None and head != chain[-CHAIN_BYTES:]:
                        # (every event was hot and hashed here; a row with another was checked
                        # whole by the mapper)
                        raise ValueError(f"row {instance}#{first}..{version} does not match")
                    page.append((instance, events))
                if enabled:
                    gc.enable()
                yield page
                last = rows[-1][0]
        finally:
            conn.close()
            store.close()

    return pages


def stage_light(path: Path) -> None:
    for _ in _light_reader(path)():
        pass


def stage_light_folded(path: Path) -> dict[str, Any]:
    from projections import RunHistory

    views: dict[str, Any] = {}
    for page in _light_reader(path)():
        for instance, events in page:
            view = views.get(instance)
            if view is None:
                view = views[instance] = RunHistory()
            view.apply_all(events)
    return views


def _iter(path: Path) -> list[Any]:
    from kernel import open_store
    from projections import RunHistory

    store = open_store(f"sqlite:///{path}", create=False)
    try:
        return [r.event for r in store.iter_all(page_size=_PAGE, types=RunHistory.EVENT_TYPES)]
    finally:
        store.close()


def stage_decode(path: Path) -> None:
    from kernel import open_store
    from projections import RunHistory

    store = open_store(f"sqlite:///{path}", create=False)
    try:
        for _ in store.iter_all(page_size=_PAGE, types=RunHistory.EVENT_TYPES):
            pass
    finally:
        store.close()


def _fold(events: list[Any]) -> dict[str, Any]:
    from projections import RunHistory

    views: dict[str, Any] = {}
    for start in range(0, len(events), _PAGE):
        for instance, group in groupby(events[start : start + _PAGE], attrgetter("instance_id")):
            view = views.get(instance)
            if view is None:
                view = views[instance] = RunHistory()
            view.apply_all(list(group))
    return views


def stage_folded(path: Path) -> None:
    from bench.rebuild import child_steplog_state_history

    child_steplog_state_history(str(path), _PAGE)


STAGES: list[tuple[str, Callable[[Path], None]]] = [
    ("1. rows (sqlite3, by rowid)", stage_rows),
    ("2. + orjson.loads of each row", stage_loads),
    ("3. + hash of every event (each row checked whole)", stage_hashes),
    ("3a. prototype light decode (hash-checked, type-checked named tuples)", stage_light),
    ("3b. + RunHistory folds over them", stage_light_folded),
    ("4. store.iter_all(types=RunHistory.EVENT_TYPES): decoded, checked, built", stage_decode),
    ("5. + RunHistory folds (the rebuild benchmark's history case)", stage_folded),
]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.rebuild_floor")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", default="", help="only the stages whose name has this")
    options = parser.parse_args(argv)
    spec = _spec(Config(Sizes(), smoke=False, repeat=1, workdir=CACHE_DIR))
    path, meta, _ = ensure_log(spec, CACHE_DIR)
    events = meta["events"]
    stages = [(name, stage) for name, stage in STAGES if options.only in name]
    times: dict[str, list[float]] = {name: [] for name, _ in stages}
    times["raw fold (the rebuild benchmark's baseline)"] = []
    times["folds alone (events decoded beforehand)"] = []
    for _ in range(options.repeat):
        for name, stage in stages:
            began = time.perf_counter()
            stage(path)
            times[name].append(time.perf_counter() - began)
        times["raw fold (the rebuild benchmark's baseline)"].append(
            child_raw_fold(str(path), _PAGE)["seconds"]
        )
        decoded = _iter(path)
        gc.collect()
        began = time.perf_counter()
        _fold(decoded)
        times["folds alone (events decoded beforehand)"].append(time.perf_counter() - began)
        del decoded
        gc.collect()
    raw = statistics.median(times["raw fold (the rebuild benchmark's baseline)"])
    print(f"log: {path.name}, {events:,} events; medians of {options.repeat} (min-max)")
    print(f"{'stage':<78} {'seconds':>16} {'events/s':>10} {'x raw':>6}")
    for name, spent in times.items():
        median = statistics.median(spent)
        print(
            f"{name:<78} {median:7.2f} ({min(spent):.2f}-{max(spent):.2f}) "
            f"{events / median:>10,.0f} {raw / median:6.3f}"
        )


if __name__ == "__main__":
    main()
