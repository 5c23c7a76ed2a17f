"""Every ``steplog`` command through ``main``, on stores made by running real workflows (SQLite
and PostgreSQL): the tables, the ``--json`` documents checked against the shipped schemas, the
unique-prefix ids, and ``respond``/``fork`` continued by the workflow itself."""

from __future__ import annotations

import asyncio
import io
import json
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import jsonschema
import pytest
from rich.console import Console

import projections.cli._progress as progress_bar
from kernel import open_store
from projections.cli import COMMANDS, EXIT_BAD_INPUT, EXIT_PROBLEM, main, schema_of
from projections.cli._demo import run_demo
from tests.durable.helpers import Tick, counting, reviewing

STREAMS = frozenset({"log", "replay"})


@dataclass
class Prepared:
    url: str
    failed_run: str  # count's first run (failed at 4), then resumed
    resumed_run: str
    waiting_run: str  # r's run, waiting for input
    request_id: str


async def prepare(url: str) -> Prepared:
    with open_store(url, create=True) as store:
        with pytest.raises(RuntimeError):
            await counting(store, fail_at=4).run(Tick(1))
        await counting(store).resume()
        starts = [e.run_id for e in store.read("count") if e.type == "run_started"]
        waiting = await reviewing(store).run("v1")
        (request,) = waiting.pending_requests
        await run_demo(store, "o1")
        return Prepared(url, starts[0], starts[1], request.run_id, request.request_id)


@pytest.fixture
def prepared(durable_store_url: str, monkeypatch: pytest.MonkeyPatch) -> Prepared:
    monkeypatch.setenv("COLUMNS", "250")
    return asyncio.run(prepare(durable_store_url))


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def documents(command: str, out: str) -> Iterator[Any]:
    """The JSON documents of ``out``: exactly one, or one per line for a stream."""
    lines = out.splitlines()
    if command not in STREAMS:
        assert len(lines) == 1, out
    for line in lines:
        yield json.loads(line)


def json_commands(p: Prepared) -> list[list[str]]:
    return [
        ["instances"],
        ["runs"],
        ["runs", "cou"],
        ["show", "--", p.failed_run[:6]],
        ["log", "o1"],
        ["log", "count", "--type", "state_staged", "--limit", "2"],
        ["state", "o1"],
        ["state", "count", "pos:9", "--key", "count"],
        ["history", "count"],
        ["history", "r"],
        ["blame", "o1", "secret"],
        ["diff", "o1", "pos:0", "pos:15"],
        ["bisect", "count", "--key", "count", "--equals", "3"],
        ["bisect", "count", "--key", "count", "--exists"],
        ["checkpoints", "count"],
        ["requests"],
        ["requests", "r"],
        ["replay", "--", p.resumed_run[:6]],
        ["steps", "--", p.resumed_run[:6]],
        ["head", "count"],
        ["verify"],
        ["recover"],
        ["project"],
        ["rebuild"],
        ["rebuild", "state"],
        ["keygen"],
        ["fork", "count", f"run:{p.failed_run[:6]}:2", "--to", "count-f"],
        ["respond", "--", p.waiting_run[:6], p.request_id, '"approve"'],
    ]


def test_every_command_prints_one_json_document_of_its_schema(
    prepared: Prepared, capsys: pytest.CaptureFixture[str]
) -> None:
    seen = set()
    for args in json_commands(prepared):
        code, out, err = cli(capsys, "--store", prepared.url, args[0], "--json", *args[1:])
        assert code == 0, (args, err)
        schema = schema_of(args[0])
        found = list(documents(args[0], out))
        assert found, args
        for document in found:
            jsonschema.validate(document, schema)
        seen.add(args[0])
    # every command but demo and rekey (tested apart: a child process, and keys), completion and
    # ui (no JSON output: tests/ui)
    assert seen == set(COMMANDS) - {"demo", "rekey", "completion", "ui"}


def test_every_command_has_a_schema_and_each_schema_is_valid() -> None:
    for command in set(COMMANDS) - {"completion", "ui"}:
        jsonschema.Draft202012Validator.check_schema(schema_of(command))


def test_demo_and_rekey_json_match_their_schemas(
    sqlite_url: str, capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    code, out, _ = cli(capsys, "--store", sqlite_url, "demo", "--instance", "d", "--json")
    assert code == 0
    (document,) = documents("demo", out)
    jsonschema.validate(document, schema_of("demo"))
    assert document["leaked"] is False
    assert document["wrote"] == ["d", "d-recovery", "d-recovery-fork"]
    code, out, _ = cli(capsys, "keygen", "--json")
    keys = tmp_path / "keys"
    keys.write_text(json.loads(out)["key"])
    code, out, err = cli(capsys, "--store", sqlite_url, "--keys-file", str(keys), "rekey", "--json")
    assert code == 0, err
    (document,) = documents("rekey", out)
    jsonschema.validate(document, schema_of("rekey"))
    assert document["rows"]["sealed"] > 0
    code, out, err = cli(capsys, "--store", sqlite_url, "state", "d")  # no key given
    assert (code, out) == (EXIT_BAD_INPUT, "")
    assert "give its key (STEPLOG_KEYS=... or --keys-file FILE)" in err
    assert "damaged" not in err  # a missing key is not a damaged row


def test_runs_and_show_tell_status_counts_and_supersteps(
    prepared: Prepared, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = cli(capsys, "--store", prepared.url, "runs", "--json")
    runs = {(r["instance_id"], r["run_id"]): r for r in json.loads(out)["runs"]}
    failed = runs[("count", prepared.failed_run)]
    assert (failed["status"], failed["committed"], failed["aborted"]) == ("failed", 3, 1)
    assert failed["error"]["message"] == "boom at 4"
    assert runs[("count", prepared.resumed_run)]["continues"] == prepared.failed_run
    assert runs[("r", prepared.waiting_run)]["status"] == "awaiting_input"

    code, out, _ = cli(capsys, "--store", prepared.url, "runs", "r")
    assert code == 0
    assert "waiting for input" in out
    code, out, _ = cli(capsys, "--store", prepared.url, "runs")
    assert "boom at 4" in out
    assert "o1" in out

    code, out, _ = cli(capsys, "--store", prepared.url, "show", "--", prepared.failed_run[:5])
    assert code == 0
    assert f"run {prepared.failed_run} of count" in out
    assert "aborted (failed)" in out
    assert out.count("committed") >= 3
    code, out, _ = cli(capsys, "--store", prepared.url, "show", "--json", "--", prepared.failed_run)
    shown = json.loads(out)
    assert [s["status"] for s in shown["supersteps"]] == ["committed"] * 3 + ["aborted"]
    assert shown["supersteps"][0]["keys"] == ["count"]
    assert list(shown["messages"].values()) == [1, 1, 1, 0]  # the failed one sent nothing


def test_log_filters_and_streams_with_the_folds_verdicts(
    prepared: Prepared, capsys: pytest.CaptureFixture[str]
) -> None:
    url = prepared.url
    code, out, _ = cli(capsys, "--store", url, "log", "o1", "--json")
    every = [json.loads(line) for line in out.splitlines()]
    assert [e["position"] for e in every] == list(range(1, len(every) + 1))
    code, out, _ = cli(capsys, "--store", url, "log", "o1", "--type", "state_staged", "--json")
    writes = [json.loads(line) for line in out.splitlines()]
    assert [(w["key"], w["write_status"], w["counts"]) for w in writes] == [
        ("secret", "aborted", False),
        ("charged", "committed", True),
    ]
    code, out, _ = cli(capsys, "--store", url, "log", "count", f"--run={prepared.resumed_run[:7]}")
    assert code == 0
    assert f"│ {prepared.failed_run[:8]} │" not in out
    assert f"│ {prepared.resumed_run[:8]} │" in out
    code, out, _ = cli(
        capsys, "--store", url, "log", "count", f"--run={prepared.resumed_run[:7]}", "--json"
    )
    assert {json.loads(line)["run_id"] for line in out.splitlines()} == {prepared.resumed_run}
    code, out, _ = cli(
        capsys, "--store", url, "log", "count", "--from", "5", "--limit", "3", "--json"
    )
    assert [json.loads(line)["position"] for line in out.splitlines()] == [5, 6, 7]
    with open_store(url) as store:
        step = next(e for e in store.read("count") if e.type == "superstep_aborted")
    code, out, _ = cli(
        capsys, "--store", url, "log", "count", f"--superstep={step.superstep_id[:6]}", "--json"
    )
    lines = [json.loads(line) for line in out.splitlines()]
    assert {line["superstep_id"] for line in lines} == {step.superstep_id}
    assert lines[-1]["type"] == "superstep_aborted"
    code, _, err = cli(capsys, "--store", url, "log", "o1", "--type", "state_stagged")
    assert code == EXIT_BAD_INPUT
    assert "did you mean 'state_staged'" in err


def test_checkpoints_requests_and_replay(
    prepared: Prepared, capsys: pytest.CaptureFixture[str]
) -> None:
    url = prepared.url
    code, out, _ = cli(capsys, "--store", url, "checkpoints", "count", "--json")
    marks = json.loads(out)["checkpoints"]
    with open_store(url) as store:
        known = counting(store).checkpoints()
        expected = [c.checkpoint_id for c in known]
    assert [m["checkpoint_id"] for m in marks] == expected
    assert [m["latest"] for m in marks] == [False] * (len(marks) - 1) + [True]
    # the log says each status here (the failed run was resumed to its end): the workflow's
    assert [m["status"] for m in marks] == [c.status for c in known]
    assert [m["status"] for m in marks] == ["superseded"] * (len(marks) - 1) + ["completed"]
    code, out, _ = cli(capsys, "--store", url, "checkpoints", "count")
    assert expected[-1] in out
    assert "latest" in out
    assert out.count("superseded") == len(marks) - 1
    assert "completed" in out

    code, out, _ = cli(capsys, "--store", url, "requests", "--json")
    (request,) = json.loads(out)["requests"]
    assert (request["instance_id"], request["run_id"], request["request_id"]) == (
        "r",
        prepared.waiting_run,
        prepared.request_id,
    )
    assert request["response_type"] == "str"
    code, out, _ = cli(capsys, "--store", url, "requests")
    assert prepared.request_id in out
    assert "steplog respond RUN REQUEST_ID JSON" in out

    code, out, _ = cli(capsys, "--store", url, "replay", "--json", "--", prepared.resumed_run[:6])
    events = [json.loads(line) for line in out.splitlines()]
    outputs = [e["data"] for e in events if e["type"] == "output"]
    assert outputs == [4, 5]
    assert events[-1]["type"] == "completed"
    code, out, _ = cli(capsys, "--store", url, "replay", "--", prepared.failed_run[:6])
    assert (code, "boom at 4" in out) == (0, True)


def test_respond_records_a_response_the_workflow_then_continues_with(
    prepared: Prepared, capsys: pytest.CaptureFixture[str]
) -> None:
    url = prepared.url
    with open_store(url) as store:
        before = store.version("r")
    code, _, err = cli(capsys, "--store", url, "respond", "--", prepared.waiting_run, "nope", '"x"')
    assert code == EXIT_BAD_INPUT
    assert "no pending request 'nope'" in err
    code, _, err = cli(
        capsys, "--store", url, "respond", "--", prepared.waiting_run, prepared.request_id, "42"
    )
    assert code == EXIT_BAD_INPUT
    assert "must be a str; got a int" in err
    code, _, err = cli(
        capsys, "--store", url, "respond", "--", prepared.waiting_run, prepared.request_id, "{oops"
    )
    assert code == EXIT_BAD_INPUT
    with open_store(url) as store:
        assert store.version("r") == before  # refused: nothing appended

    code, out, _ = cli(
        capsys, "--store", url, "respond", "--", prepared.waiting_run[:6], prepared.request_id,
        '"approve"',
    )  # fmt: skip
    assert code == 0
    assert f"recorded the response to request {prepared.request_id} of r" in out
    code, out, _ = cli(capsys, "--store", url, "requests", "--json")
    assert json.loads(out)["requests"] == []
    code, _, err = cli(
        capsys, "--store", url, "respond", "--", prepared.waiting_run, prepared.request_id,
        '"again"',
    )  # fmt: skip
    assert code == EXIT_BAD_INPUT

    with open_store(url) as store:
        recorded = store.read("r", after=before)
        assert [e.type for e in recorded] == [
            "run_started",
            "response_received",
            "run_awaiting_input",
        ]
        assert recorded[0].continues == prepared.waiting_run
        wf = reviewing(store)
        result = asyncio.run(wf.resume())
        assert result.get_outputs() == ["v1"]
        assert wf.committed_state() == {"draft": "v1", "approved": "v1"}


def test_fork_starts_an_instance_the_workflow_can_resume(
    prepared: Prepared, capsys: pytest.CaptureFixture[str]
) -> None:
    url = prepared.url
    with open_store(url) as store:
        second = counting(store).checkpoints()[1].checkpoint_id
    code, out, _ = cli(capsys, "--store", url, "fork", "count", f"step:{second[:7]}", "--to", "b")
    assert code == 0
    assert "into b" in out
    assert "wrote b#1 (instance_forked)" in out
    code, out, _ = cli(capsys, "--store", url, "state", "b", "--json")
    assert json.loads(out) == {"count": 2}
    with open_store(url) as store:
        (forked,) = store.read("b")
        assert forked.checkpoint == second
        result = asyncio.run(counting(store, "b").resume())
        assert result.get_outputs() == [1, 2, 3, 4, 5]
        assert counting(store).committed_state() == {"count": 5}  # the origin is as it was
    code, _, err = cli(capsys, "--store", url, "fork", "count", "pos:3", "--to", "b")
    assert code == EXIT_BAD_INPUT
    assert "already has events" in err


def test_a_fork_of_a_waiting_run_inherits_its_request(
    prepared: Prepared, capsys: pytest.CaptureFixture[str]
) -> None:
    url = prepared.url
    version = open_store(url).version("r")
    code, _, err = cli(capsys, "--store", url, "fork", "r", f"pos:{version}", "--to", "r2")
    assert code == 0, err
    code, out, _ = cli(capsys, "--store", url, "requests", "r2", "--json")
    (request,) = json.loads(out)["requests"]
    assert request["request_id"] == prepared.request_id
    with open_store(url) as store:
        wf = reviewing(store, "r2")
        assert [r.request_id for r in wf.pending_requests()] == [prepared.request_id]


def test_unique_prefixes_ambiguity_and_closest_matches(
    prepared: Prepared, capsys: pytest.CaptureFixture[str]
) -> None:
    url = prepared.url
    code, out, _ = cli(capsys, "--store", url, "state", "cou", "--json")
    assert (code, json.loads(out)) == (0, {"count": 5})
    assert cli(capsys, "--store", url, "fork", "count", "pos:9", "--to", "count-b")[0] == 0
    code, _, err = cli(capsys, "--store", url, "history", "cou")
    assert code == EXIT_BAD_INPUT
    assert "instance 'cou' is ambiguous" in err
    assert "(count, count-b)" in err
    assert cli(capsys, "--store", url, "history", "count")[0] == 0  # an exact id wins
    code, _, err = cli(capsys, "--store", url, "history", "cuont")
    assert code == EXIT_BAD_INPUT
    assert "no instance 'cuont'" in err
    assert "closest: count" in err
    code, _, err = cli(capsys, "--store", url, "show", "zzzz")
    assert code == EXIT_BAD_INPUT
    assert "no run 'zzzz'" in err
    code, _, err = cli(capsys, "--store", url, "state", "count", "--key", "cont")
    assert code == EXIT_BAD_INPUT
    assert "closest: count" in err
    code, _, err = cli(capsys, "--store", url, "blame", "o1", "secrte")
    assert code == EXIT_BAD_INPUT
    assert "key 'secrte' was never written in 'o1'; closest: secret" in err
    code, _, err = cli(capsys, "--store", url, "state", "count", "time:2026-11-30T14:55:00")
    assert code == EXIT_BAD_INPUT
    assert "has no timezone" in err
    for bad in ("pos:x", "time:yesterday", "time:2026-13-01T00:00Z", "step:", "when:now"):
        code, _, err = cli(capsys, "--store", url, "state", "count", bad)
        assert code == EXIT_BAD_INPUT, bad
        assert len(err.strip().splitlines()) == 1
        assert "Traceback" not in err


def test_bisect_exists_equals_and_never(
    prepared: Prepared, capsys: pytest.CaptureFixture[str]
) -> None:
    url = prepared.url
    code, out, _ = cli(capsys, "--store", url, "bisect", "count", "--key", "count", "--json")
    found = json.loads(out)["found"]
    assert (code, found["index"]) == (0, 1)
    code, out, _ = cli(
        capsys, "--store", url, "bisect", "count", "--key", "count", "--equals", "4", "--json"
    )
    assert json.loads(out)["found"]["run_id"] == prepared.resumed_run
    code, out, _ = cli(capsys, "--store", url, "bisect", "o1", "--key", "secret", "--json")
    assert (code, json.loads(out)["found"]) == (EXIT_PROBLEM, None)


def test_debug_shows_the_traceback_and_without_it_one_line(
    sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["--store", sqlite_url, "project"])
    capsys.readouterr()
    code, out, err = cli(capsys, "--store", sqlite_url, "state", "nope")
    assert (code, out, len(err.strip().splitlines())) == (EXIT_BAD_INPUT, "", 1)
    with pytest.raises(Exception, match="no instance 'nope'"):
        main(["--debug", "--store", sqlite_url, "state", "nope"])


def test_an_unreachable_store_masks_its_password(capsys: pytest.CaptureFixture[str]) -> None:
    url = "postgresql://app:hunter2@127.0.0.1:1/test"
    for command in (["instances"], ["runs", "--json"], ["requests"]):
        code, out, err = cli(capsys, "--store", url, *command)
        assert code == 3
        assert out == ""
        assert "hunter2" not in err
        assert "app:***@127.0.0.1:1" in err
        assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_scripts_name_every_command(
    shell: str, capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    code, out, _ = cli(capsys, "completion", shell)
    assert code == 0
    for command in COMMANDS:
        assert command in out, command
    assert ("-l json" if shell == "fish" else "--json") in out
    if shell == "bash" and shutil.which("bash"):
        script = tmp_path / "steplog.bash"
        script.write_text(out)
        subprocess.run(["bash", "-n", str(script)], check=True)
        words = subprocess.run(
            ["bash", "-c", f'source {script}; COMP_WORDS=(steplog lo); COMP_CWORD=1; _steplog; '
             'echo "${COMPREPLY[@]}"'],
            check=True, capture_output=True, text=True,
        ).stdout.split()  # fmt: skip
        assert words == ["log"]
        after_a_value = subprocess.run(
            ["bash", "-c", f'source {script}; COMP_WORDS=(steplog --store x runs --j); '
             'COMP_CWORD=4; _steplog; echo "${COMPREPLY[@]}"'],
            check=True, capture_output=True, text=True,
        ).stdout.split()  # fmt: skip
        assert after_a_value == ["--json"]  # "x" is --store's value, not a command
    if shell == "zsh" and shutil.which("zsh"):
        script = tmp_path / "_steplog"
        script.write_text(out)
        subprocess.run(["zsh", "-n", str(script)], check=True)
    if shell == "fish" and shutil.which("fish"):
        script = tmp_path / "steplog.fish"
        script.write_text(out)
        subprocess.run(["fish", "-n", str(script)], check=True)

        def offered(line: str) -> list[str]:
            done = subprocess.run(
                ["fish", "-c", f"source {script}; complete -C {shlex.quote(line)}"],
                check=True, capture_output=True, text=True,
            )  # fmt: skip
            return [row.split("\t")[0] for row in done.stdout.splitlines()]

        assert offered("steplog lo") == ["log"]
        assert offered("steplog --store x ru") == ["runs"]
        assert "--type" in offered("steplog log --ty")


def test_rebuild_and_verify_show_progress_on_a_terminal_only(
    prepared: Prepared, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = cli(capsys, "--store", prepared.url, "rebuild")
    assert (code, err) == (0, "")  # piped: no bar
    assert "state: rebuilt up to global position" in out
    code, out, err = cli(capsys, "--store", prepared.url, "verify", "--json")
    assert (code, err) == (0, "")
    assert all(view["ok"] for view in json.loads(out)["views"].values())

    screen = io.StringIO()

    def terminal(*args: Any, stderr: bool = False, **kwargs: Any) -> Console:
        if stderr:
            return Console(file=screen, force_terminal=True, width=120)
        return Console(*args, **kwargs)

    monkeypatch.setattr(progress_bar, "Console", terminal)
    code, out, _ = cli(capsys, "--store", prepared.url, "rebuild", "history")
    assert code == 0
    shown = screen.getvalue()
    assert "rebuilding history" in shown
    assert " events" in shown
    assert "/s" in shown  # the rate


def test_json_may_also_come_before_the_command(
    prepared: Prepared, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = cli(capsys, "--store", prepared.url, "--json", "instances")
    assert code == 0
    jsonschema.validate(json.loads(out), schema_of("instances"))
