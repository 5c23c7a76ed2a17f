"""Big synthetic logs for the rebuild and time-travel benchmarks, appended through steplog's
store in bulk (no workflow runs) and cached under ``bench/.cache/``.

Each instance's history is a series of runs of ``run_length`` supersteps. Superstep ``g`` (counted
across the instance's runs) is executor a/b alternating: started, invoked, two state writes
(``a = g`` and a second key), one message, completed, committed. Every fifth run fails in its
last superstep (``superstep_aborted`` + ``run_failed``), so a correct fold must drop that
superstep's writes. The events are made by ``kernel.testing.LogBuilder`` (unvalidated, its fast
path). The expected final state of every instance is computed while generating and kept in the
file's ``bench_meta`` table, with the sizes; a cache file is reused only when its parameters, the
event model, the row format and the builder (a hash of kernel/_log/_events.py, the row format's
modules in kernel/_codec/ and kernel/testing.py) match.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import random
import sqlite3
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

from bench._db import remove_sqlite

__all__ = ["LogSpec", "ensure_log", "read_meta", "state_digest"]

GENERATOR_VERSION = 2
EVENTS_PER_SUPERSTEP = 7
BASE_TIME = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True)
class LogSpec:
    name: str
    instances: int
    supersteps: int  # per instance
    run_length: int
    key_mod: int | None = None
    """None: the second key is ``b``; else ``k{g % key_mod}`` (many keys, for blame and diff)."""
    fail_every: int = 5

    def second_key(self, g: int) -> str:
        return "b" if self.key_mod is None else f"k{g % self.key_mod}"

    def runs(self) -> list[tuple[int, int, bool]]:
        """(first superstep, last superstep, failed?) of each run of one instance."""
        out = []
        first, r = 1, 0
        while first <= self.supersteps:
            last = min(first + self.run_length - 1, self.supersteps)
            out.append((first, last, (r + 1) % self.fail_every == 0))
            first, r = last + 1, r + 1
        return out

    def type_counts(self) -> dict[str, int]:
        """How many events of each ``type`` one instance's stream holds."""
        runs = len(self.runs())
        failed = sum(failed for _, _, failed in self.runs())
        s = self.supersteps
        return {
            "run_started": runs,
            "superstep_started": s,
            "executor_invoked": s,
            "state_staged": 2 * s,
            "message_staged": s,
            "executor_completed": s,
            "superstep_committed": s - failed,
            "superstep_aborted": failed,
            "run_completed": runs - failed,
            "run_failed": failed,
        }

    def events_per_instance(self) -> int:
        return self.supersteps * EVENTS_PER_SUPERSTEP + 2 * len(self.runs())

    def end_position(self, g: int) -> int:
        """Stream position of superstep ``g``'s marker (committed or aborted)."""
        position = 0
        for first, last, _ in self.runs():
            position += 1  # run_started
            if g <= last:
                return position + (g - first + 1) * EVENTS_PER_SUPERSTEP
            position += (last - first + 1) * EVENTS_PER_SUPERSTEP + 1  # + run end
        raise ValueError(f"superstep {g} beyond {self.supersteps}")

    def committed(self, g: int) -> bool:
        return not any(failed and g == last for _, last, failed in self.runs())

    def state_at(self, g: int) -> dict[str, int]:
        """Expected committed state after superstep ``g`` (straight from the definition)."""
        state: dict[str, int] = {}
        aborted = {last for _, last, failed in self.runs() if failed}
        for h in range(1, g + 1):
            if h not in aborted:
                state["a"] = h
                state[self.second_key(h)] = h
        return state


def _append_all(store: Any, batches: list[tuple[str, list[Any], int]]) -> None:
    """Append ``batches`` in one transaction; a fresh log has no conflicts."""
    for outcome in store.append_many(batches):
        if isinstance(outcome, Exception):
            raise outcome


def _model_hash() -> str:
    kernel = Path(__file__).resolve().parent.parent / "kernel"
    digest = hashlib.sha256()
    for name in (
        "_log/_events.py",
        "_codec/_rows.py",
        "_codec/_hashing.py",
        "_codec/_upcast.py",
        "_codec/_mapper.py",
        "testing.py",
    ):
        path = kernel / name
        digest.update(path.read_bytes() if path.exists() else b"")
    return digest.hexdigest()[:12]


def state_digest(states: dict[str, dict[str, Any]]) -> str:
    """A digest of every instance's committed values, independent of dict order."""
    blob = orjson.dumps({k: states[k] for k in sorted(states)}, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(blob).hexdigest()


def _instance_events(spec: LogSpec, instance: str, rng: random.Random) -> Iterator[list[Any]]:
    """The instance's events, one list per superstep (run start/end folded into neighbours)."""
    from kernel import ErrorInfo
    from kernel.testing import LogBuilder

    def new_id() -> str:
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))

    when = [BASE_TIME]
    log = LogBuilder(instance, clock=lambda: when[0], ids=new_id, validate=False)
    error = ErrorInfo(type="RuntimeError", message="injected failure")
    for first, last, failed in spec.runs():
        when[0] = BASE_TIME + dt.timedelta(milliseconds=first)
        log.start_run(first, workflow_name="bench-loop", owner="bench:0")
        for g in range(first, last + 1):
            executor = "a" if g % 2 else "b"
            when[0] = BASE_TIME + dt.timedelta(milliseconds=g)
            log.start_superstep()
            log.invoke(executor)
            log.write("a", g)
            log.write(spec.second_key(g), g)
            log.send(g + 1, targets=["b" if g % 2 else "a"])
            log.complete()
            if failed and g == last:
                log.abort("failed", error=error)
                log.fail_run(error, executor_id=executor)
            else:
                log.commit()
                if g == last:
                    log.complete_run()
            (batch,) = log.drain()
            yield batch


def read_meta(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        row = conn.execute("SELECT value FROM bench_meta WHERE key = 'meta'").fetchone()
    except sqlite3.Error:
        return None
    finally:
        conn.close()
    return json.loads(row[0]) if row else None


def ensure_log(
    spec: LogSpec, cache_dir: Path, *, batch_supersteps: int = 500
) -> tuple[Path, dict[str, Any], bool]:
    """The cached log for ``spec`` (generated if missing or stale): (path, meta, generated?)."""
    from kernel import open_store

    tag = f"{spec.name}-i{spec.instances}-s{spec.supersteps}-g{GENERATOR_VERSION}-{_model_hash()}"
    path = cache_dir / f"{tag}.db"
    meta = read_meta(path)
    if meta is not None and meta.get("spec") == asdict(spec):
        return path, meta, False
    cache_dir.mkdir(parents=True, exist_ok=True)
    partial = cache_dir / f"{tag}.partial.db"
    remove_sqlite(partial)
    remove_sqlite(path)
    rng = random.Random(20260101)
    store = open_store(f"sqlite:///{partial.resolve()}")
    total = 0
    try:
        for i in range(spec.instances):
            instance = f"{spec.name}-{i:04d}"
            version = 0
            pending: list[tuple[str, list[Any], int]] = []
            # One row per superstep, as a run appends them; many rows per transaction.
            for n, batch in enumerate(_instance_events(spec, instance, rng), start=1):
                pending.append((instance, batch, version))
                version += len(batch)
                if n % batch_supersteps == 0:
                    _append_all(store, pending)
                    pending = []
            if pending:
                _append_all(store, pending)
            total += version
    finally:
        store.close()
    expected = {
        f"{spec.name}-{i:04d}": spec.state_at(spec.supersteps) for i in range(spec.instances)
    }
    meta = {"spec": asdict(spec), "events": total, "digest": state_digest(expected)}
    conn = sqlite3.connect(partial)
    try:
        conn.execute("CREATE TABLE bench_meta (key TEXT PRIMARY KEY, value TEXT)")
        conn.execute("INSERT INTO bench_meta VALUES ('meta', ?)", (json.dumps(meta),))
        conn.commit()
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    partial.rename(path)
    for suffix in ("-wal", "-shm"):
        Path(f"{partial}{suffix}").unlink(missing_ok=True)
    return path, meta, True
