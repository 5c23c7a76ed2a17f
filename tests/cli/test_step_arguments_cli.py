"""Recorded arguments (``@step(record_arguments=True)``) as the readers show them: ``steplog
steps`` (its table and ``--json``, checked against the shipped schema), ``steplog replay`` and the
UI's timeline. A model call's prompt and response are shown one message a line (role and text),
whether the codec stored the messages as tagged objects or as plain fields; hostile text is
escaped; a sensitive step's arguments and result are redacted unless ``--reveal``."""

from __future__ import annotations

import asyncio
import html
import json
import re
from typing import Any

import jsonschema
import pytest
from starlette.testclient import TestClient

from kernel import (
    Executor,
    WorkflowBuilder,
    WorkflowContext,
    handler,
    open_store,
    step,
)
from projections import REDACTED
from projections.cli import main, schema_of
from projections.ui import create_app
from tests.cli.test_steps_cli import EVIL
from tests.cli.test_stored_escapes import RAW
from tests.ui.conftest import LOCAL

SECRET = "zq7-SECRET-card-4111"
CHAT = "chat"


class Msg:
    """A message shaped as Agent Framework's ``Message`` stores itself (``to_dict``), so that
    the codec stores it as a tagged object (``{"$t": "object", ...}``), as it does AF's."""

    def __init__(self, role: str, text: str) -> None:
        self.role, self.text = role, text

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "message",
            "role": self.role,
            "contents": [{"type": "text", "text": self.text, "additional_properties": {}}],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Msg:
        return cls(data["role"], data["contents"][0]["text"])


@step(record_arguments=True)
async def model_call(messages: list[Msg], options: dict[str, Any]) -> dict[str, Any]:
    reply = {"type": "text", "text": f"Hello!\n{EVIL}"}
    call = {"type": "function_call", "call_id": "c1", "name": "charge", "arguments": "{}"}
    return {"type": "chat_response", "messages": [{"role": "assistant", "contents": [reply, call]}]}


@step(record_arguments=True)
async def charge(card: str, amount: int = 5) -> str:
    return f"charged {amount} to {card}"


class Chat(Executor):
    @handler
    async def talk(self, text: str, ctx: WorkflowContext[str, str]) -> None:
        prompt = [Msg("system", "Be brief."), Msg("user", text)]
        await model_call(prompt, {"temperature": 0.1})
        await charge(SECRET)
        await ctx.yield_output("done")  # (an output is not redacted: it holds no secret)


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def chatted(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """The store's URL and its one run: a model call (its prompt holds hostile text) and a
    charge of the card ``SECRET``; ``charge`` is declared sensitive."""
    monkeypatch.setenv("COLUMNS", "300")
    with open_store(sqlite_url) as store:
        workflow = WorkflowBuilder(
            start_executor=Chat(id="chat"),
            store=store,
            instance_id=CHAT,
            sensitive_keys=["charge"],
        ).build()
        asyncio.run(workflow.run(f"Hi {EVIL}"))
        run = store.read(CHAT, upto=1)[0].run_id
    return sqlite_url, run


def test_steps_json_has_the_arguments_and_matches_its_schema(chatted, capsys) -> None:
    url, run = chatted
    code, out, err = cli(capsys, "--store", url, "steps", run, "--json")
    assert (code, err) == (0, "")
    document = json.loads(out)
    jsonschema.validate(document, schema_of("steps"))
    model, charged = document["steps"]
    messages = model["arguments"]["messages"]
    assert [m["$t"] for m in messages] == ["object", "object"]  # as the codec stores them
    assert messages[1]["v"]["contents"][0]["text"] == f"Hi {EVIL}"
    assert model["arguments"]["options"] == {"temperature": 0.1}
    assert charged["arguments"] == dict(REDACTED)  # declared sensitive: arguments and result
    assert charged["result"] == dict(REDACTED)
    code, out, _ = cli(capsys, "--store", url, "steps", run, "--json", "--reveal")
    charged = json.loads(out)["steps"][1]
    assert (charged["arguments"], charged["result"]) == (
        {"card": SECRET, "amount": 5},
        f"charged 5 to {SECRET}",
    )


def test_steps_shows_the_prompt_and_the_response_as_messages_escaped(chatted, capsys) -> None:
    url, run = chatted
    code, out, err = cli(capsys, "--store", url, "steps", run)
    assert (code, err) == (0, "")
    assert not RAW.findall(out), out
    assert SECRET not in out
    lines = result_column(out)
    assert lines[:9] == [
        "arguments:",
        "messages: system: Be brief.",
        r"user: Hi ev\x1b[2J\u202e[bold]x",
        "  FORGED",  # a text's own lines are indented: none passes for a message
        'options: {"temperature":0.1}',
        "result:",
        "assistant: Hello!",  # a model's answer keeps its lines
        r"  ev\x1b[2J\u202e[bold]x",
        "  FORGED calls charge({}) [c1]",
    ]
    assert lines[9:] == ["arguments:", '{"$t":"redacted"}', "result:", '{"$t":"redacted"}']
    code, out, _ = cli(capsys, "--store", url, "steps", run, "--reveal")
    assert f'card: "{SECRET}"' in result_column(out)


def result_column(out: str) -> list[str]:
    """The lines of the table's last column (``result``), as printed."""
    rows = [line.split("│") for line in out.splitlines() if line.startswith("│")]
    return [row[-2][1:].rstrip() for row in rows]


def test_replay_redacts_a_sensitive_steps_result_unless_revealed(chatted, capsys) -> None:
    url, run = chatted
    for given in ([], ["--json"]):
        code, out, err = cli(capsys, "--store", url, "replay", run, *given)
        assert (code, err) == (0, ""), given
        assert SECRET not in out, given
        assert "redacted" in out, given
        code, out, _ = cli(capsys, "--store", url, "replay", run, *given, "--reveal")
        assert f"charged 5 to {SECRET}" in out, given
    code, out, _ = cli(capsys, "--store", url, "replay", run, "--json")
    events = [json.loads(line) for line in out.splitlines()]
    (charged,) = [
        e for e in events if e["type"] == "executor_completed" and e["executor_id"] == "charge"
    ]
    assert charged["data"] == dict(REDACTED)
    (model,) = [
        e for e in events if e["type"] == "executor_completed" and e["executor_id"] == "model_call"
    ]
    assert model["data"]["messages"][0]["role"] == "assistant"  # another step: as it is
    code, out, _ = cli(capsys, "--store", url, "replay", run, "--json", "--sensitive", "model_*")
    assert "Hello!" not in out


def test_the_timeline_shows_arguments_then_result_as_text(chatted) -> None:
    url, _ = chatted
    with (
        open_store(url, create=False) as store,
        TestClient(create_app(store), base_url=LOCAL) as client,
    ):
        page = client.get(f"/i/{CHAT}").text
    assert not RAW.findall(page.replace("\n", ""))
    assert SECRET not in page
    assert "<bold>" not in page  # markup never applied
    labels = [html.unescape(label) for label in _labels(page)]
    assert labels == [
        "arguments: messages", "arguments: options", "result",
        "arguments", "result",
    ]  # fmt: skip
    texts = [html.unescape(text) for text in _texts(page)]
    assert texts[0] == "system: Be brief.\nuser: Hi ev\\x1b[2J\\u202e[bold]x\n  FORGED"
    assert texts[2].startswith("assistant: Hello!\n  ev\\x1b[2J")
    assert texts[3] == texts[4] == '{"$t":"redacted"}'


def _labels(page: str) -> list[str]:
    return re.findall(r'<div class="io-label">(.*?)</div><pre class="step-text', page)


def _texts(page: str) -> list[str]:
    return re.findall(r'<pre class="step-text[^"]*">(.*?)</pre>', page, re.S)
