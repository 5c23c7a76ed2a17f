"""Logs written in older storage formats and event schemas stay readable, exactly.

``tests/data/format1.db`` was written by steplog before the compact format (one row per event;
see ``tests/data/make_format1_log.py``, run at f4eb7de); ``batch1.db`` by the same script at
75b6c66, in batch rows of format 1, before the hash chain. Both hold ``run_started`` events of
schema version 1, from before sensitive keys: read today, they are upcast to version 2 (by
``KERNEL_UPCASTERS``, from the frozen field list of their batch code in ``batch1.db``). Each
``.json`` holds the events as they were written (``model_dump(mode="json")`` then).
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import orjson
import pytest

from kernel import (
    DecodeError,
    EventStore,
    RunStarted,
    SchemaVersionError,
    StateStaged,
    SuperstepCommitted,
    open_store,
)
from kernel._codec._mapper import RowMapper
from kernel.testing import LogBuilder
from projections import fold_committed

DATA = Path(__file__).parent.parent / "data"


@pytest.fixture(params=["format1", "batch1"])
def old_log(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """A private copy of an old log (tests that write must not touch the committed file)."""
    copy = tmp_path / f"{request.param}.db"
    shutil.copyfile(DATA / f"{request.param}.db", copy)
    return copy


def expected(old_log: Path) -> list[dict[str, object]]:
    """The events of ``old_log`` as written, upcast as today's steplog reads them."""
    loaded: list[dict[str, object]] = orjson.loads(
        (DATA / old_log.name).with_suffix(".json").read_bytes()
    )
    for event in loaded:
        if event["type"] == "run_started":
            assert event["schema_version"] == 1
            event["schema_version"] = 2
            event["sensitive_keys"] = []
        elif event["type"] == "output_yielded":
            assert "designation" not in event
            event["designation"] = "output"  # a trailing default, added since: read as its default
        elif event["type"] == "message_staged":
            assert "gathered" not in event
            event["gathered"] = {}  # likewise
            assert "dropped" not in event
            event["dropped"] = None  # the same
    return loaded


def dumped(store: EventStore) -> list[dict[str, object]]:
    return [e.model_dump(mode="json") for i in store.instances() for e in store.read(i)]


def stamp(path: Path) -> str:
    with sqlite3.connect(path) as db:
        return str(db.execute("SELECT value FROM steplog_meta").fetchone()[0])


def test_a_format1_log_reads_exactly_as_it_was_written(old_log: Path) -> None:
    with open_store(f"sqlite:///{old_log}", create=False) as store:
        assert dumped(store) == expected(old_log)
        page = store.read_all(limit=1000)
        assert [r.event.model_dump(mode="json") for r in page] != []
        assert len(page) == len(expected(old_log))
        assert [r.global_position for r in page] == sorted({r.global_position for r in page})
        assert store.last_position() == page[-1].global_position
        windows = [e.position for e in store.read("counting", after=3, upto=7)]
        assert windows == [4, 5, 6, 7]
        typed = store.read("counting", types=["state_staged"])
        assert typed
        assert all(isinstance(e, StateStaged) for e in typed)
    assert stamp(old_log) == ("1" if old_log.stem == "format1" else "2")  # readers never restamp


def test_a_writer_restamps_and_appends_batch_rows_after_the_old_ones(old_log: Path) -> None:
    with open_store(f"sqlite:///{old_log}") as store:
        before = store.read("counting")
        version = store.version("counting")
        log = LogBuilder("counting", version=version)
        log.start_run()
        log.start_superstep()
        log.invoke("counter")
        log.write("count", 99)
        log.commit()
        log.append_to(store)
        after = store.read("counting")
        assert after[: len(before)] == before
        assert [e.position for e in after] == list(range(1, version + 6))
        assert fold_committed(after).values["count"] == 99
        assert fold_committed(before).values["count"] == 2  # the second run failed at 3
        assert isinstance(after[-1], SuperstepCommitted)
        page = store.read_all(limit=10_000)
        assert [r.event for r in page if r.event.instance_id == "counting"] == after
        assert page[-1].global_position == store.last_position()
    assert stamp(old_log) == "3"
    with sqlite3.connect(old_log) as db:
        rows = db.execute(
            "SELECT topic FROM steplog_events WHERE originator_id = 'counting' ORDER BY rowid"
        ).fetchall()
    assert rows[-1] == ("5",)  # the new batch: one row of five events
    if old_log.stem == "format1":
        assert all("@" in topic for (topic,) in rows[:-1])
    with open_store(f"sqlite:///{old_log}", create=False) as store:
        report = store.verify_chain("counting")
        assert report.ok, report.problems
        assert report.unchained_events == version  # the old rows predate the chain
        head = store.chain_head("counting")
        assert head is not None
        assert head.position == version + 5


def test_a_store_stamped_by_a_newer_steplog_is_refused(old_log: Path) -> None:
    with sqlite3.connect(old_log) as db:
        db.execute("UPDATE steplog_meta SET value = '4'")
    with pytest.raises(SchemaVersionError, match="newer steplog"):
        open_store(f"sqlite:///{old_log}", create=False)


def test_an_upcaster_that_gives_other_fields_is_a_decode_error_naming_the_event() -> None:
    """An old event is read by its frozen field list and upcast; what the upcaster returns must be
    exactly the current fields, or the event is refused, never built half-filled."""
    with sqlite3.connect(DATA / "batch1.db") as db:
        last, topic, state = db.execute(
            "SELECT originator_version, topic, state FROM steplog_events "
            "WHERE originator_id = 'counting' ORDER BY originator_version LIMIT 1"
        ).fetchone()
    good = RowMapper().decode_row("counting", last, topic, state)[0]
    assert isinstance(good, RunStarted)
    assert (good.schema_version, good.sensitive_keys) == (2, [])
    extra = RowMapper(upcasters={("run_started", 1): lambda p: {**p, "bogus": 1}})
    with pytest.raises(DecodeError, match=r"'counting'#1 \(run_started\) once upcast has fields"):
        extra.decode_row("counting", last, topic, state)
    failing = RowMapper(upcasters={("run_started", 1): lambda p: 1 / 0})
    with pytest.raises(DecodeError, match="upcaster of run_started from schema version 1 failed"):
        failing.decode_row("counting", last, topic, state)
