"""docs/cli.md's examples are real output: each ```console block's command is run, in order, on
one store made by real workflows with a fixed clock and counter ids (and ``mail.db``, a run of
recorded steps), and its output compared with the block. ``STEPLOG_WRITE_DOCS=1`` rewrites the
blocks instead."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import shlex
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import projections.cli.commands._durable as durable
from kernel import WorkflowBuilder, counter_ids, fork_at, open_store, record_response
from projections.cli import main
from projections.cli._demo import Checkout, Order
from tests.durable.helpers import Tick, counting, reviewing
from tests.projections.stepping import write_mail

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
BLOCK = re.compile(r"```console\n\$ steplog (?P<args>[^\n]*)\n(?P<out>.*?)```", re.S)
_HASH = re.compile(r"\b[0-9a-f]{32,64}\b")
_NEW_KEY = re.compile(r'"key":"[A-Za-z0-9_=-]{40,}"')
KEY = "Zm9yIHRoZSBkb2NzIG9ubHksIG5ldmVyIHVzZSBpdCE="  # 32 bytes, for the rekey example


def ticking(start: datetime) -> Callable[[], datetime]:
    """A clock that moves 1 ms each time it is read."""
    moments = (start + timedelta(milliseconds=n) for n in range(10**9))
    return lambda: next(moments)


async def populate(url: str, clock: Callable[[], datetime]) -> None:
    with open_store(url, create=True) as store:
        ids = counter_ids("c")

        with pytest.raises(RuntimeError):
            await counting(store, fail_at=4, clock=clock, id_factory=ids).run(Tick(1))
        await counting(store, clock=clock, id_factory=ids).resume()
        await reviewing(store, clock=clock, id_factory=counter_ids("r")).run("v1")
        checkout = WorkflowBuilder(
            start_executor=Checkout(id="checkout"),
            store=store,
            instance_id="o1",
            name="checkout",
            clock=clock,
            id_factory=counter_ids("o"),
        ).build()
        with pytest.raises(ConnectionError):
            await checkout.run(Order(id="A-1", payment_fails=True))
        await checkout.run(Order(id="A-1"))


MODEL_SECONDS = (0.0, 1.203125, 2.0, 2.00390625, 3.0, 4.0, 4.001953125, 5.0, 5.046875)
"""What ``time.perf_counter`` reads while ``mail`` runs, in the order its steps read it (start and
end of each call; ``send_email`` of run 1 never ends): the model call takes 1.2 s, the spam
check 3.9 ms and 2.0 ms, the mail 46.9 ms (binary fractions: the JSON shows them exactly). The
kernel measures a step's duration so, not with the injected clock."""


def populate_mail(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``mail.db``: the recorded steps of ``tests.projections.stepping`` (a run cancelled in its
    third step, then resumed with the first served from the log), with its own fixed clock."""
    readings = iter(MODEL_SECONDS)
    clock = ticking(datetime(2026, 11, 30, 15, 10, tzinfo=UTC))
    with monkeypatch.context() as patched, open_store(url, create=True) as store:
        patched.setattr(time, "perf_counter", lambda: next(readings))
        asyncio.run(write_mail(store, clock=clock, id_factory=counter_ids("m")))
    assert next(readings, None) is None  # every reading taken: the durations are the ones meant


def run(args: str, capsys: pytest.CaptureFixture[str]) -> str:
    code = main(shlex.split(args))
    captured = capsys.readouterr()
    text = captured.out + captured.err
    text = "\n".join(line.rstrip() for line in text.splitlines())
    text = _HASH.sub("<hash>", text)
    text = _NEW_KEY.sub('"key":"<a new random key>"', text)
    if code:
        text += f"\n(exit status {code})"
    return text.strip("\n") + "\n"


def test_the_examples_in_cli_md_are_real_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # the default store: sqlite:///steplog.db, here
    monkeypatch.delenv("STEPLOG_STORE", raising=False)
    monkeypatch.delenv("STEPLOG_KEYS", raising=False)
    monkeypatch.setenv("COLUMNS", "110")
    clock = ticking(datetime(2026, 11, 30, 14, 55, tzinfo=UTC))
    asyncio.run(populate("sqlite:///steplog.db", clock))
    populate_mail("sqlite:///mail.db", monkeypatch)
    monkeypatch.setattr(
        durable,
        "record_response",
        functools.partial(record_response, clock=clock, id_factory=counter_ids("answer")),
    )
    monkeypatch.setattr(durable, "fork_at", functools.partial(fork_at, clock=clock))
    (tmp_path / "keys.txt").write_text(KEY + "\n")
    text = DOC.read_text()
    shown: list[tuple[str, str, str]] = []
    for found in BLOCK.finditer(text):
        shown.append((found["args"], found["out"], run(found["args"], capsys)))
    assert len(shown) >= 20
    if os.environ.get("STEPLOG_WRITE_DOCS"):
        outputs = iter(shown)

        def fill(found: re.Match[str]) -> str:
            args, _, output = next(outputs)
            return f"```console\n$ steplog {args}\n{output}```"

        DOC.write_text(BLOCK.sub(fill, text))
        return
    for args, documented, output in shown:
        assert documented == output, f"docs/cli.md is stale for 'steplog {args}'"


@pytest.mark.parametrize("demos", [1, 2], ids=["demo once", "demo twice"])
def test_the_readme_tour_runs_after_the_demo(
    demos: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every ``steplog`` line of the README's tour exits 0 on what ``steplog demo`` wrote (RUN:
    the demo's first run); and the same after the README's demo command was run twice, each time
    exiting 0: the second demo writes fresh instances, so the tour reads the first one's, as
    written."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("STEPLOG_STORE", raising=False)
    readme = (DOC.parents[1] / "README.md").read_text()
    (demo,) = re.findall(r"\.venv/bin/steplog (demo[^\n]*)", readme)
    assert main(shlex.split(demo)) == 0
    with open_store("sqlite:///steplog.db") as store:
        run_id = store.read("orders-1", upto=1)[0].run_id
        first = {name: store.read(name) for name in store.instances()}
    for _ in range(demos - 1):
        capsys.readouterr()
        assert main(shlex.split(demo)) == 0, capsys.readouterr().err
        with open_store("sqlite:///steplog.db") as store:
            assert {name: store.read(name) for name in first} == first  # left as they were
    tour = re.search(r"look at what it wrote.*?```bash\n(.*?)```", readme, re.S)
    assert tour is not None
    lines = [line.split("#")[0].strip() for line in tour[1].splitlines()]
    commands = [part.strip() for line in lines for part in line.split("&&") if part.strip()]
    assert len(commands) >= 14
    capsys.readouterr()
    for command in commands:
        args = shlex.split(command)[1:]
        if "RUN" in args:  # an id may start with "-": after "--"
            at = args.index("RUN")
            args = [*args[:at], "--", run_id, *args[at + 1 :]]
        code = main(args)
        captured = capsys.readouterr()
        assert code == 0, (command, captured.err)
    # what the tour's comments say still holds: orders-1 holds the failed run and the one after
    assert main(["runs", "orders-1", "--json"]) == 0
    statuses = [r["status"] for r in json.loads(capsys.readouterr().out)["runs"]]
    assert statuses == ["failed", "completed"]
