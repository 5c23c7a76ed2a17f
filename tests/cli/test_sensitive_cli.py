"""Sensitive keys through the real entry point: every command that shows state values (``log``,
``state``, ``blame``, ``diff``, ``bisect``), as tables and as JSON, shows them redacted unless
``--reveal`` is given; ``--sensitive PATTERN`` adds patterns; ``bisect --equals`` on a sensitive
key is refused without ``--reveal``. The log is ``tests.projections.test_sensitive``'s."""

from __future__ import annotations

import json

import pytest

from kernel import open_store
from projections import REDACTED
from projections.cli import EXIT_BAD_INPUT, main
from tests.projections.test_sensitive import SECRET, fork_secrets, write_secrets


@pytest.fixture
def vault_url(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("COLUMNS", "400")  # no cell is folded: a secret would show whole
    with open_store(sqlite_url) as store:
        fork_secrets(store, write_secrets(store))
    return sqlite_url


def run(url: str, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["--store", url, *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


READING = [
    ["log", "vault"],
    ["log", "vault", "--json"],
    ["state", "vault"],
    ["state", "vault", "--json"],
    ["state", "vault", "run:r1-1:1"],
    ["state", "vault", "inside:r1-3"],  # what the failed superstep saw: its aborted writes
    ["blame", "vault", "password"],
    ["blame", "vault", "secret_token"],
    ["diff", "vault", "pos:0", "pos:9"],
    ["log", "vault-fork", "--json"],
    ["state", "vault-fork"],
    ["blame", "vault-fork", "password"],
]


@pytest.mark.parametrize("argv", READING, ids=" ".join)
def test_a_reading_command_shows_no_secret_unless_asked_to_reveal(vault_url, capsys, argv):
    code, out, err = run(vault_url, capsys, *argv)
    assert (code, err) == (0, "")
    assert SECRET not in out
    assert "redacted" in out

    code, out, _ = run(vault_url, capsys, *argv, "--reveal")
    assert code == 0
    assert SECRET in out
    assert "redacted" not in out


def test_state_json_marks_each_redacted_value(vault_url, capsys):
    _, out, _ = run(vault_url, capsys, "state", "vault", "--json")
    assert json.loads(out) == {"password": REDACTED, "note": "note-3"}

    _, out, _ = run(vault_url, capsys, "state", "vault", "--json", "--reveal")
    assert json.loads(out) == {"password": f"{SECRET}-3", "note": "note-3"}


def test_log_json_keeps_every_write_and_its_verdict_with_the_value_redacted(vault_url, capsys):
    _, shown, _ = run(vault_url, capsys, "log", "vault", "--json")
    _, real, _ = run(vault_url, capsys, "log", "vault", "--json", "--reveal")
    shown_lines = [json.loads(line) for line in shown.splitlines()]
    real_lines = [json.loads(line) for line in real.splitlines()]

    assert len(shown_lines) == len(real_lines)
    secret_writes = 0
    for mine, truth in zip(shown_lines, real_lines, strict=True):
        if truth["type"] == "state_staged" and truth["key"] != "note" and truth["op"] == "set":
            secret_writes += 1
            assert mine.pop("value") == REDACTED
            assert SECRET in truth.pop("value")
        assert mine == truth  # positions, keys, executors, counts and write_status included
    assert secret_writes == 7
    verdicts = [
        (line["counts"], line["write_status"])
        for line in shown_lines
        if line["type"] == "state_staged" and line["key"] == "password"
    ]
    assert verdicts == [
        (True, "superseded"),
        (False, "aborted"),
        (True, "superseded"),
        (True, "committed"),
    ]


def test_blame_of_a_sensitive_key_lists_each_write_and_its_verdict(vault_url, capsys):
    _, out, _ = run(vault_url, capsys, "blame", "vault", "password")

    assert out.count("redacted") == 4
    for verdict in ("superseded", "aborted (failed)", "committed"):
        assert verdict in out
    assert "vault" in out  # the executor


def test_diff_shows_a_sensitive_key_changed_and_added_without_values(vault_url, capsys):
    with open_store(vault_url) as store:
        last = store.version("vault")
    _, out, _ = run(vault_url, capsys, "diff", "vault", "pos:9", f"pos:{last}")

    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if "│" in line}
    assert "changed" in rows["password"]
    assert rows["password"].count("redacted") == 2
    assert "removed" in rows["secret_token"]
    assert '"note-3"' in rows["note"]


def test_sensitive_adds_patterns_and_an_empty_one_is_bad_input(vault_url, capsys):
    code, out, _ = run(vault_url, capsys, "state", "vault", "--json", "--sensitive", "no*")
    assert code == 0
    assert json.loads(out) == {"password": REDACTED, "note": REDACTED}

    code, out, err = run(vault_url, capsys, "state", "vault", "--sensitive", "")
    assert code == EXIT_BAD_INPUT
    assert "non-empty string" in err
    assert out == ""


def test_bisect_on_a_sensitive_key_finds_when_it_got_a_value_but_equals_needs_reveal(
    vault_url, capsys
):
    code, out, _ = run(vault_url, capsys, "bisect", "vault", "--key", "password")
    assert code == 0
    assert "first true after superstep 1" in out

    argv = ["bisect", "vault", "--key", "password", "--equals", f'"{SECRET}-1"']
    code, out, err = run(vault_url, capsys, *argv)
    assert code == EXIT_BAD_INPUT
    assert out == ""
    assert "'password' of 'vault' is sensitive" in err
    assert "--reveal" in err

    code, out, _ = run(vault_url, capsys, *argv, "--reveal")
    assert code == 0
    assert "first true after superstep 1" in out


def test_history_shows_key_names_and_no_value(vault_url, capsys):
    code, out, _ = run(vault_url, capsys, "history", "vault")

    assert code == 0
    assert "password" in out
    assert SECRET not in out


def test_log_redacts_exactly_what_a_scan_of_every_event_redacts(durable_store_url, capsys):
    """``log`` finds the run starts by looking at rows' bytes (``find_events``); what it shows
    is what the rule read from every event of the instance redacts: run 1's writes of
    ``password`` too, though only run 2 (after them) declared it. On SQLite and PostgreSQL."""
    from projections import SensitiveKeys
    from projections._frontend._render import event_document

    with open_store(durable_store_url) as store:
        events = write_secrets(store)
        rule = SensitiveKeys.from_events(events)
    assert rule.patterns == ("password", "secret_*")
    expected = [event_document(e, None) for e in rule.events(events)]
    code, out, _ = run(durable_store_url, capsys, "log", "vault", "--json")
    assert code == 0
    shown = [json.loads(line) for line in out.splitlines()]
    assert [{k: v for k, v in line.items() if k not in _VERDICT} for line in shown] == [
        {k: v for k, v in doc.items() if k not in _VERDICT} for doc in expected
    ]
    first_run = [
        line for line in shown if line["type"] == "state_staged" and line["run_id"].startswith("r1")
    ]
    assert [line["value"] for line in first_run if line["key"] == "password"] == [REDACTED] * 2
    assert SECRET not in out


_VERDICT = ("write_status", "counts")  # the blame fold's, checked by the test above
