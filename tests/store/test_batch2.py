"""Rows of batch format 2 (a full hash per event) keep reading and verifying after format 3.

``tests/data/batch2.db`` was written by ``tests/data/make_format1_log.py`` at 8d05325, the last
steplog that wrote batch format 2; ``batch2.json`` holds its events as they were written
(``model_dump(mode="json")`` then). Today's steplog reads them exactly, verifies their chain,
names an edited event by its own hash (each event of a format-2 row is checked alone), appends
rows of format 3 after them that link up with them, and reads them sealed.
"""

from __future__ import annotations

import base64
import shutil
import sqlite3
from pathlib import Path

import orjson
import pytest

from kernel import DecodeError, Keyring, LogIntegrityError, open_store
from kernel._codec._hashing import CHAIN_BYTES
from kernel._codec._mapper import RowMapper
from kernel._codec._rows import BATCH_CODES, place
from kernel.testing import LogBuilder
from projections import fold_committed

DATA = Path(__file__).parent.parent / "data"
CODE = {name: code for code, (name, _) in enumerate(BATCH_CODES)}


@pytest.fixture
def old_log(tmp_path: Path) -> Path:
    """A private copy of ``batch2.db`` (tests that write must not touch the committed file)."""
    copy = tmp_path / "batch2.db"
    shutil.copyfile(DATA / "batch2.db", copy)
    return copy


def rows_of(path: Path, instance: str) -> list[tuple[int, str, bytes]]:
    with sqlite3.connect(path) as db:
        return db.execute(
            "SELECT originator_version, topic, state FROM steplog_events "
            "WHERE originator_id = ? ORDER BY originator_version",
            (instance,),
        ).fetchall()


def put(path: Path, instance: str, last: int, state: bytes) -> None:
    with sqlite3.connect(path) as db:
        db.execute(
            "UPDATE steplog_events SET state = ? "
            "WHERE originator_id = ? AND originator_version = ?",
            (state, instance, last),
        )


def test_a_batch2_log_reads_exactly_as_it_was_written_and_verifies(old_log: Path) -> None:
    written = orjson.loads((DATA / "batch2.json").read_bytes())
    assert {orjson.loads(state)[0] for _, _, state in rows_of(old_log, "counting")} == {2}
    with open_store(f"sqlite:///{old_log}", create=False) as store:
        read = [e.model_dump(mode="json") for i in store.instances() for e in store.read(i)]
        assert read == written
        assert len(store.read_all(limit=1000)) == len(written)
        assert [e.position for e in store.read("counting", after=3, upto=7)] == [4, 5, 6, 7]
        report = store.verify_chain()
        assert report.verified, report.problems  # every event checked against its hash
        assert report.events == len(written)


def test_a_writer_appends_format3_rows_that_link_up_with_format2_ones(old_log: Path) -> None:
    with open_store(f"sqlite:///{old_log}") as store:
        before = store.read("counting")
        exported = store.chain_head("counting")
        log = LogBuilder("counting", version=len(before))
        log.start_run()
        log.start_superstep()
        log.invoke("counter")
        log.write("count", 99)
        log.commit()
        log.append_to(store)
        after = store.read("counting")
        assert after[: len(before)] == before
        assert fold_committed(after).values["count"] == 99
        assert exported is not None
        report = store.verify_chain(heads=[exported])  # the old head still vouches for its part
        assert report.verified, report.problems
    formats = [orjson.loads(state)[0] for _, _, state in rows_of(old_log, "counting")]
    assert formats == [2] * 9 + [3]


def test_an_edit_in_a_format2_row_is_named_at_its_event_checked_alone(old_log: Path) -> None:
    last, topic, state = rows_of(old_log, "counting")[1]  # #3..10
    body = orjson.loads(state)
    index = next(i for i, item in enumerate(body) if i > 4 and item[0] == CODE["state_staged"])
    position = last - int(topic) + 1 + index - 5
    body[index][-1] = 12345
    tampered = orjson.dumps(body)
    mapper = RowMapper()
    with pytest.raises(LogIntegrityError, match=f"'counting'#{position} ") as caught:
        mapper.decode_row("counting", last, topic, tampered)
    assert (caught.value.position, caught.value.kind) == (position, "edited")
    # Each event of a format-2 row is checked alone: the events before the edit still read.
    earlier = mapper.decode_row("counting", last, topic, tampered, upto=position - 1)
    assert [e.position for e in earlier] == list(range(last - int(topic) + 1, position))
    put(old_log, "counting", last, tampered)
    with open_store(f"sqlite:///{old_log}", create=False) as store:
        problems = store.verify_chain().problems
        assert [(p.instance_id, p.position, p.kind) for p in problems] == [
            ("counting", position, "edited")
        ]
        with pytest.raises(LogIntegrityError):
            store.read("counting")


def test_a_rewritten_marker_in_a_format2_row_is_named_as_one(old_log: Path) -> None:
    last, topic, state = rows_of(old_log, "counting")[1]
    body = orjson.loads(state)
    index = next(
        i for i, item in enumerate(body) if i > 4 and item[0] == CODE["superstep_committed"]
    )
    body[index] = [CODE["superstep_aborted"], *body[index][1:], "failed"]
    with pytest.raises(LogIntegrityError, match="marker was rewritten") as caught:
        RowMapper().decode_row("counting", last, topic, orjson.dumps(body))
    assert caught.value.position == last - int(topic) + 1 + index - 5


def test_a_format2_chain_of_the_wrong_length_is_a_decode_error(old_log: Path) -> None:
    last, topic, state = rows_of(old_log, "counting")[0]
    body = orjson.loads(state)
    chain = base64.b64decode(body[4])
    assert len(chain) == CHAIN_BYTES * (int(topic) + 1)  # format 2: a hash per event, and one
    body[4] = base64.b64encode(chain[:CHAIN_BYTES]).decode()
    with pytest.raises(DecodeError, match="1 hashes in its chain; 2 events need 3"):
        RowMapper().decode_row("counting", last, topic, orjson.dumps(body))


def test_sealed_format2_rows_open_and_check() -> None:
    """Encryption seals whatever a row's format is: a format-2 row sealed reads as it did plain,
    and altering the sealed bytes breaks the seal."""
    keyring = Keyring.from_text(Keyring.generate())
    mapper = RowMapper(keyring=keyring)
    for last, topic, state in rows_of(DATA / "batch2.db", "asking"):
        sealed = keyring.seal(state, place("asking", last, topic))
        assert mapper.decode_row("asking", last, topic, sealed) == RowMapper().decode_row(
            "asking", last, topic, state
        )
        assert mapper.row_link("asking", last, topic, sealed) == RowMapper().row_link(
            "asking", last, topic, state
        )
    broken = sealed[:-1] + bytes([sealed[-1] ^ 1])
    with pytest.raises(LogIntegrityError) as caught:
        mapper.decode_row("asking", last, topic, broken)
    assert caught.value.kind == "seal broken"
