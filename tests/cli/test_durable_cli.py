"""The ``steplog`` command on durable-execution logs: a run waiting for input and its requests,
resumed runs and forks in ``history``, and ``blame``, ``bisect`` and ``log`` on a fork."""

from __future__ import annotations

import json

import pytest

from kernel import WorkflowBuilder, open_store
from projections.cli import main
from tests.durable.test_requests import Reviewer
from tests.durable.test_resume import Tick
from tests.durable.test_resume import build as build_counter


def cli(capsys, *args: str) -> tuple[int, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.fixture
def wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")


async def test_history_shows_a_run_waiting_for_input_and_its_requests(sqlite_url, capsys, wide):
    with open_store(sqlite_url) as store:
        wf = WorkflowBuilder(
            start_executor=Reviewer("reviewer"), store=store, instance_id="r"
        ).build()
        (request,) = (await wf.run("v[bold]1")).pending_requests

    code, out = cli(capsys, "--store", sqlite_url, "history", "r")

    assert code == 0
    assert "waiting for input" in out
    assert "requests waiting for a response" in out
    assert request.request_id in out
    assert '"draft":"v[bold]1"' in out  # stored text, shown as is: never read as markup

    with open_store(sqlite_url) as store:
        await (
            WorkflowBuilder(start_executor=Reviewer("reviewer"), store=store, instance_id="r")
            .build()
            .run(responses={request.request_id: "approve"})
        )
    code, out = cli(capsys, "--store", sqlite_url, "history", "r")
    assert code == 0
    assert "requests waiting for a response" not in out
    assert "1 response(s)" in out
    assert "continued by" in out


async def test_history_shows_lineage_of_a_resumed_run_and_of_a_fork(sqlite_url, capsys, wide):
    with open_store(sqlite_url) as store:
        origin = build_counter(store, fail_at=4)
        with pytest.raises(RuntimeError):
            await origin.run(Tick(1))
        first_run = origin.events()[0].run_id
        second = origin.checkpoints()[1].checkpoint_id
        fork = build_counter(store).fork(at=second, instance_id="count-fork")
        await fork.resume()
        await build_counter(store).resume()
        resumed = [e for e in origin.events() if e.type == "run_started"][1].run_id

    code, out = cli(capsys, "--store", sqlite_url, "history", "count")
    assert code == 0
    assert f"continues {first_run[:8]}" in out
    assert f"continued by {resumed[:8]}" in out
    assert "forks of count" in out
    assert "count-fork" in out

    code, out = cli(capsys, "--store", sqlite_url, "history", "count-fork")
    assert code == 0
    assert "forked from count at position" in out
    assert f"continues {first_run[:8]} after {second[:8]}" in out
    assert "forks of" not in out


async def test_blame_bisect_and_log_on_a_fork(sqlite_url, capsys, wide):
    with open_store(sqlite_url) as store:
        origin = build_counter(store, fail_at=4)
        with pytest.raises(RuntimeError):
            await origin.run(Tick(1))
        fork = build_counter(store).fork(at=origin.checkpoints()[1].checkpoint_id, instance_id="f")
        at = fork.events()[0].origin_position

    code, out = cli(capsys, "--store", sqlite_url, "blame", "f", "count")
    assert code == 0
    assert f"the fork from count @ pos {at}" in out
    assert "committed" in out

    code, out = cli(capsys, "--store", sqlite_url, "bisect", "f", "--key", "count")
    assert code == 0
    assert "values forked from count" in out

    code, out = cli(capsys, "--store", sqlite_url, "log", "f", "--json")
    assert code == 0
    (line,) = [json.loads(text) for text in out.splitlines()]
    assert line["type"] == "instance_forked"
    assert "write_status" not in line  # not a write: the fork's values are not staged writes

    code, out = cli(capsys, "--store", sqlite_url, "state", "f", "pos:1")
    assert code == 0
    assert "count" in out
