"""Snapshots of an instance's folded view (``kernel._run._snapshot``): taken by the run that holds
the lease, read by every open, checked against the chain, and never an answer of their own.

Whatever a snapshot holds, an open with it decides what an open of the whole log decides
(``tests/model/snapshots.views_of``; the model-based test checks that after every step of its
random, disorderly histories, with a snapshot at every committed superstep). Here: when they are
taken, that an open reads only the tail, and that a bad one is ignored for a reason and changes
no answer.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
from pathlib import Path
from typing import Any

import pytest

from kernel import (
    ConvergenceError,
    EventStore,
    Executor,
    Keyring,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    handler,
    open_store,
)
from kernel._run._snapshot import SnapshotUnusable, decode_snapshot, snapshot_header
from tests.model.snapshots import views_of

INSTANCE = "snap"


class Loop(Executor):
    """Each superstep writes ``a`` and ``b`` and sends the next count; at ``n`` yields it."""

    def __init__(self, id: str, n: int) -> None:
        super().__init__(id=id)
        self.n = n

    @handler
    async def step(self, message: int, ctx: WorkflowContext[int, int]) -> None:
        if message >= self.n:
            await ctx.yield_output(message)
            return
        ctx.set_state("a", message)
        ctx.set_state("b", message)
        await ctx.send_message(message + 1)


def loop(
    store: EventStore, n: int, *, every: int = 1000, limit: int = 100, extra: bool = False
) -> Workflow:
    a, b = Loop("a", n), Loop("b", n)
    builder = WorkflowBuilder(
        start_executor=a, store=store, instance_id=INSTANCE, max_supersteps=limit
    )
    builder = builder.add_edge(a, b).add_edge(b, a)
    if extra:  # another graph: one more executor
        builder = builder.add_edge(b, Loop("c", n))
    return builder.with_snapshots(every=every).build()


async def stopped(store: EventStore, steps: int, every: int = 1000) -> None:
    """The loop towards ``steps + 2``, stopped by its superstep limit after ``steps``."""
    with pytest.raises(ConvergenceError):
        await loop(store, steps + 2, every=every, limit=steps).run(0)


def position_of_snapshot(store: EventStore) -> int | None:
    text = store.read_snapshot(INSTANCE)
    return None if text is None else snapshot_header(text)[0]


# -- when they are taken ----------------------------------------------------------------------


async def test_a_run_keeps_one_every_k_supersteps_and_at_its_end(store_url: str) -> None:
    with open_store(store_url) as store:
        taken: list[int | None] = []
        write = store.write_snapshot

        def spy(instance_id: str, text: str) -> None:
            write(instance_id, text)
            taken.append(snapshot_header(text)[0])

        store.write_snapshot = spy  # type: ignore[method-assign]
        result = await loop(store, 12, every=5).run(0)
        assert result.get_outputs() == [12]
        assert len(taken) == 3  # after supersteps 5 and 10, and at the end (13)
        assert taken[-1] == store.version(INSTANCE) == position_of_snapshot(store)


async def test_without_snapshots_no_ledger_is_kept_between_runs(store_url: str) -> None:
    """Only a snapshot prunes the ledger an instance keeps folded; with none (``every=0``) the
    instance keeps none, so its memory does not grow with every checkpoint it commits."""
    with open_store(store_url) as store:
        wf = loop(store, 12, every=0)
        assert (await wf.run(0)).get_outputs() == [12]
        assert wf._instance._ledger is None
        head, ledger = wf._instance.catch_up_ledger()
        assert len(ledger.checkpoints) == 13
        assert head.version == store.version(INSTANCE)
        assert wf._instance._ledger is None
        assert store.read_snapshot(INSTANCE) is None
        kept = loop(store, 12)  # with snapshots: kept, and pruned at each one
        assert (await kept.run(0)).get_outputs() == [12]
        assert kept._instance._ledger is not None
        assert kept._instance._ledger.pruned


async def test_reading_never_writes_one(sqlite_url: str) -> None:
    with open_store(sqlite_url) as store:
        await stopped(store, 6, every=0)  # a log without snapshots
        assert store.read_snapshot(INSTANCE) is None
        wf = loop(store, 8)
        assert wf.committed_state() == {"a": 5, "b": 5}
        assert [c.status for c in wf.checkpoints()][-1] == "resumable"
        assert wf.pending_requests() == []
        assert store.read_snapshot(INSTANCE) is None
        await wf.resume()  # a run: it holds the lease, and keeps one at its end
        assert position_of_snapshot(store) == store.version(INSTANCE)


# -- what an open reads -------------------------------------------------------------------------


async def test_an_open_reads_only_the_log_after_the_snapshot(store_url: str) -> None:
    with open_store(store_url) as store:
        await stopped(store, 30, every=7)
        kept = position_of_snapshot(store)
        assert kept == store.version(INSTANCE)
        reads: list[int] = []
        read = store.read

        def spy(instance_id: str, **options: Any) -> Any:
            reads.append(options.get("after", 0))
            return read(instance_id, **options)

        store.read = spy  # type: ignore[method-assign]
        wf = loop(store, 32, limit=40)
        result = await wf.resume()
        assert result.get_outputs() == [32]
        assert wf.committed_state() == {"a": 31, "b": 31}
        assert reads
        assert min(reads) >= kept  # nothing before the snapshot was read
        assert wf._instance.snapshot_note == f"used, folded to position {kept}"


async def test_an_open_with_a_snapshot_decides_what_the_whole_log_decides(store_url: str) -> None:
    with open_store(store_url) as store:
        await stopped(store, 9, every=4)
        wf = loop(store, 11)
        with_snapshot, note = views_of(wf, snapshots=True)
        assert note.startswith("used")
        assert with_snapshot == views_of(wf, snapshots=False)[0]
        # a new run with a message, then a resume of it, after the snapshot of each
        assert (await loop(store, 2).run(5)).get_outputs() == [5]
        assert views_of(wf, snapshots=True)[0] == views_of(wf, snapshots=False)[0]


# -- bad snapshots are ignored, and change no answer ---------------------------------------------


def _header_field(text: str, index: int, value: str) -> str:
    header, body = text.split("\n", 1)
    fields = header.split(" ")
    fields[index] = value
    return " ".join(fields) + "\n" + body


def _flip_body(text: str) -> str:
    header, body = text.split("\n", 1)
    raw = bytearray(base64.b64decode(body))
    raw[len(raw) // 2] ^= 0x01
    return header + "\n" + base64.b64encode(bytes(raw)).decode()


BAD = {
    "stale": (lambda t: _header_field(t, 2, str(int(t.split(" ")[2]) + 50)), "no row ending"),
    "another chain hash": (lambda t: _header_field(t, 3, "00" * 16), "no row ending"),
    "an older position": (lambda t: _header_field(t, 2, "3"), "no row ending"),
    "corrupt": (_flip_body, "does not match its digest"),
    "another format": (lambda t: _header_field(t, 1, "99"), "format 99"),
    "a malformed header": (lambda t: "garbage\n" + t.split("\n", 1)[1], "header is malformed"),
    "not base64": (lambda t: t.split("\n", 1)[0] + "\n%%%", "not base64"),
    # a position no database integer holds, or none at all: never handed to the store
    "a position past any log": (lambda t: _header_field(t, 2, "9" * 23), "which no log has"),
    "position 0": (lambda t: _header_field(t, 2, "0"), "which no log has"),
    "a negative position": (lambda t: _header_field(t, 2, "-5"), "which no log has"),
    "a short chain hash": (lambda t: _header_field(t, 3, "00" * 3), "is not a hash"),
}


@pytest.mark.parametrize("bad", sorted(BAD))
async def test_a_bad_snapshot_is_ignored_for_a_reason_and_changes_nothing(
    sqlite_url: str, bad: str
) -> None:
    mutate, reason = BAD[bad]
    with open_store(sqlite_url) as store:
        await stopped(store, 8)
        truth = views_of(loop(store, 10), snapshots=False)[0]
        store.write_snapshot(INSTANCE, mutate(store.read_snapshot(INSTANCE) or ""))
        wf = loop(store, 10, limit=20)
        views, note = views_of(wf, snapshots=True)
        assert note.startswith("ignored: "), note
        assert reason in note, note
        assert views == truth
        result = await wf.resume()
        assert result.get_outputs() == [10]
        assert wf.committed_state() == {"a": 9, "b": 9}


async def test_a_store_that_reads_broken_chains_reads_no_snapshot(sqlite_url: str) -> None:
    with open_store(sqlite_url) as store:
        await stopped(store, 8)
        assert store.read_snapshot(INSTANCE) is not None
        truth = views_of(loop(store, 10), snapshots=False)[0]
    with open_store(sqlite_url, allow_broken_chain=True) as store:
        views, note = views_of(loop(store, 10), snapshots=True)
        assert note == "not read: the store was opened with allow_broken_chain"
        assert views == truth


async def test_a_snapshot_over_another_graph_is_ignored(sqlite_url: str) -> None:
    with open_store(sqlite_url) as store:
        await stopped(store, 8)
        other = loop(store, 10, extra=True)
        views, note = views_of(other, snapshots=True)
        assert note == "ignored: it was folded over another graph"
        assert views == views_of(other, snapshots=False)[0]


async def test_a_snapshot_of_another_instance_is_refused(sqlite_url: str) -> None:
    with open_store(sqlite_url) as store:
        await stopped(store, 4)
        text = store.read_snapshot(INSTANCE)
        assert text is not None
        graph = loop(store, 6)._instance.router.graph
        decode_snapshot(text, INSTANCE, graph, None)  # it serves its own instance
        with pytest.raises(SnapshotUnusable, match=r"does not match|of instance 'snap'"):
            decode_snapshot(text, "other", graph, None)


async def test_a_snapshot_is_sealed_like_rows_and_never_trusted_plain(sqlite_url: str) -> None:
    keyring = Keyring.from_text(Keyring.generate())
    with open_store(sqlite_url, keyring=keyring) as store:
        await stopped(store, 8)
        text = store.read_snapshot(INSTANCE)
        assert text is not None
        assert text.split("\n")[0].endswith(" 1")  # sealed
        assert b'"a":7' not in base64.b64decode(text.split("\n", 1)[1])
        assert views_of(loop(store, 10), snapshots=True)[1].startswith("used")
        # a body altered, with its digest made to match, does not open
        header, body = text.split("\n", 1)
        raw = bytearray(base64.b64decode(body))
        raw[-5] ^= 0x01
        forged_body = base64.b64encode(bytes(raw)).decode()
        forged = _header_field(
            header + "\n" + forged_body, 4, hashlib.sha256(bytes(raw)).hexdigest()
        )
        store.write_snapshot(INSTANCE, forged)
        views, note = views_of(loop(store, 10), snapshots=True)
        assert note.startswith("ignored: it does not open"), note
        assert views == views_of(loop(store, 10), snapshots=False)[0]
    # the plain snapshot of a store without keys, put into one with keys, is not trusted
    plain_url = sqlite_url.replace("steplog.db", "plain.db")
    with open_store(plain_url) as plain:
        await stopped(plain, 8)
        plain_text = plain.read_snapshot(INSTANCE)
    with open_store(sqlite_url, keyring=keyring) as store:
        store.write_snapshot(INSTANCE, plain_text or "")
        _, note = views_of(loop(store, 10), snapshots=True)
        assert note.startswith("ignored: "), note  # another chain, and plain


async def test_deleting_every_snapshot_changes_nothing_but_speed(
    sqlite_url: str, tmp_path: Path
) -> None:
    with open_store(sqlite_url) as store:
        await stopped(store, 12, every=5)
    copy = tmp_path / "copy.db"
    shutil.copyfile(sqlite_url.removeprefix("sqlite:///"), copy)
    outcomes = []
    for url, every in ((sqlite_url, 1000), (f"sqlite:///{copy}", 0)):
        with open_store(url) as store:
            if every == 0:
                store.drop_snapshots()
                assert store.read_snapshot(INSTANCE) is None
            wf = loop(store, 14, every=every, limit=30)
            result = await wf.resume()
            outcomes.append((result.get_outputs(), result.status, wf.committed_state()))
            outcomes.append([(c.index, c.status) for c in wf.checkpoints()])
    assert outcomes[0:2] == outcomes[2:4]
