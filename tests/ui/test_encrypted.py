"""The UI over an encrypted store without its key, or with a wrong one (issue 21): ``steplog ui``
refuses at startup, in one line, when the store is marked encrypted and no key was given; a page
that meets a sealed row it cannot open answers ``UNREADABLE_STATUS`` with the CLI's words (which
key, and how to give it), never a 500 with a traceback, and never a claim that the log was
altered."""

from __future__ import annotations

import contextlib
import html
import io
import re

import pytest
from starlette.testclient import TestClient

from kernel import KEYS_ENV, Keyring, open_store
from projections.cli import EXIT_BAD_INPUT, main
from projections.ui import UNREADABLE_STATUS, create_app
from tests.store.test_encryption import SECRET, fp, ring, run_workflows
from tests.ui.conftest import LOCAL

PAGES = [
    "/",
    "/i/orders-1",
    "/i/orders-1/state",
    "/i/orders-1/state?at=pos:3",
    "/i/orders-1/blame/card",
    "/i/orders-1/graph",
    "/i/orders-1/diff?a=pos:2&b=pos:5",
    "/live",
    "/i/orders-1/live",
]


@pytest.fixture
def encrypted(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """A store written with a key (``url``, ``key``); ``$STEPLOG_KEYS`` unset."""
    monkeypatch.delenv(KEYS_ENV, raising=False)
    key = Keyring.generate()
    with open_store(sqlite_url, keyring=ring(key)) as store:
        run_workflows(store)
    return sqlite_url, key


def _detail(page: str) -> str:
    found = re.search(r'<p class="error-detail">(.*?)</p>', page, flags=re.DOTALL)
    assert found is not None, page
    return html.unescape(found.group(1))


@pytest.mark.parametrize("projected", [False, True], ids=["bare", "projected"])
@pytest.mark.parametrize("case", ["none", "wrong"])
@pytest.mark.parametrize("path", PAGES)
def test_a_page_that_meets_a_sealed_row_it_cannot_open_says_so_in_the_clis_words(
    encrypted, monkeypatch, case, projected, path
):
    """These pages answered 500 with a ``MissingKeyError`` traceback (or, for state, a 404)."""
    url, key = encrypted
    if projected:
        monkeypatch.setenv(KEYS_ENV, key)
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["--store", url, "project"]) == 0  # sealed view documents
    wrong = Keyring.generate()
    keyring = ring(wrong) if case == "wrong" else None
    with (
        open_store(url, keyring=keyring, create=False) as store,
        TestClient(create_app(store), base_url=LOCAL, raise_server_exceptions=False) as client,
    ):
        answer = client.get(path)
    assert answer.status_code == UNREADABLE_STATUS, answer.text
    detail = _detail(answer.text)
    assert "encrypted: its key was not given" in answer.text  # the page's title
    assert f"is encrypted with key {fp(key)}" in detail
    assert f"give its key ({KEYS_ENV}=... or --keys-file FILE)" in detail
    if case == "wrong":
        assert f"not among the keys given ({fp(wrong)}): wrong or missing key" in detail
    else:
        assert "no key was given" in detail
    for word in ("Traceback", "altered", "broken", "removed", SECRET, key, wrong):
        assert word not in answer.text


def test_the_pages_error_is_the_clis_line(encrypted, monkeypatch, capsys):
    url, _ = encrypted
    assert main(["--store", url, "state", "orders-1"]) == EXIT_BAD_INPUT
    line = capsys.readouterr().err.strip().removeprefix("steplog: ")
    with (
        open_store(url, keyring=None, create=False) as store,
        TestClient(create_app(store), base_url=LOCAL, raise_server_exceptions=False) as client,
    ):
        answer = client.get("/i/orders-1/state")
    assert answer.status_code == UNREADABLE_STATUS
    assert _detail(answer.text) == line


def test_steplog_ui_without_keys_refuses_an_encrypted_store_at_startup(
    encrypted, monkeypatch, capsys
):
    """``steplog ui`` used to print its address and serve pages that all failed with a 500."""
    import projections.ui

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("served an encrypted store without its keys")

    monkeypatch.setattr(projections.ui, "serve", never)
    url, _ = encrypted
    assert main(["--store", url, "ui", "--port", "1"]) == EXIT_BAD_INPUT
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert "is encrypted, and no key was given" in lines[0]
    assert f"give its key ({KEYS_ENV}=... or --keys-file FILE)" in lines[0]
