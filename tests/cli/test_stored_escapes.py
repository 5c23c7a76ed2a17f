"""Stored text never drives the auditor's terminal.

A log holds terminal escapes (clear the screen, retitle the window), a newline that would forge
a line of output, a carriage return and a tab, DEL, a C1 control (``U+009B``, CSI on some
terminals), a bidi override, rich markup and an emoji code, in its instance id, run ids, workflow
name, executor id, keys, error texts, custom event type, request id and response type. Every
command that shows them, and every error message naming them, shows each such character escaped
visibly (``\\x1b``, ``\\n``, ``\\u202e``), and markup and emoji codes as they are; ``--json``
output is valid JSON holding the exact text, with no raw control character either. On a real
pseudo-terminal too, where rich writes its own colours: only those reach it.
"""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from kernel import ErrorInfo, open_store
from kernel.testing import LogBuilder, ticking_clock
from projections.cli import main

EVIL = "ev\x1b[2J\x1b]0;pwned\x07\u202e[bold]x\nFORGED\r\t\x7f\x9b31m"
"""Stored text an attacker chose."""
SHOWN = r"ev\x1b[2J\x1b]0;pwned\x07\u202e[bold]x\nFORGED\r\t\x7f\x9b31m"
"""How a command shows it."""
RUN1, RUN2 = EVIL + "-run1", EVIL + "-run2"
REQUEST = EVIL + "-request"
STEPLOG = [sys.executable, "-c", "import sys; from projections.cli import main; sys.exit(main())"]
"""The ``steplog`` command, run in a child process."""
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
"""What must never reach a terminal raw (a line feed may: the command's own lines)."""


def hostile_log(url: str) -> int:
    """The hostile instance ``EVIL``: a failed run, then a run waiting for a response; returns
    its version."""
    log = LogBuilder(EVIL, clock=ticking_clock())
    log.start_run(EVIL, workflow_name=EVIL, run_id=RUN1)
    log.start_superstep(superstep_id=EVIL + "-step1")
    log.invoke(EVIL)
    log.write(EVIL, EVIL)
    log.custom_event(EVIL, EVIL)
    log.fail(error=ErrorInfo(type=EVIL, message=EVIL))
    log.abort(error=ErrorInfo(type=EVIL, message=EVIL))
    log.fail_run(ErrorInfo(type=EVIL, message=EVIL))
    log.start_run(EVIL, workflow_name=EVIL, run_id=RUN2)
    log.start_superstep(superstep_id=EVIL + "-step2")
    log.invoke(EVIL)
    log.write(EVIL, EVIL)
    log.write("[bold]k", 1)
    log.write(":warning: k", 2)
    log.output(EVIL)
    log.request(EVIL, request_id=REQUEST, response_type=EVIL)
    log.commit()
    log.await_input([REQUEST])
    with open_store(url) as store:
        log.append_to(store)
    return log.version


@pytest.fixture
def hostile(sqlite_url: str) -> tuple[str, int]:
    return sqlite_url, hostile_log(sqlite_url)


def commands(version: int) -> list[list[str]]:
    """Every command that prints stored text of the hostile log (and errors naming it)."""
    return [
        ["instances"],
        ["runs"],
        ["runs", EVIL],
        ["show", RUN1],
        ["show", RUN2],
        ["log", EVIL],
        ["state", EVIL],
        ["state", EVIL, f"pos:{version}"],
        ["history", EVIL],
        ["blame", EVIL, EVIL],
        ["blame", EVIL, "[bold]k"],
        ["diff", EVIL, "pos:1", f"pos:{version}"],
        ["bisect", EVIL, "--key", EVIL],
        ["checkpoints", EVIL],
        ["requests"],
        ["requests", EVIL],
        ["replay", RUN2],
    ]


ERRORS = [
    ["blame", EVIL, "nothing"],  # names the instance, and the closest keys
    ["state", EVIL, "--key", EVIL + "?"],
    ["show", EVIL + "-runX"],  # names the closest run ids
    ["log", EVIL, "--superstep", EVIL + "-stepX"],
]


def lines_of(text: str) -> list[str]:
    return [line.strip("│┃ ") for line in text.splitlines()]


def test_every_command_shows_stored_controls_escaped_and_markup_as_it_is(
    hostile: tuple[str, int], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, version = hostile
    monkeypatch.setenv("COLUMNS", "400")  # no cell is folded: the escaped text shows whole
    for args in commands(version):
        status = main(["--store", url, *args])
        captured = capsys.readouterr()
        shown = captured.out + captured.err
        assert status in (0, 1), (args, shown)
        assert not RAW.findall(shown), (args, RAW.findall(shown), shown)
        assert not any(line.startswith("FORGED") for line in lines_of(shown)), (args, shown)
        assert SHOWN in shown or "[bold]k" in shown, (args, shown)
    for args in ERRORS:
        assert main(["--store", url, *args]) == 2, args
        err = capsys.readouterr().err
        assert err.count("\n") == 1, (args, err)
        assert err.startswith("steplog: "), (args, err)
        assert not RAW.findall(err), (args, err)
        assert r"\nFORGED" in err, (args, err)  # the id is named, its newline shown
        if args[0] == "show":  # the closest run ids, as stored (not with a space for "\n")
            assert f"{SHOWN}-run1" in err, err
            assert f"{SHOWN}-run2" in err, err


def test_markup_and_emoji_codes_in_a_key_are_shown_never_applied(
    hostile: tuple[str, int], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = hostile
    monkeypatch.setenv("COLUMNS", "400")
    markup, emoji = "[bold]k", ":warning: k"
    for args, keys in (
        (["state", EVIL], (markup, emoji)),
        (["log", EVIL], (markup, emoji)),
        (["blame", EVIL, markup], (markup,)),
        (["blame", EVIL, emoji], (emoji,)),
    ):
        assert main(["--store", url, *args]) == 0
        out = capsys.readouterr().out
        for key in keys:
            assert key in out, (args, key)


def documents(out: str) -> list[Any]:
    return [orjson.loads(line) for line in out.splitlines() if line.strip()]


def test_json_output_is_valid_json_with_the_exact_text_and_no_raw_control(
    hostile: tuple[str, int], capsys: pytest.CaptureFixture[str]
) -> None:
    url, version = hostile
    for args in commands(version):
        main(["--store", url, "--json", *args])
        out = capsys.readouterr().out
        assert not RAW.findall(out), (args, RAW.findall(out))
        assert any(EVIL in text for text in strings(documents(out))), args  # exact, decoded


def strings(tree: Any) -> Iterator[str]:
    """Every string of a JSON tree, its keys too."""
    if isinstance(tree, str):
        yield tree
    elif isinstance(tree, list):
        for item in tree:
            yield from strings(item)
    elif isinstance(tree, dict):
        for key, value in tree.items():
            yield key
            yield from strings(value)


def test_on_a_real_terminal_only_the_commands_own_colours_reach_it(
    hostile: tuple[str, int], tmp_path: Path
) -> None:
    """Run on a pseudo-terminal (rich then writes colours): the only escape sequences it gets
    are SGR colours; no screen clear, no window title, no C1 or bidi control."""
    url, _ = hostile
    for args in (["log", EVIL], ["history", EVIL], ["runs"], ["show", RUN1], ["blame", EVIL, EVIL]):
        shown = on_a_terminal([*STEPLOG, "--store", url, *args])
        assert "\x1b[" in shown, "not a terminal: rich wrote no colour"
        bare = re.sub(r"\x1b\[[0-9;]*m", "", shown)  # rich's own colours
        assert not RAW.findall(bare.replace("\r\n", "\n")), (args, RAW.findall(bare))
        assert SHOWN.split("\\n")[0] in bare, (args, bare)


def on_a_terminal(argv: list[str]) -> str:
    """What ``argv`` writes on standard output and error when both are a pseudo-terminal."""
    leader, follower = pty.openpty()
    env = {**os.environ, "COLUMNS": "400", "LINES": "50", "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    with subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower, env=env
    ) as child:
        os.close(follower)
        chunks: list[bytes] = []
        while True:
            ready, _, _ = select.select([leader], [], [], 60)
            if not ready:
                child.kill()
                raise AssertionError(f"no output from {argv} in 60 s")
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert child.wait(timeout=60) == 0, b"".join(chunks)
    os.close(leader)
    return b"".join(chunks).decode()
