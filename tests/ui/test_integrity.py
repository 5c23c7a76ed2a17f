"""A tampered log in the UI (issue 21): every page that reads the altered range refuses it as the
CLI does, naming the first bad place, with status 409 and the CLI's words; never a bare 500, a
404 or a page shown as if nothing happened.

The log is the one of ``tests/store/test_tamper.py`` (real runs on a real SQLite file), altered
with sqlite3 directly: an edited event (#11), a deleted row (#8..9: a gap) and a truncated tail
(#16..23 removed: reads alone cannot see it, the recorded chain head can). Each is tried on the
bare log, and with the views ``steplog project`` built before the alteration (the pages then read
the history, the snapshots and the key index from them, and only part of the log).
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import io
import re
import shutil
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient

from kernel import LogIntegrityError, WorkflowBuilder, open_store
from projections import fold_history
from projections.cli import EXIT_BROKEN_CHAIN, main
from projections.ui import create_app
from projections.ui._data import Reader
from tests.store.test_tamper import (
    CLEAN,
    INSTANCE,
    Checkout,
    Log,
    SQLiteRows,
    sqlite_template,
    written_log,
)
from tests.ui.conftest import LOCAL, serving

PLACE = {"edited": (11, "edited"), "gap": (8, "gap"), "truncated": (16, "truncated")}
"""Where each alteration is named: the first bad position of ``orders``, and its kind."""
CLI_ONLY = ", --allow-broken-chain reads the log anyway"
"""The end of the CLI's line that only the CLI has (its option)."""


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sqlite_template(tmp_path_factory.mktemp("ui-tamper"))


@pytest.fixture(scope="module")
def projected(template: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The template with every view built (``steplog project``), before any alteration."""
    path = tmp_path_factory.mktemp("ui-tamper-projected") / "projected.db"
    shutil.copyfile(template, path)
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["--store", f"sqlite:///{path}", "project"]) == 0
    return path


def tamper(url: str, how: str) -> None:
    """Alter the log of ``orders`` at ``url`` as someone with write access to the file would."""
    rows = SQLiteRows(url)
    if how == "edited":  # run 2's write of token (#11) given another value
        log = Log(url, rows)
        row, index = log.row_of("state_staged", nth=1)
        row.body[index][-1] = "tok-EVIL"
        log.rewrite(row)
    elif how == "gap":
        rows.delete(9)  # run 2's start, #8..9
    else:
        rows.delete(23)  # run 3 (#16..23): the recorded head stays at 23
        rows.delete(17)


def altered(source: Path, directory: Path, how: str) -> str:
    """A copy of ``source`` (checked to hold the layout the positions above name), altered."""
    url = written_log(f"sqlite:///{directory / f'{how}.db'}", source).url
    tamper(url, how)
    return url


def inside_of_run_2(source: Path) -> str:
    """The id of run 2's superstep (#9..14), the one whose write of token is edited."""
    with open_store(f"sqlite:///{source}", create=False) as store:
        steps = fold_history(store.read(INSTANCE)).supersteps()
    return next(s.superstep_id for s in steps if s.start_position <= 11 <= (s.position or 0))


def pages(inside: str) -> list[str]:
    """Every page that reads the altered range of ``orders`` (the live streams apart)."""
    return [
        "/",
        f"/i/{INSTANCE}",
        f"/i/{INSTANCE}?page=1&step={inside}",
        f"/i/{INSTANCE}/state",
        f"/i/{INSTANCE}/state?at=pos:20",
        f"/i/{INSTANCE}/state?at=inside:{inside}",
        f"/i/{INSTANCE}/diff",
        f"/i/{INSTANCE}/blame/token",
        f"/i/{INSTANCE}/graph",
    ]


def the_cli_says(url: str, how: str, capsys: pytest.CaptureFixture[str]) -> str:
    """The CLI's line for the altered log (``steplog history``; for a truncated tail, which a
    read cannot see, the words ``verify`` names it with), without what only the CLI offers."""
    capsys.readouterr()
    if how == "truncated":
        with open_store(url, create=False) as store:
            problem = store.verify_chain(INSTANCE).first_problem(INSTANCE)
        assert problem is not None
        return f"the hash chain is broken at 'orders'#16 (truncated): {problem.detail}; " + (
            "'steplog verify' lists every problem"
        )
    assert main(["--store", url, "history", INSTANCE]) == EXIT_BROKEN_CHAIN
    line = capsys.readouterr().err.strip()
    assert line.startswith("steplog: the hash chain is broken at "), line
    assert line.endswith(CLI_ONLY), line
    return line.removeprefix("steplog: ").removesuffix(CLI_ONLY)


def refused(response: httpx.Response, says: str, how: str, page: str) -> None:
    """``response`` is the integrity error page: 409, the CLI's words, the place named."""
    assert response.status_code == 409, (page, response.status_code, response.text[:300])
    assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
    found = re.search(
        r'<p class="error-detail integrity" data-instance="([^"]*)" data-position="(\d+)" '
        r'data-kind="([^"]*)">(.*?)</p>',
        response.text,
        re.S,
    )
    assert found is not None, (page, response.text[:600])
    position, kind = PLACE[how]
    assert (html.unescape(found.group(1)), int(found.group(2)), found.group(3)) == (
        INSTANCE,
        position,
        kind,
    ), page
    assert html.unescape(found.group(4)) == says, page
    assert f"'{INSTANCE}'#{position} ({kind})" in html.unescape(found.group(4))
    assert '<h1 class="error-title">the log was altered</h1>' in response.text


@pytest.mark.parametrize("how", list(PLACE))
def test_every_page_refuses_an_altered_log_as_the_cli_does(
    how: str, template: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = altered(template, tmp_path, how)
    says = the_cli_says(url, how, capsys)
    with (
        open_store(url, create=False) as store,
        TestClient(create_app(store), base_url=LOCAL) as client,
    ):
        for page in pages(inside_of_run_2(template)):
            refused(client.get(page), says, how, page)
        assert client.get("/i/clean").status_code == 200  # the other instance reads on
        assert client.get("/i/clean/state").status_code == 200


@pytest.mark.parametrize("how", list(PLACE))
def test_with_views_the_pages_that_read_the_altered_range_refuse_it(
    how: str, projected: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Built before the alteration, the views answer the run list and the timeline's records
    without reading the log; state, diff, the timeline's events and the inside view still read
    the altered range, and must say so (the issue saw a 404 "no such point" and a plain 200)."""
    url = altered(projected, tmp_path, how)
    says = the_cli_says(url, how, capsys)
    inside = inside_of_run_2(projected)
    read_it = [
        f"/i/{INSTANCE}",
        f"/i/{INSTANCE}/state",
        f"/i/{INSTANCE}/state?at=pos:20",
        f"/i/{INSTANCE}/state?at=inside:{inside}",
        f"/i/{INSTANCE}/diff",
    ]
    if how == "truncated":  # every page of the instance: its log falls short of its head
        read_it = pages(inside)
    with (
        open_store(url, create=False) as store,
        TestClient(create_app(store), base_url=LOCAL) as client,
    ):
        for page in read_it:
            refused(client.get(page), says, how, page)
        if how != "truncated":  # the state before the altered range reads only what is intact
            assert client.get(f"/i/{INSTANCE}/state?at=pos:5").status_code == 200


@pytest.mark.parametrize("how", list(PLACE))
def test_the_live_streams_refuse_an_altered_log(
    how: str, template: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = altered(template, tmp_path, how)
    says = the_cli_says(url, how, capsys)
    with (
        open_store(url, create=False) as store,
        serving(store) as server,
        httpx.Client(timeout=30) as http,
    ):
        for page in (f"/i/{INSTANCE}/live", "/live"):
            with http.stream("GET", server.url + page) as stream:
                stream.read()
                refused(stream, says, how, page)


@pytest.mark.parametrize("page", [f"/i/{INSTANCE}/live", "/live"])
def test_a_live_stream_says_when_the_log_it_follows_is_altered(
    page: str, template: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Connected to an intact log, the stream sends a ``broken`` event with the error's words
    (and ends) rather than the new version, when the log has changed and what the page reads is
    then found altered: here the tail of ``orders`` is cut, and a run of ``clean`` is written
    (the run list follows the whole store)."""
    url = written_log(f"sqlite:///{tmp_path / 'live.db'}", template).url
    with (
        open_store(url, create=False) as store,
        serving(store) as server,
        httpx.Client(timeout=30) as http,
        http.stream("GET", server.url + page) as stream,
    ):
        assert stream.status_code == 200
        lines = stream.iter_lines()
        assert next(line for line in lines if line.startswith("data:")).startswith("data: ")
        tamper(url, "truncated")
        with open_store(url) as writer:
            workflow = WorkflowBuilder(
                start_executor=Checkout(id="checkout"), store=writer, instance_id=CLEAN
            ).build()
            asyncio.run(workflow.run("A-3"))
        event = next(line for line in lines if line.startswith("event:"))
        assert event == "event: broken"
        data = next(lines)
    assert data == "data: " + the_cli_says(url, "truncated", capsys)


def test_every_integrity_error_is_shown_so_views_errors_too(
    template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any ``LogIntegrityError`` a page meets (a subclass too: say, a view found stale) is the
    same error page, whatever raised it."""

    class ViewRefused(LogIntegrityError):
        pass

    def refuse(self: Reader, instance_id: str, key: str) -> None:
        raise ViewRefused(
            "the key index does not match the log", instance_id=instance_id, position=11,
            kind="view altered",
        )  # fmt: skip

    monkeypatch.setattr(Reader, "blame", refuse)
    url = written_log(f"sqlite:///{tmp_path / 'view.db'}", template).url
    with (
        open_store(url, create=False) as store,
        TestClient(create_app(store), base_url=LOCAL) as client,
    ):
        response = client.get(f"/i/{INSTANCE}/blame/token")
    assert response.status_code == 409
    assert (
        "the hash chain is broken at &#39;orders&#39;#11 (view altered): the key index does not "
        "match the log" in response.text
    )


def test_a_view_that_lost_a_row_is_its_own_error_not_an_altered_log(
    template: Path, tmp_path: Path
) -> None:
    """A key index row deleted around the projector: the blame page refuses (409), says the view
    does not match the log and how to rebuild it, and does not call the log altered."""
    import sqlite3
    from contextlib import closing

    path = tmp_path / "view.db"
    url = written_log(f"sqlite:///{path}", template).url
    assert main(["--store", url, "project", "--views", "keyindex"]) == 0
    with closing(sqlite3.connect(path)) as db, db:
        deleted = db.execute(
            "DELETE FROM steplog_view_keyindex_v2 WHERE instance_id = ? AND key = 'k:token'",
            (INSTANCE,),
        ).rowcount
    assert deleted == 1
    with (
        open_store(url, create=False) as store,
        TestClient(create_app(store), base_url=LOCAL) as client,
    ):
        response = client.get(f"/i/{INSTANCE}/blame/token")
    text = html.unescape(response.text)
    assert response.status_code == 409
    assert "a view does not match the log" in text
    assert "steplog rebuild keyindex" in text
    assert "the log was altered" not in text
    assert "hash chain is broken" not in text


def test_allow_broken_chain_reads_a_cut_log_anyway(template: Path, tmp_path: Path) -> None:
    url = altered(template, tmp_path, "truncated")
    with (
        open_store(url, create=False, allow_broken_chain=True) as store,
        TestClient(create_app(store, allow_broken_chain=True), base_url=LOCAL) as client,
    ):
        assert client.get(f"/i/{INSTANCE}").status_code == 200
