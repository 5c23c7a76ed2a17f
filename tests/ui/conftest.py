"""Fixtures of the UI's tests: a store prepared by real workflow runs (``steplog demo``'s three
instances, a chain whose state holds hostile text and a sensitive key, and two instances of
recorded steps: ``mail`` and its hostile twin, each a run cancelled in a step then resumed), a
Starlette test client over it, and a real uvicorn server on a free 127.0.0.1 port."""

from __future__ import annotations

import asyncio
import contextlib
import io
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the ui extra is not installed: pip install 'steplog[ui]'")

import uvicorn
from starlette.testclient import TestClient

from kernel import EventStore, open_store
from projections.cli import main
from projections.ui import create_app
from tests.projections.stepping import MAIL, write_mail
from tests.ui.workflows import HOSTILE, HOSTILE_INSTANCE, write_chain

LOCAL = "http://127.0.0.1"
"""Where the test clients send their requests (the UI answers only its loopback names)."""
DEMO = "orders"
RECOVERY = f"{DEMO}-recovery"
FORK = f"{DEMO}-recovery-fork"
HOSTILE_MAIL = "hostile-mail"
"""Recorded steps whose prompt, result and one step's name are hostile text."""
SENSITIVE_STEP = "send_email"
"""The step ``mail`` declares sensitive: its result is redacted."""


def prepare(path: Path) -> str:
    """Write the demo's instances and the hostile chain into a new SQLite store at ``path``."""
    url = f"sqlite:///{path}"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["--store", url, "demo", "--instance", DEMO]) == 0
    with open_store(url) as demo_store:
        asyncio.run(write_chain(demo_store, HOSTILE_INSTANCE, stop=3, fail_at=2))
        asyncio.run(write_chain(demo_store, HOSTILE_INSTANCE, stop=3))
        asyncio.run(write_mail(demo_store, MAIL, sensitive_keys=[SENSITIVE_STEP]))
        asyncio.run(write_mail(demo_store, HOSTILE_MAIL, prompt=f"write {HOSTILE}"))
    return url


@pytest.fixture(scope="session")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The prepared store's file (never changed: tests copy it)."""
    path = tmp_path_factory.mktemp("ui") / "prepared.db"
    prepare(path)
    return path


@pytest.fixture
def store_path(prepared: Path, tmp_path: Path) -> Path:
    """A copy of the prepared store for one test."""
    path = tmp_path / "steplog.db"
    shutil.copyfile(prepared, path)
    return path


@pytest.fixture
def demo_store(store_path: Path) -> Iterator[EventStore]:
    with open_store(f"sqlite:///{store_path}", create=False) as opened:
        yield opened


@pytest.fixture
def client(demo_store: EventStore) -> Iterator[TestClient]:
    with TestClient(create_app(demo_store), base_url=LOCAL) as test_client:
        yield test_client


@dataclass
class Server:
    url: str
    store: EventStore


@contextlib.contextmanager
def serving(demo_store: EventStore, **options: object) -> Iterator[Server]:
    """A uvicorn server over ``demo_store`` on a free 127.0.0.1 port, in a thread."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        create_app(demo_store, **options),  # type: ignore[arg-type]
        log_level="warning",
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the UI server did not start")
        time.sleep(0.05)
    try:
        yield Server(f"http://127.0.0.1:{port}", demo_store)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@pytest.fixture
def server(demo_store: EventStore) -> Iterator[Server]:
    with serving(demo_store) as running:
        yield running
