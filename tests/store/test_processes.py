"""Several processes on one durable store (SQLite file, PostgreSQL schema)."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernel import EventStore, Recorded, open_store

WORKER = Path(__file__).with_name("_append_worker.py")
WAIT = 60.0

pytestmark = pytest.mark.timeout(120)


class Worker:
    """``_append_worker.py`` in a child process: started, then released with ``go``."""

    def __init__(self, url: str, instance_id: str, count: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), url, instance_id, str(count)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()
        if ready.strip() != "ready":
            self.proc.kill()
            _, err = self.proc.communicate(timeout=WAIT)
            pytest.fail(f"worker did not start: {ready!r}\n{err}")

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def result(self) -> list[int]:
        """The global positions the worker appended (after ``go``)."""
        out, err = self.proc.communicate(timeout=WAIT)
        assert self.proc.returncode == 0, err
        positions: list[int] = json.loads(out.strip().splitlines()[-1])
        return positions


@pytest.fixture
def durable_store(durable_store_url: str) -> Iterator[EventStore]:
    with open_store(durable_store_url) as store:
        yield store


def test_events_appended_by_another_process_are_read_here(
    durable_store: EventStore, durable_store_url: str
) -> None:
    worker = Worker(durable_store_url, "child", 3)
    worker.go()
    positions = worker.result()
    values = [(e.position, e.value) for e in durable_store.read("child")]  # type: ignore[attr-defined]
    assert values == [(1, 1), (2, 2), (3, 3)]
    assert [r.global_position for r in durable_store.read_all()] == positions
    assert durable_store.version("child") == 3


def test_a_follower_here_sees_appends_from_another_process(
    durable_store: EventStore, durable_store_url: str
) -> None:
    stop = threading.Event()
    received: queue.Queue[Recorded] = queue.Queue()

    def follow() -> None:
        for recorded in durable_store.follow(stop=stop, poll_interval=0.05):
            received.put(recorded)

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    worker = Worker(durable_store_url, "child", 3)
    worker.go()
    got = [received.get(timeout=WAIT) for _ in range(3)]
    stop.set()
    follower.join(timeout=WAIT)
    assert [r.global_position for r in got] == worker.result()
    assert [r.event.position for r in got] == [1, 2, 3]


def test_two_processes_append_to_their_own_streams_at_once(
    durable_store: EventStore, durable_store_url: str
) -> None:
    count = 25
    workers = {name: Worker(durable_store_url, name, count) for name in ("left", "right")}
    for worker in workers.values():
        worker.go()
    appended = {name: worker.result() for name, worker in workers.items()}
    everything = durable_store.read_all(limit=1000)
    positions = [r.global_position for r in everything]
    assert positions == sorted(appended["left"] + appended["right"])
    for name in workers:
        in_global_order = [r.event.position for r in everything if r.event.instance_id == name]
        assert in_global_order == list(range(1, count + 1))
        assert [e.position for e in durable_store.read(name)] == list(range(1, count + 1))


def test_processes_opening_a_new_store_at_once_all_succeed(durable_store_url: str) -> None:
    names = [f"w{i}" for i in range(4)]
    workers = [Worker(durable_store_url, name, 2) for name in names]
    for worker in workers:
        worker.go()
    for worker in workers:
        assert len(worker.result()) == 2
    with open_store(durable_store_url) as store:
        assert store.instances() == names


def test_a_new_store_opened_by_many_threads_at_once_opens_for_all(durable_store_url: str) -> None:
    # Each open has its own connections, as in separate processes; threads start closer together.
    count = 8
    barrier = threading.Barrier(count)
    outcomes: queue.Queue[str] = queue.Queue()

    def open_and_close() -> None:
        barrier.wait(timeout=WAIT)
        try:
            open_store(durable_store_url).close()
            outcomes.put("ok")
        except Exception as error:
            outcomes.put(f"{type(error).__name__}: {error}")

    threads = [threading.Thread(target=open_and_close) for _ in range(count)]
    for thread in threads:
        thread.start()
    results = [outcomes.get(timeout=WAIT) for _ in threads]
    for thread in threads:
        thread.join(timeout=WAIT)
    assert results == ["ok"] * count
