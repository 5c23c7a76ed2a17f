"""The ``steplog`` command on durable-execution logs: a run waiting for input and its requests,
resumed runs and forks in ``history``, and ``blame``, ``bisect`` and ``log`` on a fork."""

from __future__ import annotations

import asyncio
import json

import pytest

from kernel import open_store
from kernel.testing import LogBuilder
from projections.cli import main
from tests.durable.helpers import Tick, counting, reviewing
from tests.projections.stepping import write_mail


def cli(capsys, *args: str) -> tuple[int, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.fixture
def wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")


async def test_history_shows_a_run_waiting_for_input_and_its_requests(sqlite_url, capsys, wide):
    with open_store(sqlite_url) as store:
        wf = reviewing(store)
        (request,) = (await wf.run("v[bold]1")).pending_requests

    code, out = cli(capsys, "--store", sqlite_url, "history", "r")

    assert code == 0
    assert "waiting for input" in out
    assert "requests waiting for a response" in out
    assert request.request_id in out
    assert '"draft":"v[bold]1"' in out  # stored text, shown as is: never read as markup

    with open_store(sqlite_url) as store:
        await reviewing(store).run(responses={request.request_id: "approve"})
    code, out = cli(capsys, "--store", sqlite_url, "history", "r")
    assert code == 0
    assert "requests waiting for a response" not in out
    assert "1 response(s)" in out
    assert "continued by" in out


async def test_a_run_answered_and_continued_is_no_longer_listed_as_waiting(
    sqlite_url, capsys, wide
):
    """Issue 21: once answered and continued, a run says so ("continued", and by which run) in
    ``runs``, ``runs --json``, ``history`` and ``show``; only the run still waiting is listed as
    waiting."""
    with open_store(sqlite_url) as store:
        wf = reviewing(store)
        (request,) = (await wf.run("v1")).pending_requests
        (again,) = (await wf.run(responses={request.request_id: "shorter"})).pending_requests
        await wf.run(responses={again.request_id: "approve"})
        await wf.run("v2")  # waits for its own request
        first, second, third, fourth = [e.run_id for e in wf.events() if e.type == "run_started"]

    code, out = cli(capsys, "--store", sqlite_url, "runs", "r", "--json")
    assert code == 0
    runs = {run["run_id"]: run for run in json.loads(out)["runs"]}
    assert (runs[first]["status"], runs[first]["continued_by"]) == ("continued", [second])
    assert (runs[second]["status"], runs[second]["continued_by"]) == ("continued", [third])
    assert (runs[third]["status"], runs[third]["continued_by"]) == ("completed", [])
    assert (runs[fourth]["status"], runs[fourth]["continued_by"]) == ("awaiting_input", [])
    assert [r for r, run in runs.items() if run["status"] == "awaiting_input"] == [fourth]

    code, out = cli(capsys, "--store", sqlite_url, "runs", "r")
    assert code == 0
    assert out.count("waiting for input") == 1
    assert f"continued by {second[:8]}" in out
    assert f"continued by {third[:8]}" in out

    code, out = cli(capsys, "--store", sqlite_url, "history", "r")
    assert code == 0
    assert out.count("waiting for input") == 1

    code, out = cli(capsys, "--store", sqlite_url, "show", first)
    assert code == 0
    assert ": continued, started" in out
    assert f"continued by run {second}" in out

    with open_store(sqlite_url) as store:  # the wait given up on purpose: no longer waiting
        wf = reviewing(store)
        await wf.run("v3", supersede_requests=True)
    code, out = cli(capsys, "--store", sqlite_url, "runs", "r", "--json")
    assert code == 0
    statuses = [run["status"] for run in json.loads(out)["runs"]]
    assert statuses == ["continued", "continued", "completed", "superseded", "awaiting_input"]


async def test_history_shows_lineage_of_a_resumed_run_and_of_a_fork(sqlite_url, capsys, wide):
    with open_store(sqlite_url) as store:
        origin = counting(store, fail_at=4)
        with pytest.raises(RuntimeError):
            await origin.run(Tick(1))
        first_run = origin.events()[0].run_id
        second = origin.checkpoints()[1].checkpoint_id
        fork = counting(store).fork(at=second, instance_id="count-fork")
        await fork.resume()
        await counting(store).resume()
        resumed = [e for e in origin.events() if e.type == "run_started"][1].run_id

    code, out = cli(capsys, "--store", sqlite_url, "history", "count")
    assert code == 0
    assert f"continues run {first_run[:8]}" in out
    assert f"continued by {resumed[:8]}" in out
    assert "forks of count" in out
    assert "count-fork" in out

    code, out = cli(capsys, "--store", sqlite_url, "history", "count-fork")
    assert code == 0
    assert "forked from count at position" in out
    assert f"continues run {first_run[:8]} after checkpoint {second[:8]}" in out
    assert "forks of" not in out


async def test_blame_bisect_and_log_on_a_fork(sqlite_url, capsys, wide):
    with open_store(sqlite_url) as store:
        origin = counting(store, fail_at=4)
        with pytest.raises(RuntimeError):
            await origin.run(Tick(1))
        fork = counting(store).fork(at=origin.checkpoints()[1].checkpoint_id, instance_id="f")
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


def _show_from_everything(store, instance: str, run_id: str) -> dict:
    """``show --json`` as folded from every event of the instance (before ``run_window``)."""
    from collections import Counter

    from projections import recorded_steps
    from projections._frontend._ids import events_of
    from projections._frontend._render import run_document
    from projections.cli.commands._durable import history

    past = history(store, instance)
    run = past.run(run_id)
    steps = past.supersteps(run_id)
    sent = Counter(
        e.superstep_id
        for e in events_of(store, instance, ("message_staged",))
        if e.run_id == run_id
    )
    received: dict[str, dict] = {}
    for e in events_of(store, instance, ("response_received",)):
        if e.run_id == run_id and e.request_id in run.responses:
            received.setdefault(
                e.request_id,
                {
                    "request_id": e.request_id,
                    "value": e.value,
                    "timestamp": e.timestamp.isoformat(),
                    "run_id": e.run_id,
                    "position": e.position,
                },
            )
    every = list(events_of(store, instance, ("step_recorded",)))
    recorded = recorded_steps(
        [e for e in every if e.run_id == run_id],
        {step.superstep_id: step for step in steps},
        {e.position: e for e in every},
    )
    inside: dict[str, list] = {}
    for found in recorded:
        inside.setdefault(found.record.superstep_id, []).append(found.to_row())
    return {
        "run": run_document(run, instance),
        "supersteps": [step.to_row() for step in steps],
        "messages": {step.superstep_id: sent[step.superstep_id] for step in steps},
        "steps": inside,
        "responses": list(received.values()),
    }


async def test_show_reads_a_window_and_says_what_the_whole_history_says(
    durable_store_url, capsys, wide
):
    """``show RUN`` folds only its run's window (and the later runs' starts, responses and
    ends): its JSON is the one folded from the whole instance, for every run of instances with
    requests answered by ``respond`` and by a run, a failed and resumed run, a fork, and
    recorded steps (a served one's origin read outside its run's window)."""
    from tests.projections.test_sensitive import fork_secrets, write_secrets

    url = durable_store_url
    with open_store(url) as store:
        await asyncio.to_thread(lambda: fork_secrets(store, write_secrets(store)))
        (request,) = (await reviewing(store).run("v1")).pending_requests
    answered = cli(
        capsys,
        "--store",
        url,
        "respond",
        "--",
        _last_run(url, "r"),
        request.request_id,
        '"approve"',
    )
    assert answered[0] == 0
    with open_store(url) as store:
        await reviewing(store).resume()
        (_again,) = (await reviewing(store).run("v2")).pending_requests
        origin = counting(store, fail_at=4)
        with pytest.raises(RuntimeError):
            await origin.run(Tick(1))
        second = origin.checkpoints()[1].checkpoint_id
        await counting(store).fork(at=second, instance_id="count-fork").resume()
        await counting(store).resume()
        await write_mail(store)  # steps, one served from the run before its window
        runs = {
            name: [e.run_id for e in store.read(name, types=["run_started"])]
            for name in store.instances()
        }
        expected = {
            run_id: _show_from_everything(store, name, run_id)
            for name, ids in runs.items()
            for run_id in ids
        }
    assert sum(len(ids) for ids in runs.values()) >= 9
    pending = [doc for doc in expected.values() if doc["run"]["pending_requests"]]
    assert pending  # a run still waits (the second review)
    assert any(doc["responses"] for doc in expected.values())  # respond's run
    assert any(s["reused"] for doc in expected.values() for v in doc["steps"].values() for s in v)
    for run_id, document in expected.items():
        code, out = cli(capsys, "--store", url, "show", "--json", "--", run_id)
        assert code == 0, out
        assert json.loads(out) == document, run_id
    _history_says_what_the_whole_history_says(url, capsys)


def _many_runs(store, count: int = 25) -> list[str]:
    """``many``: ``count`` runs, each continuing the one before from its start."""
    log = LogBuilder("many")
    runs: list[str] = []
    for n in range(count):
        started = log.start_run(n, continues=runs[-1] if runs else None)
        log.start_superstep()
        log.invoke("x")
        log.write("n", n)
        log.commit()
        log.complete_run()
        runs.append(started.run_id)
    log.append_to(store)
    return runs


def _history_says_what_the_whole_history_says(url: str, capsys) -> None:
    """``history``, folded window by window, its runs table printed as the runs end: its JSON is
    the document of the history folded from every event at once, and its table lists every
    run, continuations included, on pages past the first."""
    from projections import history_of
    from projections._frontend._render import history_document

    with open_store(url) as store:
        many = _many_runs(store)
        names = store.instances()
        documents = {name: history_document(history_of(store, name), name) for name in names}
    for name in names:
        code, out = cli(capsys, "--store", url, "history", "--json", name)
        assert code == 0, out
        assert json.loads(out) == documents[name], name
    code, out = cli(capsys, "--store", url, "history", "many")
    assert code == 0
    assert out.count("continued by") == len(many) - 1
    for run_id in many:
        assert run_id[:8] in out
    assert out.index(many[-1][:8]) > out.index("runs of many") > -1
    assert out.index("supersteps") > out.index(many[-1][:8])


def _last_run(url: str, instance: str) -> str:
    with open_store(url) as store:
        return [e.run_id for e in store.read(instance, types=["run_started"])][-1]


async def test_a_run_that_recorded_a_response_is_answered_not_waiting(sqlite_url, capsys, wide):
    """Issue 21: the run ``steplog respond`` writes waits for nothing: ``runs``, ``history`` and
    ``show`` say it is ``answered`` (resume() continues it), never "waiting for input", and
    ``show`` prints the response it recorded (request, value escaped, time, run); once resumed
    it is ``continued``, and the resuming run's ``show`` says what it continues (no ``None``)."""
    with open_store(sqlite_url) as store:
        wf = reviewing(store)
        (request,) = (await wf.run("v1")).pending_requests
    code, out = cli(
        capsys, "--store", sqlite_url, "respond", request.run_id, request.request_id,
        '"app\\u001b[2Jrove"',
    )  # fmt: skip
    assert code == 0, out
    with open_store(sqlite_url) as store:
        first, answering = [e.run_id for e in store.read("r") if e.type == "run_started"]

    code, out = cli(capsys, "--store", sqlite_url, "runs", "r", "--json")
    assert code == 0
    runs = {run["run_id"]: run for run in json.loads(out)["runs"]}
    assert runs[answering]["status"] == "answered"
    assert runs[first]["status"] == "continued"
    for command in (("runs", "r"), ("history", "r"), ("show", answering)):
        code, out = cli(capsys, "--store", sqlite_url, *command)
        assert code == 0
        assert "waiting for input" not in out, command
        assert "answered: resume() continues" in out, command
    code, out = cli(capsys, "--store", sqlite_url, "requests")
    assert "no request is waiting for a response" in out
    assert f"run {answering} of r recorded a response that waits for the workflow's resume()" in out

    code, out = cli(capsys, "--store", sqlite_url, "show", answering)
    assert "responses recorded" in out
    assert request.request_id in out
    assert '"app\\u001b[2Jrove"' in out  # stored text escaped, never sent to the terminal raw
    assert "\x1b" not in out
    assert "not delivered yet" in out
    assert "resume()" in out
    code, out = cli(capsys, "--store", sqlite_url, "show", answering, "--json")
    (response,) = json.loads(out)["responses"]
    assert (response["request_id"], response["value"], response["run_id"]) == (
        request.request_id, "app\x1b[2Jrove", answering,
    )  # fmt: skip
    assert response["timestamp"]

    with open_store(sqlite_url) as store:
        wf = reviewing(store)
        await wf.resume()
        resumed = [e.run_id for e in store.read("r") if e.type == "run_started"][-1]
    code, out = cli(capsys, "--store", sqlite_url, "runs", "r", "--json")
    statuses = [run["status"] for run in json.loads(out)["runs"]]
    assert statuses == ["continued", "continued", "awaiting_input"]  # asks again: not approve
    code, out = cli(capsys, "--store", sqlite_url, "show", answering)
    assert ": continued, started" in out
    assert "not delivered yet" not in out
    assert f"continued by run {resumed}" in out


async def test_show_of_a_run_resumed_after_respond_names_what_it_continues(
    sqlite_url, capsys, wide
):
    """Issue 21: the run ``resume()`` starts after ``steplog respond`` continues respond's run,
    which committed no superstep (no checkpoint): ``show`` said "after None"; it now says what
    it continues from, and ``history`` the same."""
    with open_store(sqlite_url) as store:
        wf = reviewing(store)
        (request,) = (await wf.run("v1")).pending_requests
    code, out = cli(
        capsys, "--store", sqlite_url, "respond", request.run_id, request.request_id, '"approve"'
    )
    assert code == 0, out
    with open_store(sqlite_url) as store:
        wf = reviewing(store)
        await wf.resume()
        first, answering, resumed = [e.run_id for e in store.read("r", types=["run_started"])]
    code, out = cli(capsys, "--store", sqlite_url, "show", resumed)
    assert code == 0
    assert "None" not in out
    assert f"continues run {answering} from its start (it committed no superstep)" in out
    code, out = cli(capsys, "--store", sqlite_url, "show", answering)
    assert "None" not in out
    assert f"continues run {first} after checkpoint " in out
    code, out = cli(capsys, "--store", sqlite_url, "history", "r")
    assert "None" not in out
    assert f"continues run {answering[:8]} from its start" in out


async def test_a_forks_inherited_request_is_marked_and_answered_with_instance(
    sqlite_url, capsys, wide
):
    """Issue 21: after ``steplog fork``, ``requests`` lists the fork's copy of the origin's
    waiting request marked as inherited (``inherited_from`` in JSON); ``respond RUN REQ JSON
    --instance FORK`` answers the fork's copy (RUN being the origin's run, as listed), the
    origin still waits, and the fork's ``resume()`` goes on with the response. ``respond FORK``
    says to use ``--instance``."""
    with open_store(sqlite_url) as store:
        wf = reviewing(store, "fan-1")
        (request,) = (await wf.run("v1")).pending_requests
        checkpoint = wf.checkpoints()[-1].checkpoint_id
    code, out = cli(
        capsys, "--store", sqlite_url, "fork", "fan-1", f"step:{checkpoint}", "--to", "fan-1b"
    )
    assert code == 0, out

    code, out = cli(capsys, "--store", sqlite_url, "requests", "--json")
    rows = {row["instance_id"]: row for row in json.loads(out)["requests"]}
    assert rows["fan-1"]["inherited_from"] is None
    assert rows["fan-1b"]["inherited_from"] == "fan-1"
    assert rows["fan-1b"]["run_id"] == request.run_id
    code, out = cli(capsys, "--store", sqlite_url, "requests")
    assert "(inherited from fan-1)" in out
    assert out.count("inherited from") == 1
    assert "--instance FORK" in out

    code, out = cli(
        capsys, "--store", sqlite_url, "respond", "fan-1b", request.request_id, '"approve"'
    )
    assert code == 2
    assert "--instance fan-1b" in out
    code, out = cli(
        capsys, "--store", sqlite_url, "respond", request.run_id[:6], request.request_id[:6],
        '"approve"', "--instance", "fan-1b",
    )  # fmt: skip
    assert code == 0, out
    assert "of fan-1b in run" in out

    code, out = cli(capsys, "--store", sqlite_url, "requests", "--json")
    (row,) = json.loads(out)["requests"]
    assert (row["instance_id"], row["inherited_from"]) == ("fan-1", None)  # the origin waits
    with open_store(sqlite_url) as store:
        fork = reviewing(store, "fan-1b")
        assert (await fork.resume()).get_outputs() == ["v1"]
        assert fork.committed_state() == {"draft": "v1", "approved": "v1"}
