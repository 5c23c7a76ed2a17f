"""``steplog steps RUN`` and the steps of ``steplog show RUN``, through ``main``, on logs written by
a handler calling recorded steps (``tests.projections.stepping``): a run cancelled in its third
step, then resumed with the first served from the log. Tables and ``--json`` (checked against
the shipped schemas), redaction by step name, stored text escaped, and a tampered step record
refused by every reader (``verify``, ``steps``, ``show``, ``log``), on SQLite."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from contextlib import closing

import jsonschema
import orjson
import pytest

from kernel import (
    Executor,
    WorkflowBuilder,
    WorkflowContext,
    counter_ids,
    handler,
    open_store,
    step,
)
from kernel.testing import LogBuilder, ticking_clock
from projections import REDACTED
from projections.cli import EXIT_BAD_INPUT, EXIT_BROKEN_CHAIN, main, schema_of
from tests.cli.test_stored_escapes import RAW
from tests.durable.helpers import Tick, counting
from tests.projections.stepping import MAIL, write_mail
from tests.store.test_tamper import CODE, HEADER

EVIL = "ev\x1b[2J\u202e[bold]x\nFORGED"
SHOWN = r"ev\x1b[2J\u202e[bold]x\nFORGED"
JSON_SHOWN = r"ev\u001b[2J\u202e[bold]x\nFORGED"
"""How ``log`` shows it: inside its fields' JSON."""
STEP_CODE = CODE["step_recorded"]


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def mailed(durable_store_url: str, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str, str]:
    """The store's URL and the two runs of ``mail``: run 1 cancelled, run 2 resuming it."""
    monkeypatch.setenv("COLUMNS", "250")
    with open_store(durable_store_url) as store:
        first, second = asyncio.run(
            write_mail(store, clock=ticking_clock(), id_factory=counter_ids("m"))
        )
    return durable_store_url, first, second


def test_steps_lists_each_call_with_its_supersteps_verdict_and_reuse(mailed, capsys) -> None:
    url, first, second = mailed
    code, out, err = cli(capsys, "--store", url, "steps", first, "--json")
    assert (code, err) == (0, "")
    document = json.loads(out)
    jsonschema.validate(document, schema_of("steps"))
    assert (document["instance_id"], document["run_id"]) == (MAIL, first)
    steps = document["steps"]
    assert [(s["name"], s["verdict"], s["reason"], s["index"]) for s in steps] == [
        ("call_model", "aborted", "cancelled", 1),
        ("check_spam", "aborted", "cancelled", 1),
    ]
    model, spam = steps
    assert model["usage"] == {"input_tokens": 3, "output_tokens": 6}
    assert model["result"]["response"] == "Dear Ann,\nthank you. (write to Ann)"
    assert spam["error"]["message"] == "the spam checker is down"
    assert spam["result"] is None

    code, out, _ = cli(capsys, "--store", url, "steps", "--json", "--", second[:3])
    later = json.loads(out)["steps"]
    jsonschema.validate(json.loads(out), schema_of("steps"))
    assert [(s["name"], s["verdict"], s["reused"]) for s in later] == [
        ("call_model", "committed", {"position": model["position"], "run_id": first}),
        ("check_spam", "committed", None),  # an error is never served: it ran again
        ("send_email", "committed", None),
    ]
    assert later[0]["result"] == model["result"]  # the result it was served
    assert later[0]["step_key"] == model["step_key"]  # the same idempotency key
    assert later[2]["result"] == "sent to ann@example.com"

    code, out, _ = cli(capsys, "--store", url, "steps", second)
    assert code == 0
    assert f"recorded steps of run {second} of {MAIL}" in out
    served = next(line for line in out.splitlines() if "call_model" in line)
    assert f"reused #{model['position']} of run {first[:8]}" in served
    assert "committed" in served
    assert "error: tests.projections.stepping.SpamCheckDown: the spam checker is down" in out
    assert '"sent to ann@example.com"' in out
    assert "reused: served from the log, not run again" in out
    code, out, _ = cli(capsys, "--store", url, "steps", first)
    assert "aborted (cancelled)" in out
    assert "input_tokens=3" in out


def test_show_puts_the_steps_inside_their_superstep(mailed, capsys) -> None:
    url, first, second = mailed
    code, out, err = cli(capsys, "--store", url, "show", second, "--json")
    assert (code, err) == (0, "")
    document = json.loads(out)
    jsonschema.validate(document, schema_of("show"))
    (superstep,) = document["supersteps"]
    inside = document["steps"][superstep["superstep_id"]]
    assert [s["name"] for s in inside] == ["call_model", "check_spam", "send_email"]
    assert inside[0]["reused"]["run_id"] == first
    code, out, _ = cli(capsys, "--store", url, "steps", second, "--json")
    assert json.loads(out)["steps"] == inside  # one document shape for both
    schema = schema_of("show")["properties"]["steps"]["additionalProperties"]["items"]
    assert schema == schema_of("steps")["properties"]["steps"]["items"]

    code, out, _ = cli(capsys, "--store", url, "show", second)
    assert "recorded steps" in out
    assert f"call_model: reused #{inside[0]['reused']['position']} of run {first[:8]}" in out
    assert "check_spam: error SpamCheckDown" in out
    assert "send_email: " in out
    assert f"each step's result: steplog steps {second}" in out
    code, out, _ = cli(capsys, "--store", url, "show", first, "--json")
    assert [s["verdict"] for s in next(iter(json.loads(out)["steps"].values()))] == [
        "aborted",
        "aborted",
    ]


def test_a_run_without_steps_says_so(mailed, capsys) -> None:
    url, _, _ = mailed
    with open_store(url) as store:
        asyncio.run(counting(store, "plain", limit=1).run(Tick(1)))
        run = store.read("plain", upto=1)[0].run_id
    code, out, _ = cli(capsys, "--store", url, "steps", run)
    assert (code, out.strip()) == (0, f"no recorded step in run {run} of plain")
    code, out, _ = cli(capsys, "--store", url, "show", run)
    assert "recorded steps" not in out  # the column only for a run that recorded some
    code, out, _ = cli(capsys, "--store", url, "show", run, "--json")
    assert json.loads(out)["steps"] == {}
    assert cli(capsys, "--store", url, "steps", "nope")[0] == EXIT_BAD_INPUT


@pytest.mark.parametrize(
    ("declared", "given"),
    [((), ["--sensitive", "call_*"]), (("call_model",), [])],
    ids=["--sensitive", "declared by the workflow"],
)
def test_a_sensitive_steps_result_is_redacted_everywhere_unless_revealed(
    sqlite_url: str, capsys, monkeypatch, declared: tuple[str, ...], given: list[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    with open_store(sqlite_url) as store:
        first, second = asyncio.run(write_mail(store, sensitive_keys=list(declared)))
    answer = "thank you. (write to Ann)"
    for args in (
        ["steps", first],
        ["steps", second],
        ["steps", second, "--json"],
        ["show", second, "--json"],
        ["log", MAIL],
        ["log", MAIL, "--json"],
    ):
        code, out, _ = cli(capsys, "--store", sqlite_url, *args, *given)
        assert code == 0, args
        assert answer not in out, args
        assert "redacted" in out, args
        code, out, _ = cli(capsys, "--store", sqlite_url, *args, *given, "--reveal")
        assert "redacted" not in out, args
        if args != ["log", MAIL]:  # (whose table cuts every field at 48 characters)
            assert answer in out, args
    code, out, _ = cli(capsys, "--store", sqlite_url, "steps", second, "--json", *given)
    steps = json.loads(out)["steps"]
    assert steps[0]["result"] == dict(REDACTED)
    assert steps[0]["reused"]["run_id"] == first  # everything else about it stays
    assert steps[0]["step_key"]
    assert steps[2]["result"] == "sent to ann@example.com"  # other steps are not sensitive


def test_stored_text_of_a_step_is_shown_escaped(sqlite_url: str, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")

    @step(name=EVIL)
    async def evil(text: str) -> str:
        return text

    class Evil(Executor):
        @handler
        async def go(self, text: str, ctx: WorkflowContext) -> None:
            await evil(EVIL)

    with open_store(sqlite_url) as store:
        asyncio.run(
            WorkflowBuilder(start_executor=Evil(id=EVIL), store=store, instance_id="evil")
            .build()
            .run("x")
        )
        run = store.read("evil", upto=1)[0].run_id
    for args in (["steps", run], ["show", run], ["log", "evil"]):
        code, out, err = cli(capsys, "--store", sqlite_url, *args)
        assert (code, err) == (0, ""), args
        assert not RAW.findall(out), (args, out)
        assert (SHOWN if args[0] != "log" else JSON_SHOWN) in out, (args, out)
        assert not any(line.strip("│ ").startswith("FORGED") for line in out.splitlines())
    code, out, _ = cli(capsys, "--store", sqlite_url, "steps", run, "--json")
    assert not RAW.findall(out)
    (only,) = json.loads(out)["steps"]
    assert (only["name"], only["result"], only["executor_id"]) == (EVIL, EVIL, EVIL)


# -- a tampered step record ---------------------------------------------------------------------


def _edit_step_result(url: str, name: str) -> int:
    """Change the model's answer in the first ``StepRecorded`` of step ``name`` that holds a
    result, in its row of ``mail``, as someone with write access to the database would (an
    event is ``[code, delta, run, superstep, executor_id, name, key, call, lineage, step_key,
    digest, result, ...]``); returns its position."""
    path = url.removeprefix("sqlite:///")
    with closing(sqlite3.connect(path)) as db, db:
        rows = db.execute(
            "SELECT originator_version, topic, state FROM steplog_events "
            "WHERE originator_id = ? ORDER BY originator_version",
            (MAIL,),
        ).fetchall()
        for last, topic, state in rows:
            body = orjson.loads(state)
            for offset, event in enumerate(body[HEADER:]):
                if event[0] == STEP_CODE and event[5] == name and isinstance(event[11], dict):
                    event[11]["response"] = "tampered"
                    db.execute(
                        "UPDATE steplog_events SET state = ? "
                        "WHERE originator_id = ? AND originator_version = ?",
                        (orjson.dumps(body), MAIL, last),
                    )
                    return last - int(topic) + 1 + offset
    raise AssertionError(f"no step record of {name!r} with a result")


def test_a_tampered_step_record_is_refused_by_every_reader(
    sqlite_url: str, capsys, monkeypatch
) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    with open_store(sqlite_url) as store:
        first, second = asyncio.run(write_mail(store))
    position = _edit_step_result(sqlite_url, "call_model")
    code, out, _ = cli(capsys, "--store", sqlite_url, "verify", "--json")
    assert code == EXIT_BROKEN_CHAIN
    problems = json.loads(out)["chain"]["problems"]
    assert [(p["instance_id"], p["position"], p["kind"]) for p in problems][:1] == [
        (MAIL, position, "edited")
    ]
    # run 2 only reads the tampered record to find what its served call reused: refused too
    for args in (
        ["steps", first],
        ["steps", second],
        ["steps", second, "--json"],
        ["show", first],
        ["log", MAIL],
    ):
        code, out, err = cli(capsys, "--store", sqlite_url, *args)
        assert (code, out) == (EXIT_BROKEN_CHAIN, ""), args
        assert f"the hash chain is broken at '{MAIL}'#{position} (edited)" in err, args
        assert "tampered" not in err
    code, out, err = cli(capsys, "--store", sqlite_url, "--allow-broken-chain", "steps", second)
    assert code == 0
    assert "tampered" in out  # read when asked, and labelled
    assert err.startswith(f"WARNING: this log's hash chain is broken at '{MAIL}'#{position}")


def test_a_forged_served_pointer_is_refused_by_steps_show_and_replay_alike(
    sqlite_url: str, capsys
) -> None:
    """A served record appended with a valid chain whose ``reused`` names another call's record:
    the chain holds, so no reader blames it; every reader refuses the record by the rule the
    runner keeps (``StepRecorded.origin_in``), saying the log does not hold together."""
    log = LogBuilder("forged", clock=ticking_clock())
    log.start_run("go", workflow_name="wf", run_id="r1")
    log.start_superstep(superstep_id="s1")
    log.invoke("agent")
    first = log.record_step("call_a", "A(hi)")
    forged = log.record_step("call_b", reused=first.position, call=1)
    log.abort("crashed", superstep="s1")
    log.abandon_run("crashed", closed_by="r2", run="r1")
    with open_store(sqlite_url) as store:
        store.append("forged", log.events(), expected_version=0)
    for args in (["steps", "r1"], ["show", "r1"], ["replay", "r1"]):
        code, out, err = cli(capsys, "--store", sqlite_url, *args)
        assert (code, out) == (EXIT_BROKEN_CHAIN, ""), args
        assert f"the log does not hold together at 'forged'#{forged.position}" in err, args
        assert "hash chain" not in err, args
