"""End-to-end: a real headless Chromium (Debian's ``chromium``, driven by Playwright; never
``playwright install``) against a uvicorn server over a store written by real runs.

Skipped, with the reason, when /usr/bin/chromium or Playwright is missing outside CI; with
``CI=true`` they fail instead. ``STEPLOG_WRITE_DOCS=1`` also saves the screenshots of
docs/ui.md (``docs/ui-*.png``).
"""

from __future__ import annotations

import asyncio
import os
import re
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import closing
from datetime import UTC, timedelta
from pathlib import Path
from typing import Any

import pytest

from kernel import StepRecorded, fold_committed
from projections import blame_keys, fold_history
from projections._frontend._render import show_value
from tests.projections.stepping import MAIL
from tests.ui.conftest import DEMO, FORK, HOSTILE_MAIL, RECOVERY, SENSITIVE_STEP, Server
from tests.ui.workflows import HOSTILE, HOSTILE_INSTANCE, write_chain

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
DOCS = Path(__file__).resolve().parents[2] / "docs"
WRITE_DOCS = bool(os.environ.get("STEPLOG_WRITE_DOCS"))


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").strip().lower() == "true":
        pytest.fail(f"{reason} (CI=true: the browser tests must run; .ci/run installs chromium)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable(
            "Playwright is not installed: pip install playwright (never playwright install)"
        )
    if not CHROMIUM.exists():
        _unavailable(f"{CHROMIUM} is missing: apt-get install -y chromium")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any, server: Server) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900}, base_url=server.url)
    opened = context.new_page()
    opened.set_default_timeout(15_000)
    blocked: list[str] = []  # what the server's Content-Security-Policy refused to run or load
    opened.on(
        "console",
        lambda message: (
            blocked.append(message.text) if "Content Security Policy" in message.text else None
        ),
    )
    yield opened
    context.close()
    assert blocked == [], blocked


def in_a_thread(work: Any) -> None:
    """Run ``work`` in a thread of its own (Playwright's sync API holds this one's loop)."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as error:  # pragma: no cover - reported below
            failed.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=60)
    assert not failed, failed


def shoot(page: Any, name: str) -> None:
    if WRITE_DOCS:
        page.screenshot(path=str(DOCS / f"ui-{name}.png"), full_page=True)


def shown_state(page: Any) -> dict[str, str]:
    found: dict[str, str] = {}
    for row in page.locator("table#state tbody tr[data-key]").all():
        found[row.get_attribute("data-key")] = row.locator("code.value").inner_text()
    return found


def expected_state(values: dict[str, Any]) -> dict[str, str]:
    return {key: show_value(value, limit=2000) for key, value in values.items()}


def test_open_the_demo_and_see_the_aborted_superstep(page: Any, server: Server) -> None:
    page.goto("/")
    shoot(page, "runs")
    page.get_by_role("link", name=DEMO, exact=True).first.click()
    page.wait_for_url(f"**/i/{DEMO}")
    aborted = page.locator("li.step.aborted")
    assert aborted.count() == 1
    assert aborted.locator(".badge").inner_text() == "aborted: failed"
    assert page.locator("li.step.committed").count() == 1
    page.goto(f"/i/{RECOVERY}")
    assert page.locator("li.step.aborted .badge").inner_text() == "aborted: crashed"
    shoot(page, "timeline")


def test_time_travel_to_each_superstep(page: Any, server: Server) -> None:
    events = server.store.read(RECOVERY)
    steps = fold_history(events).supersteps()
    page.goto(f"/i/{RECOVERY}")
    for step in steps:
        page.goto(f"/i/{RECOVERY}")
        page.locator(f'li[data-superstep="{step.superstep_id}"] a.state-after').click()
        page.wait_for_url(re.compile(r"/state\?at=step"))
        assert step.position is not None
        committed = fold_committed([e for e in events if e.position <= step.position])
        assert shown_state(page) == expected_state(committed.values), step.index
        page.locator("svg.graph").wait_for()  # the page fetches its graph once shown
        active = page.locator("svg.graph g.node.active").all()
        assert {g.get_attribute("data-executor") for g in active} == set(step.executors)
    # the slider: drag to a position, the state there is shown
    middle = events[len(events) // 2].position
    page.locator("#slider").fill(str(middle))
    page.wait_for_url(f"**/state?at=pos:{middle}")
    committed = fold_committed([e for e in events if e.position <= middle])
    assert shown_state(page) == expected_state(committed.values)
    # a wall-clock time: the state after the last event stamped at or before it
    after_last = events[-1].timestamp + timedelta(milliseconds=1)  # the field keeps milliseconds
    page.goto(f"/i/{RECOVERY}/state?at=pos:1")
    page.locator("#when").fill(after_last.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3])
    page.wait_for_url(re.compile(r"at=time"))
    assert shown_state(page) == expected_state(fold_committed(events).values)
    # "inside" the crashed superstep: what its executor saw, labelled as never committed
    crashed = next(s for s in steps if s.status == "aborted")
    page.goto(f"/i/{RECOVERY}/state?at=step:{crashed.superstep_id}")
    page.locator("#toggle-inside").click()
    page.wait_for_url(re.compile(r"at=inside"))
    assert page.locator("#never-committed").is_visible()
    assert "aborted: crashed" in page.locator("#never-committed").inner_text()
    shoot(page, "state-inside")


def test_open_a_diff_and_a_blame(page: Any, server: Server) -> None:
    steps = fold_history(server.store.read(FORK)).supersteps()
    page.goto(f"/i/{FORK}")
    page.locator(f'li[data-superstep="{steps[-1].superstep_id}"] a', has_text="diff").click()
    page.wait_for_url(re.compile(r"/diff\?"))
    assert page.locator("table#diff tbody tr").count() >= 1
    page.goto(f"/i/{RECOVERY}/diff?a=pos:0&b=pos:{server.store.version(RECOVERY)}")
    added = {r.get_attribute("data-key") for r in page.locator("tr.added").all()}
    assert added == {"reserved", "total", "charged", "packed", "shipped"}
    steps = fold_history(server.store.read(RECOVERY)).supersteps()
    page.goto(f"/i/{RECOVERY}/diff?a=step:{steps[0].superstep_id}&b=step:{steps[-1].superstep_id}")
    assert page.locator("tr.changed").get_attribute("data-key") == "total"
    shoot(page, "diff")
    page.locator('tr[data-key="total"] a').click()
    page.wait_for_url("**/blame/total")
    writes = blame_keys(server.store, RECOVERY, ["total"]).writes("total")
    statuses = [r.get_attribute("data-status") for r in page.locator("tr.write").all()]
    assert statuses == [w.status for w in writes]
    assert "aborted (crashed)" in page.locator("table#blame").inner_text()
    shoot(page, "blame")
    page.locator("tr.write.aborted td a").first.click()
    page.wait_for_url(re.compile(r"\?step="))
    assert page.locator("li.step.selected").get_attribute("data-status") == "aborted"


def test_a_live_run_appends_supersteps_in_place(page: Any, server: Server) -> None:
    page.goto(f"/i/{HOSTILE_INSTANCE}")
    before = page.locator("li.step").count()
    page.evaluate("window.__same_page = true")
    # (locators, not wait_for_function: the page's policy forbids the eval it needs)
    page.locator("#live-status").wait_for(state="attached")
    in_a_thread(lambda: asyncio.run(write_chain(server.store, HOSTILE_INSTANCE, stop=4)))
    grown = fold_history(server.store.read(HOSTILE_INSTANCE)).supersteps()
    page.locator("li.step").nth(len(grown) - 1).wait_for(timeout=20_000)
    assert page.locator("li.step").count() == len(grown)
    assert len(grown) > before
    assert page.evaluate("window.__same_page") is True  # updated in place, not reloaded


def test_a_hostile_value_renders_as_text(page: Any, server: Server) -> None:
    for path in [f"/i/{HOSTILE_INSTANCE}/state", f"/i/{HOSTILE_INSTANCE}/blame/{HOSTILE}",
                 f"/i/{HOSTILE_INSTANCE}"]:  # fmt: skip
        page.goto(path)
        assert page.evaluate("window.__pwned") is None
        assert page.locator("img[src=x]").count() == 0
    page.goto(f"/i/{HOSTILE_INSTANCE}/state")
    assert shown_state(page)[HOSTILE] == show_value(HOSTILE)
    assert HOSTILE in page.locator("table#state").inner_text()
    first = fold_history(server.store.read(HOSTILE_INSTANCE)).supersteps()[1]
    page.goto(f"/i/{HOSTILE_INSTANCE}?step={first.superstep_id}")
    page.locator("svg.graph").wait_for()  # the page fetches its graph once shown
    active = page.locator("svg.graph g.node.active").all()
    assert [g.get_attribute("data-executor") for g in active] == list(first.executors)
    nodes = {g.get_attribute("data-executor") for g in page.locator("svg.graph g.node").all()}
    assert nodes == {"writer", "relay"}
    if WRITE_DOCS:
        page.locator(".graph-box").first.screenshot(path=str(DOCS / "ui-graph.png"))
    page.goto("/i/no-such-instance")
    assert page.locator("h1").inner_text() == "not found"


def test_recorded_steps_show_inside_their_superstep_and_a_served_one_names_its_origin(
    page: Any, server: Server
) -> None:
    """The timeline of ``mail``: the aborted superstep lists the model call and the failed spam
    check; the committed one the model call served from the log (marked reused, linking to the
    run that recorded it first, where that record is), the spam check run again and the mail
    sent (its result redacted: its step's name is sensitive). The model's answer reads as
    text, its lines kept."""
    events = server.store.read(MAIL)
    aborted, committed = fold_history(events).supersteps()
    origin = next(e for e in events if isinstance(e, StepRecorded) and e.reused is None)
    page.goto(f"/i/{MAIL}")
    names = page.locator(f'li[data-superstep="{aborted.superstep_id}"] li.recorded-step')
    assert [n.get_attribute("data-name") for n in names.all()] == ["call_model", "check_spam"]
    inside = page.locator(f'li[data-superstep="{committed.superstep_id}"] li.recorded-step')
    assert [n.get_attribute("data-name") for n in inside.all()] == [
        "call_model",
        "check_spam",
        SENSITIVE_STEP,
    ]
    served = page.locator("li.recorded-step.reused")
    assert served.count() == 1
    assert served.locator(".badge.reused").inner_text() == "reused"
    assert served.get_attribute("data-origin-run") == aborted.run_id
    answer = served.locator("pre.step-result").nth(1).inner_text()
    assert answer == "Dear Ann,\nthank you. (write to Ann)"
    assert "redacted" in inside.nth(2).locator("pre.step-result").inner_text()
    assert "failed" in (inside.nth(1).get_attribute("class") or "")
    shoot(page, "steps")
    served.locator(".reused-from a").click()
    page.wait_for_url(re.compile(rf"\?run={aborted.run_id}#p-{origin.position}$"))
    first = page.locator(f"li#p-{origin.position}")
    assert first.get_attribute("data-name") == "call_model"
    assert first.is_visible()
    assert page.locator("li.step").count() == 1  # the run that recorded it, alone


def test_a_hostile_step_renders_as_text(page: Any, server: Server) -> None:
    page.goto(f"/i/{HOSTILE_MAIL}")
    assert page.evaluate("window.__pwned") is None
    assert page.locator("img[src=x]").count() == 0
    hostile = page.locator(f'li.recorded-step[data-name="{HOSTILE}"]')
    assert hostile.count() == 2  # recorded, then served
    for n in range(2):
        assert hostile.nth(n).locator(".step-name").inner_text() == HOSTILE
        assert hostile.nth(n).locator("pre.step-result").inner_text() == HOSTILE
    prompt = page.locator('li.recorded-step[data-name="call_model"] pre.step-result').first
    assert prompt.inner_text() == f"write {HOSTILE}"


def test_docs_name_every_screenshot() -> None:
    text = (DOCS / "ui.md").read_text()
    shots = sorted(p.name for p in DOCS.glob("ui-*.png"))
    assert shots, "no screenshot in docs/: run STEPLOG_WRITE_DOCS=1 pytest tests/ui"
    for name in shots:
        assert f"({name})" in text, f"docs/ui.md does not show {name}"


def test_a_live_page_shows_an_altered_log_in_place(page: Any, server: Server) -> None:
    """The log's tail is cut under an open live page: the stream's ``broken`` event replaces the
    page with the integrity error, in the CLI's words, and the live badge says so."""
    page.goto(f"/i/{HOSTILE_INSTANCE}")
    page.evaluate("window.__same_page = true")
    page.locator("#live-status").wait_for(state="attached")
    with closing(sqlite3.connect(server.store.url.removeprefix("sqlite:///"))) as db, db:
        db.execute(
            "DELETE FROM steplog_events WHERE originator_id = ? AND originator_version = "
            "(SELECT max(originator_version) FROM steplog_events WHERE originator_id = ?)",
            (HOSTILE_INSTANCE, HOSTILE_INSTANCE),
        )
    shown = page.locator("p.error-detail.integrity")
    shown.wait_for(timeout=20_000)
    assert shown.inner_text().startswith(f"the hash chain is broken at '{HOSTILE_INSTANCE}'#")
    assert shown.get_attribute("data-kind") == "truncated"
    assert page.locator("h1").inner_text() == "the log was altered"
    assert page.locator("#live-status").inner_text() == "live · the log was altered"
    assert page.evaluate("window.__same_page") is True
