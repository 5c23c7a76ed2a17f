"""Recorded steps on the UI's timeline (issue 23), over HTTP (Starlette's TestClient) on the
prepared store: each step inside its superstep, a served one marked reused with the run that
first recorded it, a model call's prompt and response and a tool's result shown as text (its
arguments as what the log has: their digest), escaped, redacted by step name, and a tampered
step record refused (409)."""

from __future__ import annotations

import html
import re
from pathlib import Path

from starlette.testclient import TestClient

from kernel import EventStore, StepRecorded, open_store
from projections import fold_history, recorded_steps
from projections.ui import BROKEN_STATUS, create_app
from tests.cli.test_steps_cli import _edit_step_result
from tests.projections.stepping import HOSTILE, MAIL
from tests.ui.conftest import HOSTILE_MAIL, LOCAL, SENSITIVE_STEP


def recorded_on(page: str) -> dict[str, list[dict[str, str]]]:
    """Superstep id -> its recorded steps as the timeline shows them: each ``<li>``'s data
    attributes and its text blocks (``io``: label -> text, unescaped)."""
    found: dict[str, list[dict[str, str]]] = {}
    for block in re.split(r'(?=<li class="step )', page)[1:]:
        superstep = re.search(r'data-superstep="([^"]*)"', block)
        assert superstep is not None
        steps = found.setdefault(html.unescape(superstep[1]), [])
        for item in re.split(r'(?=<li class="recorded-step)', block)[1:]:
            attributes = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', item.split(">", 1)[0]))
            shown = {k: html.unescape(v) for k, v in attributes.items()}
            texts = re.findall(
                r'<div class="io-label">(.*?)</div><pre class="step-text[^"]*">(.*?)</pre>',
                item,
                re.S,
            )
            shown.update({f"io:{html.unescape(k)}": html.unescape(v) for k, v in texts})
            shown["html"] = item
            steps.append(shown)
    return found


def test_the_timeline_shows_each_step_inside_its_superstep(
    client: TestClient, demo_store: EventStore
) -> None:
    events = demo_store.read(MAIL)
    history = fold_history(events)
    expected = recorded_steps(
        [e for e in events if isinstance(e, StepRecorded)],
        {s.superstep_id: s for s in history.supersteps()},
    )
    page = client.get(f"/i/{MAIL}").text
    shown = recorded_on(page)
    assert page.count("none of them is state") == 1  # said of the aborted superstep's only
    assert {superstep: [s["name"] for s in steps] for superstep, steps in shown.items()} == {
        s.superstep_id: [r.record.name for r in expected if r.record.superstep_id == s.superstep_id]
        for s in history.supersteps()
    }
    (aborted, committed) = history.supersteps()
    assert aborted.status == "aborted"  # what was recorded there is listed all the same
    model, spam = shown[aborted.superstep_id]
    assert model["io:prompt"] == "write to Ann"
    assert model["io:response"] == "Dear Ann,\nthank you. (write to Ann)"  # as text, its lines
    assert "input_tokens=3 · output_tokens=6" in model["html"]
    assert "error" in spam["html"]
    assert spam["io:error"] == (
        "tests.projections.stepping.SpamCheckDown: the spam checker is down"
    )
    served, _, sent = shown[committed.superstep_id]
    first_run = aborted.run_id
    assert (served["name"], served["reused"], served["origin-run"]) == (
        "call_model",
        model["position"],
        first_run,
    )
    assert '<span class="badge reused">reused</span>' in served["html"]
    assert f'href="/i/{MAIL}?run={first_run}#p-{model["position"]}"' in served["html"]
    assert served["io:response (served)"] == model["io:response"]
    digest = next(e.digest for e in events if isinstance(e, StepRecorded))
    assert f"only their digest: sha256 {digest}" in model["html"]
    assert sent["name"] == SENSITIVE_STEP
    assert sent["io:result"] == '{"$t":"redacted"}'  # its name is declared sensitive


def test_a_served_steps_origin_is_named_from_another_runs_page(client: TestClient) -> None:
    history_page = client.get(f"/i/{MAIL}").text
    runs = re.findall(r'<tr class="run[^"]*">\s*<td><a href="[^"]*" title="([^"]*)"', history_page)
    first, second = runs
    shown = recorded_on(client.get(f"/i/{MAIL}", params={"run": second}).text)
    ((served, _, _),) = shown.values()  # only run 2's superstep is on this page
    assert served["origin-run"] == first


def test_a_sensitive_steps_result_is_shown_only_when_revealed(demo_store: EventStore) -> None:
    with TestClient(create_app(demo_store), base_url=LOCAL) as client:
        hidden = recorded_on(client.get(f"/i/{MAIL}").text)
    with TestClient(create_app(demo_store, reveal=True), base_url=LOCAL) as client:
        shown = recorded_on(client.get(f"/i/{MAIL}").text)
    with TestClient(create_app(demo_store, sensitive=("call_*",)), base_url=LOCAL) as client:
        more = recorded_on(client.get(f"/i/{MAIL}").text)
    (_, committed) = list(hidden)
    assert "sent to" not in hidden[committed][2]["html"]
    assert shown[committed][2]["io:result"] == "sent to ann@example.com"
    assert more[committed][0]["io:result (served)"] == '{"$t":"redacted"}'
    assert "Dear Ann" not in "".join(s["html"] for steps in more.values() for s in steps)


def test_a_hostile_step_name_and_result_are_escaped(client: TestClient) -> None:
    page = client.get(f"/i/{HOSTILE_MAIL}")
    assert page.status_code == 200
    assert "<script>window" not in page.text
    assert "<img src=x" not in page.text
    names = [s["name"] for steps in recorded_on(page.text).values() for s in steps]
    assert names.count(HOSTILE) == 2  # recorded, then served
    results = [
        s.get("io:result", s.get("io:result (served)"))
        for steps in recorded_on(page.text).values()
        for s in steps
        if s["name"] == HOSTILE
    ]
    assert results == [HOSTILE, HOSTILE]  # shown as the text it is


def test_a_tampered_step_record_is_refused(store_path: Path) -> None:
    url = f"sqlite:///{store_path}"
    with open_store(url, create=False) as store:
        runs = [e.run_id for e in store.read(MAIL, types=("run_started",))]
    position = _edit_step_result(url, "call_model")
    with (
        open_store(url, create=False) as store,
        TestClient(create_app(store), base_url=LOCAL) as client,
    ):
        for params in ({}, {"run": runs[1]}):  # run 2's page reads it as its served call's origin
            page = client.get(f"/i/{MAIL}", params=params)
            assert page.status_code == BROKEN_STATUS, params
            assert f"the hash chain is broken at &#39;{MAIL}&#39;#{position} (edited)" in page.text
            assert "tampered" not in page.text
