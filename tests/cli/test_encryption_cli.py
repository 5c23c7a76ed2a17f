"""The CLI on an encrypted store: keys from ``$STEPLOG_KEYS`` or ``--keys-file``, never from the
command line; ``steplog keygen``; ``steplog project`` seals view documents; ``steplog rekey``
rotates keys; a missing or wrong key is a clear error on one line (exit 2), never garbage."""

from __future__ import annotations

import json

import pytest

from kernel import KEYS_ENV, Keyring, MissingKeyError, open_store
from projections.cli import EXIT_BAD_INPUT, main
from tests.store.test_encryption import SECRET, fp, leaks, ring, run_workflows


@pytest.fixture
def no_keys(monkeypatch):
    monkeypatch.delenv(KEYS_ENV, raising=False)
    monkeypatch.setenv("COLUMNS", "200")


def test_keygen_prints_a_new_key_each_time(no_keys, capsys):
    assert main(["keygen"]) == 0
    assert main(["keygen"]) == 0
    first, second = capsys.readouterr().out.split()
    assert first != second
    assert Keyring.from_text(f"{first},{second}").fingerprints == [fp(first), fp(second)]


def test_commands_read_the_keys_from_the_environment(
    durable_store_url, no_keys, monkeypatch, capsys
):
    key = Keyring.generate()
    with open_store(durable_store_url, keyring=ring(key)) as store:
        run_workflows(store)
    monkeypatch.setenv(KEYS_ENV, key)
    assert main(["--store", durable_store_url, "project"]) == 0
    assert main(["--store", durable_store_url, "state", "orders-1", "--json", "--reveal"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out.splitlines()[-1])["card"] == SECRET
    assert main(["--store", durable_store_url, "history", "orders-1"]) == 0
    assert SECRET in capsys.readouterr().out  # the run's error, from the sealed history view
    assert leaks(durable_store_url) == []


def test_a_keys_file_gives_the_keys(sqlite_url, tmp_path, no_keys, capsys):
    old, new = Keyring.generate(), Keyring.generate()
    with open_store(sqlite_url, keyring=ring(old)) as store:
        run_workflows(store)
    keys = tmp_path / "keys"
    keys.write_text(f"{new}\n{old}\n")
    keys.chmod(0o600)
    args = ["--store", sqlite_url, "--keys-file", str(keys)]
    assert main([*args, "state", "orders-1", "--json", "--reveal"]) == 0
    assert json.loads(capsys.readouterr().out)["card"] == SECRET


def test_without_the_key_a_command_fails_on_one_line_naming_the_position(
    sqlite_url, no_keys, capsys
):
    key = Keyring.generate()
    with open_store(sqlite_url, keyring=ring(key)) as store:
        run_workflows(store)
    assert (
        main(["--store", sqlite_url, "state", "orders-1", "--json", "--reveal"]) == EXIT_BAD_INPUT
    )
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "'orders-1'#1.." in captured.err
    assert "is encrypted" in captured.err
    assert KEYS_ENV in captured.err
    assert SECRET not in captured.err


def test_with_a_wrong_key_a_command_fails_naming_both_keys(
    sqlite_url, no_keys, monkeypatch, capsys
):
    key, wrong = Keyring.generate(), Keyring.generate()
    with open_store(sqlite_url, keyring=ring(key)) as store:
        run_workflows(store)
    monkeypatch.setenv(KEYS_ENV, wrong)
    assert main(["--store", sqlite_url, "log", "orders-1", "--json"]) == EXIT_BAD_INPUT
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"encrypted with key {fp(key)}" in captured.err
    assert fp(wrong) in captured.err
    assert key not in captured.err
    assert wrong not in captured.err


def test_a_writing_command_without_keys_is_refused(sqlite_url, no_keys, capsys):
    with open_store(sqlite_url, keyring=ring(Keyring.generate())) as store:
        run_workflows(store)
    assert main(["--store", sqlite_url, "project"]) == EXIT_BAD_INPUT
    assert "is encrypted: open it with its keys" in capsys.readouterr().err


def test_a_key_is_never_taken_from_the_command_line_nor_echoed(sqlite_url, no_keys, capsys):
    key = Keyring.generate()
    with open_store(sqlite_url, keyring=ring(key)) as store:
        run_workflows(store)
    # argparse would take --key as short for --keys-file: a file that is not there
    assert main(["--store", sqlite_url, "--key", key, "instances"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "cannot read the keys file given with --keys-file" in err
    assert key not in err


def test_a_malformed_keys_file_is_refused_without_showing_it(sqlite_url, tmp_path, no_keys, capsys):
    keys = tmp_path / "keys"
    keys.write_text("not-a-key-at-all\n")
    assert main(["--store", sqlite_url, "--keys-file", str(keys), "instances"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "key 1 of the keys file given with --keys-file is not 32 bytes" in err
    assert "'steplog keygen'" in err
    assert "not-a-key-at-all" not in err


def test_rekey_rotates_the_keys_of_rows_and_views(durable_store_url, tmp_path, no_keys, capsys):
    old, new = Keyring.generate(), Keyring.generate()
    with open_store(durable_store_url, keyring=ring(old)) as store:
        run_workflows(store)
    only_old, both, only_new = (tmp_path / n for n in ("old", "both", "new"))
    only_old.write_text(old)
    both.write_text(f"{new},{old}")
    only_new.write_text(new)
    store = ["--store", durable_store_url]
    assert main([*store, "--keys-file", str(only_old), "project"]) == 0
    capsys.readouterr()

    assert main([*store, "--keys-file", str(both), "rekey", "--rows-per-transaction", "3"]) == 0
    out = capsys.readouterr().out
    assert "re-sealed from an older key, 0 plain rows sealed" in out
    assert "0 already sealed" in out
    assert f"key {fp(new)}" in out
    assert "compacted" in out

    assert main([*store, "--keys-file", str(only_old), "state", "orders-1"]) == EXIT_BAD_INPUT
    assert f"encrypted with key {fp(new)}" in capsys.readouterr().err
    assert (
        main([*store, "--keys-file", str(only_new), "state", "orders-1", "--json", "--reveal"]) == 0
    )
    assert json.loads(capsys.readouterr().out)["card"] == SECRET
    assert main([*store, "--keys-file", str(only_new), "verify"]) == 0
    assert main([*store, "--keys-file", str(only_new), "rekey"]) == 0
    assert "0 re-sealed from an older key, 0 plain rows sealed" in capsys.readouterr().out
    assert leaks(durable_store_url) == []


def test_rekey_without_keys_is_refused(sqlite_url, no_keys, capsys):
    with open_store(sqlite_url) as store:
        run_workflows(store)
    assert main(["--store", sqlite_url, "rekey"]) == EXIT_BAD_INPUT
    assert "rekey needs the keys" in capsys.readouterr().err


# -- STEPLOG_KEYS is parsed whole (issue 21) -----------------------------------------------------


@pytest.mark.parametrize("separator", ["\n", " ", ", ", "\t", "\r\n"])
def test_every_key_of_steplog_keys_is_kept_whatever_separates_them(
    sqlite_url, no_keys, monkeypatch, capsys, separator
):
    """Keys separated by a line break or a space were read as the first key alone (base64
    decoding stopped at its padding), so rows sealed with the second one did not open."""
    new, old = Keyring.generate(), Keyring.generate()
    with open_store(sqlite_url, keyring=ring(old)) as store:
        run_workflows(store)
    monkeypatch.setenv(KEYS_ENV, f"{new}{separator}{old}\n")
    assert main(["--store", sqlite_url, "state", "orders-1", "--json", "--reveal"]) == 0
    assert json.loads(capsys.readouterr().out)["card"] == SECRET
    assert Keyring.from_text(f"{new}{separator}{old}").fingerprints == [fp(new), fp(old)]


@pytest.mark.parametrize(
    ("text", "place"),
    [
        ("{key}garbage", "key 1 of $STEPLOG_KEYS is not base64"),
        ("{key}=", "key 1 of $STEPLOG_KEYS is not base64"),
        ("{key},{key}xyz", "key 2 of $STEPLOG_KEYS is not base64"),
        ("{key},,{key}", "key 2 of $STEPLOG_KEYS is empty"),
        ("{key},", "key 2 of $STEPLOG_KEYS is empty"),
        ("{key}\n{key}#comment", "key 2 of $STEPLOG_KEYS is not base64"),
    ],
)
def test_steplog_keys_with_anything_unparseable_is_refused_naming_its_place(
    sqlite_url, no_keys, monkeypatch, capsys, text, place
):
    key = Keyring.generate()
    with open_store(sqlite_url, keyring=ring(key)) as store:
        run_workflows(store)
    monkeypatch.setenv(KEYS_ENV, text.format(key=key))
    assert main(["--store", sqlite_url, "instances"]) == EXIT_BAD_INPUT
    captured = capsys.readouterr()
    assert place in captured.err
    assert key not in captured.err
    assert "garbage" not in captured.err
    assert "xyz" not in captured.err


# -- keys given for a store in plain text are warned about (issue 21) ---------------------------

PLAIN_WARNING = "WARNING: keys were given, but"


@pytest.mark.parametrize("command", [["instances"], ["log", "orders-1", "--json"], ["project"]])
def test_keys_given_for_a_plain_store_are_warned_about_on_one_line(
    durable_store_url, no_keys, monkeypatch, capsys, command
):
    """A wrong key on a store that was never encrypted used to pass without a word: the reader
    believed the store sealed."""
    with open_store(durable_store_url, keyring=None) as store:
        run_workflows(store)
    monkeypatch.setenv(KEYS_ENV, Keyring.generate())
    assert main(["--store", durable_store_url, *command]) == 0
    captured = capsys.readouterr()
    warnings = [line for line in captured.err.splitlines() if PLAIN_WARNING in line]
    assert len(warnings) == 1, captured.err
    assert "holds rows in plain text" in warnings[0]
    assert "'steplog rekey' seals them" in warnings[0]
    assert PLAIN_WARNING not in captured.out  # stdout stays the command's (one JSON document)


def test_keys_given_for_an_encrypted_or_empty_store_give_no_warning(
    sqlite_url, tmp_path, no_keys, monkeypatch, capsys
):
    key = Keyring.generate()
    with open_store(sqlite_url, keyring=ring(key)) as store:
        run_workflows(store)
    monkeypatch.setenv(KEYS_ENV, key)
    assert main(["--store", sqlite_url, "instances"]) == 0
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    assert main(["--store", empty, "project"]) == 0
    assert PLAIN_WARNING not in capsys.readouterr().err


def test_a_store_that_got_its_key_late_is_warned_about_until_rekeyed(
    sqlite_url, no_keys, monkeypatch, capsys
):
    key = Keyring.generate()
    with open_store(sqlite_url, keyring=None) as store:
        run_workflows(store, "early")
    with open_store(sqlite_url, keyring=ring(key)) as store:  # marks the store encrypted
        run_workflows(store, "late")
    monkeypatch.setenv(KEYS_ENV, key)
    assert main(["--store", sqlite_url, "instances"]) == 0
    assert PLAIN_WARNING in capsys.readouterr().err
    assert main(["--store", sqlite_url, "rekey"]) == 0
    capsys.readouterr()
    assert main(["--store", sqlite_url, "instances"]) == 0
    assert PLAIN_WARNING not in capsys.readouterr().err


# -- a missing or wrong key is not tampering, and is said in the CLI's words (issue 21) ---------

TAMPER_WORDS = ("removed", "truncated", "broken", "altered", "edited", "--allow-broken-chain")


def _keys_case(sqlite_url: str, monkeypatch: pytest.MonkeyPatch, case: str) -> tuple[str, str]:
    """An encrypted store; ``$STEPLOG_KEYS`` unset (``"none"``) or holding another key."""
    key = Keyring.generate()
    with open_store(sqlite_url, keyring=ring(key)) as store:
        run_workflows(store)
    wrong = Keyring.generate()
    if case == "wrong":
        monkeypatch.setenv(KEYS_ENV, wrong)
    return key, wrong


@pytest.mark.parametrize("case", ["none", "wrong"])
@pytest.mark.parametrize(
    "command",
    [
        ["verify"],
        ["verify", "--json"],
        ["verify", "--instance", "orders-1"],
        ["--allow-broken-chain", "verify"],
        ["head", "orders-1"],
        ["--allow-broken-chain", "runs"],
        ["state", "orders-1"],
    ],
    ids=" ".join,
)
def test_verify_and_head_without_the_right_key_say_encrypted_never_tampered(
    sqlite_url, no_keys, monkeypatch, capsys, case, command
):
    """``verify`` used to list every row as malformed at position 1 and claim that events 1..N
    were removed (exit 4), and ``head`` to call the chain broken and suggest
    --allow-broken-chain: a missing key is not evidence of tampering."""
    key, wrong = _keys_case(sqlite_url, monkeypatch, case)
    assert main(["--store", sqlite_url, *command]) == EXIT_BAD_INPUT
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    line = lines[0]
    assert line.startswith("steplog: row 'orders-1'#1..")
    assert f"is encrypted with key {fp(key)}" in line
    assert f"give its key ({KEYS_ENV}=... or --keys-file FILE)" in line
    if case == "wrong":
        assert f"not among the keys given ({fp(wrong)}): wrong or missing key" in line
    else:
        assert "no key was given" in line
    assert not [word for word in TAMPER_WORDS if word in line]
    assert key not in line
    assert wrong not in line


@pytest.mark.parametrize("case", ["none", "wrong"])
def test_verify_chain_raises_missing_key_instead_of_reporting_problems(
    sqlite_url, no_keys, monkeypatch, case
):
    key, wrong = _keys_case(sqlite_url, monkeypatch, case)
    keyring = ring(wrong) if case == "wrong" else None
    with open_store(sqlite_url, keyring=keyring, create=False) as store:
        with pytest.raises(MissingKeyError) as raised:
            store.verify_chain()
        assert raised.value.key == fp(key)
        assert raised.value.given == ((fp(wrong),) if case == "wrong" else ())
        assert raised.value.where is not None
        assert raised.value.where.startswith("row 'orders-1'#1..")


API_WORDS = ("Keyring.from_text", "open_store", "create=False", "keyring=")


@pytest.mark.parametrize(
    ("case", "command", "says"),
    [
        ("none", ["log", "orders-1"], "--keys-file FILE"),
        ("wrong", ["history", "orders-1"], "--keys-file FILE"),
        ("none", ["blame", "orders-1", "card"], "--keys-file FILE"),
        ("malformed", ["instances"], "'steplog keygen'"),
        ("short", ["instances"], "'steplog keygen'"),
        ("none", ["project"], "--keys-file FILE"),
    ],
)
def test_key_errors_tell_a_cli_user_what_to_do_in_the_cli(
    sqlite_url, tmp_path, no_keys, monkeypatch, capsys, case, command, says
):
    """The CLI's key errors pointed to the Python API only ("make one with Keyring.generate()",
    "open_store(url, keyring=...)", "or with create=False")."""
    key, _ = _keys_case(sqlite_url, monkeypatch, "wrong" if case == "wrong" else "none")
    if case == "malformed":
        monkeypatch.setenv(KEYS_ENV, f"{key} not-a-key")
    if case == "short":
        monkeypatch.setenv(KEYS_ENV, "c2hvcnQ=")
    assert main(["--store", sqlite_url, *command]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert says in err
    assert KEYS_ENV in err
    if command != ["project"] and case not in ("malformed", "short"):
        assert not [word for word in API_WORDS if word in err], err
    assert key not in err
    assert "not-a-key" not in err
