"""``steplog ... | head``: a reader that closes standard output early ends the command quietly.

A real pipe: the command runs in a child process whose standard output is a pipe; the test reads
its first 4 kB, closes its end, and waits (``head -c 4096``). The command exits
``EXIT_CLOSED_PIPE`` (141, as a Unix tool killed by SIGPIPE) with nothing on standard error: no
"unexpected BrokenPipeError", no traceback, no "Exception ignored" at interpreter exit. The
output is far larger than a pipe's buffer, so the command is still writing when the reader goes.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from kernel import Executor, WorkflowBuilder, WorkflowContext, handler, open_store, step
from kernel.testing import LogBuilder, ticking_clock
from projections.cli import EXIT_CLOSED_PIPE

STEPLOG = [sys.executable, "-c", "import sys; from projections.cli import main; sys.exit(main())"]
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
"""The child's environment: standard output buffered, as a user's is."""
RUNS = 400
"""Runs of the instance: 2,400 events, some 600 kB of JSON lines."""


@pytest.fixture
def big(sqlite_url: str) -> str:
    log = LogBuilder("big", clock=ticking_clock())
    for n in range(RUNS):
        log.start_run(n)
        log.start_superstep()
        log.invoke("writer")
        log.write(f"key-{n}", "x" * 40)
        log.commit()
        log.complete_run()
    with open_store(sqlite_url) as store:
        log.append_to(store)
    return sqlite_url


@step
async def tool(n: int) -> str:
    return "x" * 40 + str(n)


class Many(Executor):
    """Calls ``tool`` ``count`` times: one recorded step each."""

    @handler
    async def go(self, count: int, ctx: WorkflowContext) -> None:
        for n in range(count):
            await tool(n)


@pytest.fixture
def stepped(sqlite_url: str) -> tuple[str, str]:
    """A run of 400 recorded steps (some 580 kB of table, 240 kB of JSON): the store and the
    run."""
    with open_store(sqlite_url) as store:
        workflow = WorkflowBuilder(start_executor=Many(id="many"), store=store, instance_id="many")
        asyncio.run(workflow.build().run(400))
        run = store.read("many", upto=1)[0].run_id
    return sqlite_url, run


@pytest.mark.parametrize("as_json", [False, True], ids=["table", "json"])
def test_a_reader_closing_the_pipe_ends_steps_quietly(
    stepped: tuple[str, str], as_json: bool
) -> None:
    url, run = stepped
    line, status, err = head_then_close(
        ["--store", url, "steps", *(["--json"] if as_json else []), "--", run]
    )
    assert line
    assert err == b""
    assert status == EXIT_CLOSED_PIPE


def head_then_close(args: list[str]) -> tuple[bytes, int, bytes]:
    """Run ``steplog ARGS``, read its first 4 kB, close the pipe; (them, status, stderr)."""
    with subprocess.Popen(
        [*STEPLOG, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV
    ) as child:
        assert child.stdout is not None
        assert child.stderr is not None
        line = child.stdout.read(4096)
        child.stdout.close()
        err = child.stderr.read()
        status = child.wait(timeout=120)
    return line, status, err


@pytest.mark.parametrize(
    "args",
    [
        ["log", "big", "--json"],  # JSON lines, flushed one by one
        ["runs", "big", "--json"],  # one JSON document, written piece by piece
        ["log", "big"],  # tables, a page at a time
        ["runs"],
    ],
    ids=" ".join,
)
def test_a_reader_closing_the_pipe_ends_the_command_quietly(big: str, args: list[str]) -> None:
    line, status, err = head_then_close(["--store", big, *args])
    assert line  # it did write
    assert err == b""
    assert status == EXIT_CLOSED_PIPE == 141


@pytest.mark.parametrize(
    "args",
    [["state", "big", "--json"], ["instances"], ["instances", "--json"], ["checkpoints", "big"]],
    ids=" ".join,
)
def test_a_pipe_closed_before_a_short_output_ends_the_command_quietly(
    big: str, args: list[str]
) -> None:
    """The reader is gone before the command writes (``steplog ... | true``): what it buffered
    fails when flushed, and that is a closed pipe too, never "Exception ignored" at exit (with
    status 120, Python's)."""
    with subprocess.Popen(
        [*STEPLOG, "--store", big, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV
    ) as child:
        assert child.stdout is not None
        assert child.stderr is not None
        child.stdout.close()  # before the child has even started Python
        err = child.stderr.read()
        status = child.wait(timeout=120)
    assert err == b""
    assert status == EXIT_CLOSED_PIPE


def test_the_whole_output_read_is_status_0(big: str) -> None:
    done = subprocess.run(
        [*STEPLOG, "--store", big, "log", "big", "--json"],
        capture_output=True,
        check=False,
        env=ENV,
    )
    assert (done.returncode, done.stderr) == (0, b"")
    assert len(done.stdout.splitlines()) == RUNS * 6
