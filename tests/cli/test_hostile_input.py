"""A log edited by hand, and a hostile ``bisect --equals``: reading them runs nothing.

A real workflow writes a SQLite log; the test then rewrites the stored JSON of a state write to
name a class whose module leaves a marker file when imported (on ``sys.path`` under ``tmp_path``),
or ``subprocess:Popen`` with a command that would leave one. The hash chain refuses the edited
row (checked once, below); read anyway (``allow_broken_chain``, ``--allow-broken-chain``: the
path on which an edited value reaches the decoder), committed state through a ``Workflow`` and
every reading command of the CLI must give plain data or a clear error, never import the module,
never call the class.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from kernel import (
    DecodeError,
    ErrorInfo,
    EventStore,
    Executor,
    LogIntegrityError,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    handler,
    open_store,
)
from kernel._codec._rows import layouts
from projections.cli import main

INSTANCE = "orders-1"
TRAP = "steplog_trap"  # planted by the ``trap`` fixture


class Writer(Executor):
    """Commits ``k = "harmless"`` and ``n = 1`` in one superstep."""

    @handler
    async def run(self, message: str, ctx: WorkflowContext[str, str]) -> None:
        ctx.set_state("k", "harmless")
        ctx.set_state("n", 1)
        await ctx.yield_output("ok")


def workflow(store: EventStore, *, snapshots: bool = True) -> Workflow:
    builder = WorkflowBuilder(start_executor=Writer("writer"), store=store, instance_id=INSTANCE)
    return builder.with_snapshots(every=1000 if snapshots else 0).build()


@pytest.fixture
async def logged(sqlite_url: str) -> str:
    """A SQLite store holding one committed run of ``Writer`` on ``INSTANCE``."""
    with open_store(sqlite_url) as store:
        await workflow(store).run("go")
    return sqlite_url


def edit_stored_value(url: str, key: str, tree: Any) -> None:
    """Rewrite, in the database file, the stored value of the state write of ``key`` (in the
    batch row that holds it: see ``kernel._codec._rows``)."""
    path = url.removeprefix("sqlite:///")
    layout = layouts()[0]["state_staged"]
    key_at, value_at = (2 + layout.names.index(name) for name in ("key", "value"))
    with sqlite3.connect(path) as db:
        rows = db.execute(
            "SELECT rowid, state FROM steplog_events WHERE originator_id = ?", (INSTANCE,)
        ).fetchall()
        for rowid, state in rows:
            body = orjson.loads(state)
            for item in body[5:]:  # after [format, base time, offsets, strings, chain]
                if item[0] == layout.code and item[key_at] == key:
                    item[value_at] = tree
                    db.execute(  # json, not orjson: orjson refuses to write more than 254 levels
                        "UPDATE steplog_events SET state = ? WHERE rowid = ?",
                        (json.dumps(body).encode(), rowid),
                    )
                    return
    raise AssertionError(f"no write of {key!r} in the log")


def hostile_trees(marker: Path) -> dict[str, tuple[Any, Any]]:
    """Hostile stored values, each with the plain data it must decode to."""
    command = ["touch", str(marker)]
    return {
        "enum-trap": ({"$t": "enum", "cls": f"{TRAP}:Evil", "v": "x"}, "x"),
        "dataclass-trap": ({"$t": "dataclass", "cls": f"{TRAP}:Box", "v": {"v": 1}}, {"v": 1}),
        "model-trap": ({"$t": "model", "cls": f"{TRAP}:Box", "v": {"v": 1}}, {"v": 1}),
        "enum-popen": ({"$t": "enum", "cls": "subprocess:Popen", "v": command}, command),
        "dataclass-popen": (
            {"$t": "dataclass", "cls": "subprocess:Popen", "v": {"args": command}},
            {"args": command},
        ),
    }


HOSTILE = ["enum-trap", "dataclass-trap", "model-trap", "enum-popen", "dataclass-popen"]


def nothing_ran(marker: Path) -> bool:
    return not marker.exists() and TRAP not in sys.modules


@pytest.mark.parametrize("name", HOSTILE)
def test_reading_an_edited_log_through_the_workflow_runs_nothing(
    logged: str, trap: Path, name: str
) -> None:
    tree, plain = hostile_trees(trap)[name]
    edit_stored_value(logged, "k", tree)
    with open_store(logged) as store:
        # Folding the log (snapshots off), the edited row is refused.
        with pytest.raises(LogIntegrityError, match="does not match"):
            workflow(store, snapshots=False).committed_state()
        # The snapshot the run kept is past the edited row: an open reads only the log after it,
        # so it answers what the run committed; finding the edit is verify's.
        assert workflow(store).committed_state() == {"k": "harmless", "n": 1}
        assert [p.kind for p in store.verify_chain().problems] == ["edited"]
    with open_store(logged, allow_broken_chain=True) as store:  # the log alone, no snapshot
        assert workflow(store).committed_state() == {"k": plain, "n": 1}
        assert [p.kind for p in store.chain_problems] == ["edited"]
    assert nothing_ran(trap)


READING_COMMANDS = [
    ["state", INSTANCE],
    ["state", INSTANCE, "pos:4"],
    ["log", INSTANCE],
    ["log", INSTANCE, "--json"],
    ["history", INSTANCE],
    ["blame", INSTANCE, "k"],
    ["diff", INSTANCE, "pos:1", "pos:8"],
    ["bisect", INSTANCE, "--key", "k"],
    ["bisect", INSTANCE, "--key", "n", "--equals", "1"],
]


@pytest.mark.parametrize("name", HOSTILE)
@pytest.mark.parametrize("command", READING_COMMANDS, ids=" ".join)
def test_reading_an_edited_log_through_the_cli_runs_nothing(
    logged: str, trap: Path, name: str, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    tree, _ = hostile_trees(trap)[name]
    edit_stored_value(logged, "k", tree)
    assert main(["--store", logged, "--allow-broken-chain", *command]) == 0
    assert nothing_ran(trap)
    capsys.readouterr()


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_bisect_equals_runs_nothing_and_compares_as_plain_data(
    logged: str, trap: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    tree, _ = hostile_trees(trap)[name]
    equals = orjson.dumps(tree).decode()
    # The stored value is harmless: the hostile value is never equal to it.
    assert main(["--store", logged, "bisect", INSTANCE, "--key", "k", "--equals", equals]) == 1
    assert "never" in capsys.readouterr().out
    # The same hostile value stored: both sides decode to the same plain data.
    edit_stored_value(logged, "k", tree)
    command = ["bisect", INSTANCE, "--key", "k", "--equals", equals]
    assert main(["--store", logged, "--allow-broken-chain", *command]) == 0
    assert "first true after superstep 1" in capsys.readouterr().out
    assert nothing_ran(trap)


def deep(depth: int) -> Any:
    tree: Any = 1
    for _ in range(depth):
        tree = [tree]
    return tree


MALFORMED = {
    "unknown-tag": ({"$t": "future", "v": 1}, "unknown value tag 'future'"),
    "missing-part": ({"$t": "date"}, "has no 'v'"),
    "wrong-part": ({"$t": "timedelta", "v": "soon"}, "a list of days, seconds and microseconds"),
    "no-class-name": ({"$t": "model", "v": {}}, "needs 'cls' (text) and 'v'"),
    "too-deep": (deep(600), "levels deep"),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_a_malformed_stored_value_is_a_decode_error_through_the_workflow(
    logged: str, trap: Path, name: str
) -> None:
    tree, problem = MALFORMED[name]
    edit_stored_value(logged, "k", tree)
    with (
        open_store(logged, allow_broken_chain=True) as store,
        pytest.raises(DecodeError, match="cannot decode") as caught,
    ):
        workflow(store).committed_state()
    assert problem in str(caught.value)
    assert nothing_ran(trap)


@pytest.mark.parametrize("name", list(MALFORMED))
def test_a_malformed_stored_value_makes_bisect_exit_2_with_the_problem(
    logged: str, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    tree, problem = MALFORMED[name]
    edit_stored_value(logged, "k", tree)
    command = ["bisect", INSTANCE, "--key", "k", "--equals", '"x"']
    assert main(["--store", logged, "--allow-broken-chain", *command]) == 2
    err = capsys.readouterr().err
    assert "cannot decode" in err
    assert problem in " ".join(err.split())


@pytest.mark.parametrize("name", list(MALFORMED))
def test_a_malformed_bisect_equals_exits_2_with_the_problem(
    logged: str, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    tree, problem = MALFORMED[name]
    equals = json.dumps(tree)
    assert main(["--store", logged, "bisect", INSTANCE, "--key", "k", "--equals", equals]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "cannot decode --equals: " in err
    assert problem in err


MARKUP = "[/] [red]not red[/red] [bold"


async def test_markup_in_stored_data_is_shown_as_it_is_never_interpreted(sqlite_url, capsys):
    from kernel.testing import LogBuilder, ticking_clock

    store = open_store(sqlite_url)
    log = LogBuilder(MARKUP, clock=ticking_clock())
    log.start_run(MARKUP)
    log.start_superstep()
    log.invoke(MARKUP)
    log.write(MARKUP, MARKUP)
    log.fail(error=ErrorInfo(type="E", message=MARKUP))
    log.abort(error=ErrorInfo(type="E", message=MARKUP))
    log.fail_run(ErrorInfo(type="E", message=MARKUP))
    log.start_run()
    log.start_superstep()
    log.invoke("w")
    log.write(MARKUP, MARKUP)
    log.commit()
    log.complete_run()
    log.append_to(store)
    store.close()
    commands = [
        ["instances"],
        ["log", MARKUP],
        ["state", MARKUP],
        ["history", MARKUP],
        ["blame", MARKUP, MARKUP],
        ["diff", MARKUP, "pos:1", f"pos:{log.version}"],
        ["bisect", MARKUP, "--key", MARKUP],
    ]
    for args in commands:
        capsys.readouterr()
        status = main(["--store", sqlite_url, *args])
        out = capsys.readouterr().out
        assert status == 0, (args, out)
        assert "[/]" in out, (args, out)  # shown literally, never taken as markup
