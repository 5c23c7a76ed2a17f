"""The UI's pages over HTTP (Starlette's TestClient) on a store written by real runs: every
page, what each shows against the projections, 404s, escaping, redaction, the token, and that
reading never writes."""

from __future__ import annotations

import html
import re
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from kernel import EventStore, ExecutorInvoked, MessageStaged, fold_committed, open_store
from kernel.testing import LogBuilder, ticking_clock
from projections import (
    HistoryView,
    KeyIndexView,
    Projector,
    SnapshotView,
    blame_keys,
    fold_history,
)
from projections._folds._runrecords import status_text
from projections._frontend._render import show_value
from projections.cli import EXIT_BAD_INPUT, EXIT_STORE, main
from projections.ui import create_app, needs_token
from tests.store.test_hostile_store import in_a_child_without_write_permission
from tests.ui.conftest import DEMO, FORK, LOCAL, RECOVERY, Server
from tests.ui.workflows import HOSTILE, HOSTILE_INSTANCE, write_chain


def rows(page: str, marker: str) -> list[str]:
    return re.findall(rf'{marker}="([^"]*)"', page)


def state_rows(page: str) -> dict[str, str]:
    """key -> the JSON text shown, from the state table."""
    found = re.findall(
        r'<tr data-key="([^"]*)"><td class="key">.*?</td><td><code class="value">(.*?)</code>',
        page,
        re.S,
    )
    return {html.unescape(k): html.unescape(v) for k, v in found}


def test_the_run_list_shows_every_run_with_its_status_and_counts(
    client: TestClient, demo_store: EventStore
) -> None:
    page = client.get("/").text
    for instance in demo_store.instances():
        for run in fold_history(demo_store.read(instance)).runs():
            row = re.search(
                rf'<tr class="run" data-instance="{re.escape(instance)}" '
                rf'data-run="{re.escape(run.run_id)}">(.*?)</tr>',
                page,
                re.S,
            )
            assert row is not None, (instance, run.run_id)
            cells = re.findall(r'<td class="num[^"]*">(\d+)</td>', row.group(1))
            assert cells == [str(run.supersteps), str(run.committed), str(run.aborted)]
            shown = status_text(run.status)
            assert f">{shown}</span>" in row.group(1)
    assert "payment provider timed out" in page  # the failed run's error
    assert ">crashed</span>" in page


def test_a_run_that_recorded_a_response_is_answered_not_waiting(tmp_path: Path) -> None:
    """Issue 21: the run ``steplog respond`` writes waits for nothing: the run list shows it
    ``answered: resume() continues``, and a search for waiting runs does not find it."""
    import asyncio

    from kernel import open_store, record_response
    from tests.durable.helpers import reviewing

    with open_store(f"sqlite:///{tmp_path / 'answered.db'}") as store:
        wf = reviewing(store)
        (request,) = asyncio.run(wf.run("v1")).pending_requests
        recorded = record_response(store, request.run_id, request.request_id, "approve")
        with TestClient(create_app(store), base_url=LOCAL) as ui:
            page = ui.get("/").text
            row = re.search(rf'data-run="{re.escape(recorded.run_id)}">(.*?)</tr>', page, re.S)
            assert row is not None
            assert ">answered: resume() continues</span>" in row.group(1)
            assert "waiting for input" not in page
            found = ui.get("/", params={"q": "waiting for input"}).text
            assert rows(found, "data-instance") == []


def test_the_run_list_is_searchable(client: TestClient) -> None:
    page = client.get("/", params={"q": "crashed"}).text
    assert set(rows(page, "data-instance")) == {RECOVERY}
    assert "1 run matching" in page
    assert rows(client.get("/", params={"q": "no-such-thing"}).text, "data-instance") == []


def test_the_timeline_labels_the_aborted_superstep(
    client: TestClient, demo_store: EventStore
) -> None:
    page = client.get(f"/i/{DEMO}").text
    history = fold_history(demo_store.read(DEMO))
    steps = history.supersteps()
    assert rows(page, "data-superstep") == [s.superstep_id for s in steps]
    assert rows(page, "data-status") == [s.status for s in steps]
    assert "aborted" in rows(page, "data-status")
    assert '<span class="badge aborted">aborted: failed</span>' in page
    assert '<span class="exec failed">checkout</span>' in page


def test_the_timeline_shows_lineage_and_messages(client: TestClient) -> None:
    recovery = client.get(f"/i/{RECOVERY}").text
    assert f'forked into <a href="/i/{FORK}">{FORK}</a>' in recovery
    assert "aborted: crashed" in recovery
    assert re.search(r"run \S+ resumes run \S+ from checkpoint", recovery)
    assert "pipeline → pipeline" in recovery  # the messages it routed
    fork = client.get(f"/i/{FORK}").text
    assert f'forked from <a href="/i/{RECOVERY}">{RECOVERY}</a>' in fork


@pytest.mark.parametrize("instance", [DEMO, RECOVERY, FORK, HOSTILE_INSTANCE])
def test_the_graph_is_fetched_from_its_own_address_with_the_routes_of_the_log(
    client: TestClient, demo_store: EventStore, instance: str
) -> None:
    events = demo_store.read(instance)
    routes: dict[tuple[str, str], int] = {}
    for event in events:
        if isinstance(event, MessageStaged):
            for target in event.targets or ([event.target] if event.target else []):
                routes[(event.source, target)] = routes.get((event.source, target), 0) + 1
    invoked = {e.executor_id for e in events if isinstance(e, ExecutorInvoked)}
    step = fold_history(events).supersteps()[-1]
    for path in (f"/i/{instance}?step={step.superstep_id}",
                 f"/i/{instance}/state?at=step:{step.superstep_id}"):  # fmt: skip
        page = client.get(path).text
        assert "<svg" not in page  # drawn when fetched, not while the page is served
        (address,) = rows(page, "data-graph")
        graph = client.get(html.unescape(address))
        assert graph.status_code == 200
        nodes = re.findall(r'<g class="(node(?: active)?)" data-executor="([^"]*)"', graph.text)
        names = {html.unescape(name) for _, name in nodes}
        assert names == invoked | {name for route in routes for name in route}
        active = {html.unescape(name) for cls, name in nodes if cls == "node active"}
        assert active == set(step.executors)
        titles = re.findall(r"<path class=\"edge\"[^>]*><title>(.*?)</title>", graph.text)
        assert sorted(html.unescape(t) for t in titles) == sorted(
            f"{s} -> {t}: {n} message(s)" for (s, t), n in routes.items()
        )
    assert client.get("/i/no-such-instance/graph").status_code == 404


def test_with_the_history_view_only_the_graph_reads_the_whole_log(demo_store: EventStore) -> None:
    """A fresh server serves the run list, a timeline page, state and blame from the history
    view, the snapshots and the key index, reading only the positions the page shows; the
    graph, fetched on its own, is what scans the instance's log (once per server)."""
    Projector(demo_store, [HistoryView(), SnapshotView(every=1), KeyIndexView()]).catch_up()
    reads: list[tuple[str, int, int | None, tuple[str, ...]]] = []
    read = demo_store.read

    def counted(instance_id: str, **options: Any) -> list[Any]:
        reads.append((instance_id, options.get("after", 0), options.get("upto"),
                      tuple(options.get("types", ()))))  # fmt: skip
        return read(instance_id, **options)

    demo_store.read = counted  # type: ignore[method-assign]
    history = fold_history(read(RECOVERY))
    step = history.supersteps()[-1]
    last = demo_store.version(RECOVERY)
    key = next(iter(fold_committed(read(RECOVERY)).values))
    with TestClient(create_app(demo_store), base_url=LOCAL) as client:
        for path in ("/", f"/i/{RECOVERY}", f"/i/{RECOVERY}?step={step.superstep_id}",
                     f"/i/{RECOVERY}/state?at=step:{step.superstep_id}",
                     f"/i/{RECOVERY}/blame/{key}"):  # fmt: skip
            assert client.get(path).status_code == 200, path
        # Nothing read from the log's start but its first event (forks_of): each read starts
        # at a page's superstep, a snapshot or the point asked about.
        assert reads
        assert not [r for r in reads if r[0] == RECOVERY and r[1] == 0 and r[2] != 1], reads
        assert client.get(f"/i/{RECOVERY}/graph").status_code == 200
        graph_reads = [r for r in reads if "executor_invoked" in r[3] and r[0] == RECOVERY]
        assert [(r[1], r[2]) for r in graph_reads] == [(0, last)]
        before = len(reads)
        assert client.get(f"/i/{RECOVERY}/graph").status_code == 200
        assert not [r for r in reads[before:] if "message_staged" in r[3]]  # kept per server


@pytest.mark.parametrize("instance", [DEMO, RECOVERY, FORK])
def test_state_after_each_superstep_is_the_committed_fold(
    client: TestClient, demo_store: EventStore, instance: str
) -> None:
    events = demo_store.read(instance)
    for step in fold_history(events).supersteps():
        assert step.position is not None
        page = client.get(f"/i/{instance}/state", params={"at": f"step:{step.superstep_id}"})
        assert page.status_code == 200
        expected = fold_committed([e for e in events if e.position <= step.position])
        assert state_rows(page.text) == {
            k: show_value(v, limit=2000) for k, v in expected.values.items()
        }, step.index


def test_inside_an_aborted_superstep_is_labelled_never_committed(
    client: TestClient, demo_store: EventStore
) -> None:
    aborted = next(
        s for s in fold_history(demo_store.read(DEMO)).supersteps() if s.status == "aborted"
    )
    page = client.get(f"/i/{DEMO}/state", params={"at": f"inside:{aborted.superstep_id}"}).text
    assert 'id="never-committed"' in page
    assert "aborted: failed" in page
    assert state_rows(page)["secret"] == '"card-token-for-A-1"'  # what the executor saw
    after = client.get(f"/i/{DEMO}/state", params={"at": f"step:{aborted.superstep_id}"}).text
    assert "secret" not in state_rows(after)


def test_state_at_a_position_and_a_time(client: TestClient, demo_store: EventStore) -> None:
    events = demo_store.read(RECOVERY)
    middle = events[len(events) // 2]
    expected = fold_committed(events[: len(events) // 2 + 1]).values
    by_pos = client.get(f"/i/{RECOVERY}/state", params={"at": f"pos:{middle.position}"}).text
    by_time = client.get(
        f"/i/{RECOVERY}/state", params={"at": f"time:{events[-1].timestamp.isoformat()}"}
    ).text
    assert state_rows(by_pos) == {k: show_value(v, limit=2000) for k, v in expected.items()}
    final = fold_committed(events).values
    assert state_rows(by_time) == {k: show_value(v, limit=2000) for k, v in final.items()}
    assert f'max="{events[-1].position}"' in by_pos  # the slider spans the log


def test_diff_between_two_points(client: TestClient, demo_store: EventStore) -> None:
    steps = fold_history(demo_store.read(RECOVERY)).supersteps()
    first, last = steps[0], steps[-1]
    page = client.get(
        f"/i/{RECOVERY}/diff",
        params={"a": f"step:{first.superstep_id}", "b": f"step:{last.superstep_id}"},
    ).text
    assert set(rows(page, 'class="added" data-key')) == {"charged", "packed", "shipped"}
    assert rows(page, 'class="changed" data-key') == ["total"]
    assert '<code class="value">2</code></td><td><code class="value">20</code>' in page


def test_blame_lists_every_write_with_its_verdict(
    client: TestClient, demo_store: EventStore
) -> None:
    page = client.get(f"/i/{RECOVERY}/blame/total").text
    writes = blame_keys(demo_store, RECOVERY, ["total"]).writes("total")
    assert rows(page, "data-position") == [str(w.position) for w in writes]
    assert rows(page, "data-status") == [w.status for w in writes]
    assert "aborted (crashed)" in page
    assert f'href="/i/{RECOVERY}?step={writes[0].superstep_id}' in page
    demo = client.get(f"/i/{DEMO}/blame/secret").text
    assert rows(demo, "data-status") == ["aborted"]
    assert "It has no committed value now." in demo


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("/i/no-such-instance", "no instance 'no-such-instance'"),
        (f"/i/{DEMO}?run=nope", "no run 'nope'"),
        (f"/i/{DEMO}?step=nope", "no superstep 'nope'"),
        (f"/i/{DEMO}/blame/never", "key 'never' was never written"),
        (f"/i/{DEMO}/state?at=step:zzz", "superstep 'zzz' must name exactly one"),
        (f"/i/{DEMO}/state?at=bogus", "bad point 'bogus'"),
        (f"/i/{DEMO}/diff?a=pos:0&b=nope", "bad point 'nope'"),
        ("/no/such/page", "no such page"),
    ],
)
def test_unknown_things_give_a_clear_404_page(client: TestClient, path: str, says: str) -> None:
    response = client.get(path)
    assert response.status_code == 404
    assert '<h1 class="error-title">not found</h1>' in response.text
    assert says in html.unescape(response.text)


def error_detail(page: str) -> str:
    """The error page's detail, as text on one line."""
    found = re.search(r'<p class="error-detail">(.*?)</p>', page, re.S)
    assert found is not None, page
    return " ".join(html.unescape(found.group(1)).split())


def test_a_point_the_log_does_not_have_is_refused_never_moved(
    client: TestClient, demo_store: EventStore
) -> None:
    """``pos:999`` was the state at the last position, ``pos:-1`` the empty state, with 200."""
    last = demo_store.version(RECOVERY)
    run = fold_history(demo_store.read(RECOVERY)).runs()[0]
    refused = [
        ("state", {"at": f"pos:{last + 1}"}, f"the instance's positions are 1 to {last}"),
        ("state", {"at": "pos:999"}, f"the instance's positions are 1 to {last}"),
        ("state", {"at": "pos:-1"}, f"the instance's positions are 1 to {last}"),
        ("diff", {"a": "pos:1", "b": "pos:500"}, f"the instance's positions are 1 to {last}"),
        ("diff", {"a": "pos:-1"}, f"the instance's positions are 1 to {last}"),
        ("state", {"at": f"run:{run.run_id}:99"}, f"run {run.run_id} has no superstep 99"),
        ("diff", {"a": f"run:{run.run_id}:0"}, f"run {run.run_id} has no superstep 0"),
    ]
    for page, query, says in refused:
        response = client.get(f"/i/{RECOVERY}/{page}", params=query)
        assert response.status_code == 404, (page, query)
        assert says in error_detail(response.text), (page, query)
        assert "committed state at position" not in response.text
    for page, query in (("state", {"at": f"pos:{last}"}), ("state", {"at": "pos:0"})):
        assert client.get(f"/i/{RECOVERY}/{page}", params=query).status_code == 200
    assert client.get(f"/i/{RECOVERY}/diff", params={"a": "pos:0", "b": f"pos:{last}"}).is_success


@pytest.mark.parametrize(
    "point",
    [
        "pos:abc",
        "pos:",
        "pos:999",
        "pos:-1",
        "run:x:y",
        "time:yesterday",
        "time:2026-11-30T14:55:00",
        "bogus",
        "step:zzz",
    ],
)
def test_a_bad_point_is_refused_in_the_clis_words_never_pythons(
    client: TestClient,
    store_path: Path,
    capsys: pytest.CaptureFixture[str],
    point: str,
) -> None:
    """One rule for a point in the UI and the command line (``point_in``): the same words."""
    page = client.get(f"/i/{RECOVERY}/state", params={"at": point})
    assert page.status_code == 404
    detail = error_detail(page.text)
    capsys.readouterr()
    assert main(["--store", f"sqlite:///{store_path}", "state", RECOVERY, point]) == EXIT_BAD_INPUT
    assert " ".join(capsys.readouterr().err.split()) == f"steplog: {detail}"
    for python in ("invalid literal", "int()", "base 10", "isoformat string", "no such point"):
        assert python not in detail
    if not point.startswith("step:") and not point[4:].lstrip("-").isdigit():
        assert "a point is pos:N" in detail, detail  # a malformed point: the forms are named


def test_a_superstep_never_decided_is_refused_as_the_cli_refuses_it(tmp_path: Path) -> None:
    """``step:`` of an open superstep named the Python class ("use InsideSuperstep"); a marker
    written after its run ended (one the history does not count) names a point all the same."""
    url = f"sqlite:///{tmp_path / 'open.db'}"
    log = LogBuilder("o", clock=ticking_clock())
    log.start_run(1, run_id="run-one")
    log.start_superstep(superstep_id="step-late")
    log.invoke("writer")
    log.write("a", 1)
    log.fail_run(RuntimeError("died"))
    log.commit(superstep="step-late", run="run-one")
    log.start_run(2, run_id="run-two")
    log.start_superstep(superstep_id="step-open")
    log.invoke("writer")
    log.write("a", 2)
    with open_store(url) as store:
        log.append_to(store)
        with TestClient(create_app(store), base_url=LOCAL) as client:
            for point in ("step:step-open", "run:run-two:1", "step:step-o"):
                page = client.get("/i/o/state", params={"at": point})
                assert page.status_code == 404, point
                detail = error_detail(page.text)
                assert "inside:step-open shows the state inside it" in detail
                assert "InsideSuperstep" not in detail
            assert client.get("/i/o/state", params={"at": "inside:step-open"}).is_success
            diff = client.get("/i/o/diff", params={"a": "pos:0", "b": "step:step-open"})
            assert diff.status_code == 404
            # The pages link an open superstep's inside, never a state after it.
            timeline = client.get("/i/o").text
            assert "state?at=inside:step-open" in timeline
            assert "step:step-open" not in timeline
            late = client.get("/i/o/state", params={"at": "step:step-late"})
            assert late.status_code == 200
            assert "state?at=inside:step-open" in late.text  # its next superstep's inside
            assert "step:step-open" not in late.text
            assert main(["--store", url, "state", "o", "step:step-late"]) == 0


def test_every_value_from_the_log_is_escaped(client: TestClient, demo_store: EventStore) -> None:
    history = fold_history(demo_store.read(HOSTILE_INSTANCE))
    step = history.supersteps()[0].superstep_id
    pages = [
        "/",
        f"/i/{HOSTILE_INSTANCE}",
        f"/i/{HOSTILE_INSTANCE}/state",
        f"/i/{HOSTILE_INSTANCE}/state?at=inside:{step}",
        f"/i/{HOSTILE_INSTANCE}/diff",
        f"/i/{HOSTILE_INSTANCE}/blame/{HOSTILE}",
    ]
    for path in pages:
        page = client.get(path)
        assert page.status_code == 200, path
        assert "<script>window" not in page.text, path
        assert "<img src=x" not in page.text, path
        assert "&lt;script&gt;window.__pwned = 1&lt;/script&gt;" in page.text, path


def test_sensitive_values_are_redacted_unless_revealed(demo_store: EventStore) -> None:
    with TestClient(create_app(demo_store), base_url=LOCAL) as client:
        page = client.get(f"/i/{HOSTILE_INSTANCE}/state").text
        blame = client.get(f"/i/{HOSTILE_INSTANCE}/blame/api_key").text
    assert state_rows(page)["api_key"] == '{"$t":"redacted"}'
    assert "sk-" not in page
    assert "sk-" not in blame
    assert '"$t":"redacted"' in html.unescape(blame)
    with TestClient(create_app(demo_store, reveal=True), base_url=LOCAL) as client:
        page = client.get(f"/i/{HOSTILE_INSTANCE}/state").text
    assert state_rows(page)["api_key"] == '"sk-3"'
    with TestClient(create_app(demo_store, sensitive=("count",)), base_url=LOCAL) as client:
        page = client.get(f"/i/{HOSTILE_INSTANCE}/state").text
    assert state_rows(page)["count"] == '{"$t":"redacted"}'


def test_a_token_guards_every_page(demo_store: EventStore) -> None:
    with TestClient(create_app(demo_store, token="s3cret"), base_url=LOCAL) as client:
        assert client.get("/").status_code == 403
        assert client.get(f"/i/{DEMO}").status_code == 403
        assert client.get("/static/ui.css").status_code == 403
        assert client.get("/", params={"token": "wrong"}).status_code == 403
        first = client.get("/", params={"token": "s3cret"})
        assert first.status_code == 200
        assert "steplog_ui_token" in first.headers["set-cookie"]
        assert client.get(f"/i/{DEMO}").status_code == 200  # the cookie now
    assert not needs_token("127.0.0.1")
    assert not needs_token("::1")
    assert not needs_token("localhost")
    assert needs_token("0.0.0.0")
    assert needs_token("192.168.1.4")
    assert needs_token("example.org")


def test_assets_are_shipped_in_the_package(client: TestClient) -> None:
    page = client.get(f"/i/{DEMO}").text
    assert re.findall(r'(?:src|href)="(https?:)?//', page) == []  # nothing from the network
    assert client.get("/static/ui.js").status_code == 200
    assert "text/css" in client.get("/static/ui.css").headers["content-type"]


def test_the_live_stream_sends_the_version_as_the_log_grows(server: Server) -> None:
    import asyncio

    with (
        httpx.Client(timeout=30) as http,
        http.stream("GET", f"{server.url}/i/{HOSTILE_INSTANCE}/live") as stream,
    ):
        lines = stream.iter_lines()
        first = next(line for line in lines if line.startswith("data:"))
        assert first == f"data: {server.store.version(HOSTILE_INSTANCE)}"
        asyncio.run(write_chain(server.store, HOSTILE_INSTANCE, stop=2))
        grown = next(line for line in lines if line.startswith("data:"))
        assert grown == f"data: {server.store.version(HOSTILE_INSTANCE)}"
        assert int(grown[5:]) > int(first[5:])


_READ_EVERY_PAGE = """
import sys
from starlette.testclient import TestClient
from kernel import open_store
from projections.ui import create_app
with open_store(sys.argv[1], create=False) as store, TestClient(
    create_app(store), base_url="http://127.0.0.1"
) as client:
    for path in sys.argv[2:]:
        print(path, client.get(path).status_code)
"""


def test_reading_never_writes_even_on_a_read_only_store(store_path: Path) -> None:
    url = f"sqlite:///{store_path}"
    paths = ["/", f"/i/{DEMO}", f"/i/{DEMO}/state", f"/i/{DEMO}/diff", f"/i/{RECOVERY}/blame/total",
             f"/i/{FORK}", "/i/nothing"]  # fmt: skip
    directory = store_path.parent
    for extra in ("-wal", "-shm"):
        Path(f"{store_path}{extra}").unlink(missing_ok=True)
    before = store_path.read_bytes()
    files = sorted(p.name for p in directory.iterdir())
    store_path.chmod(0o444)
    directory.chmod(0o555)
    try:
        done = in_a_child_without_write_permission(["-c", _READ_EVERY_PAGE, url, *paths])
    finally:
        directory.chmod(0o755)
    assert done.returncode == 0, done.stderr
    statuses = [line.rsplit(" ", 1)[1] for line in done.stdout.splitlines()]
    assert statuses == ["200"] * 6 + ["404"]
    assert store_path.read_bytes() == before
    assert sorted(p.name for p in directory.iterdir()) == files


def test_the_command_refuses_json_and_a_missing_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = f"sqlite:///{tmp_path}/none.db"
    assert main(["--store", missing, "ui"]) == EXIT_STORE
    assert not (tmp_path / "none.db").exists()
    assert main(["--store", "memory://", "--json", "ui"]) == EXIT_BAD_INPUT
    assert "has no JSON output" in capsys.readouterr().err
    assert main(["--store", "memory://", "ui", "--port", "0"]) == EXIT_BAD_INPUT


def test_with_snapshots_and_the_key_index_the_pages_say_the_same(demo_store: EventStore) -> None:
    from projections import KeyIndexView, Projector, SnapshotView

    Projector(demo_store, [SnapshotView(2), KeyIndexView()]).catch_up()
    with TestClient(create_app(demo_store), base_url=LOCAL) as client:
        for instance in (DEMO, RECOVERY, FORK):
            events = demo_store.read(instance)
            for step in fold_history(events).supersteps():
                assert step.position is not None
                for at in (f"step:{step.superstep_id}", f"pos:{step.start_position}"):
                    page = client.get(f"/i/{instance}/state", params={"at": at}).text
                    upto = step.position if at.startswith("step") else step.start_position
                    expected = fold_committed([e for e in events if e.position <= upto])
                    assert state_rows(page) == {
                        k: show_value(v, limit=2000) for k, v in expected.values.items()
                    }, (instance, at)
        page = client.get(f"/i/{RECOVERY}/blame/total").text
        writes = blame_keys(demo_store, RECOVERY, ["total"], index=False).writes("total")
        assert rows(page, "data-status") == [w.status for w in writes]


def test_sub_workflow_links_and_waiting_for_input(tmp_path: Path) -> None:
    import asyncio

    from kernel import open_store
    from projections import parent_of, subworkflows_of
    from tests.kernel.test_subworkflows import asking_parent

    with open_store(f"sqlite:///{tmp_path}/sub.db") as demo_store:
        wf = asking_parent(demo_store, instance_id="parent")
        asyncio.run(wf.run("ann@example.com"))
        with TestClient(create_app(demo_store), base_url=LOCAL) as client:
            waiting = client.get("/", params={"q": "waiting for input"}).text
            assert "parent" in rows(waiting, "data-instance")
        (request,) = wf.pending_requests()
        asyncio.run(wf.run(responses={request.request_id: True}))
        asked, answered = subworkflows_of(demo_store, "parent")
        with TestClient(create_app(demo_store), base_url=LOCAL) as client:
            parent = html.unescape(client.get("/i/parent").text)
            child = html.unescape(client.get(f"/i/{answered.child_instance}").text)
        for link in (asked, answered):
            assert f'ran sub-workflow <a href="/i/{link.child_instance}">' in parent
        assert parent.count(": committed</li>") >= 2
        up = parent_of(demo_store, answered.child_instance)
        assert up is not None
        assert (
            f'sub-workflow of <a href="/i/parent?step={up.parent_superstep}">parent</a>' in child
        ), child
        assert f'forked from <a href="/i/{asked.child_instance}">' in child


def test_a_run_answered_and_continued_is_listed_as_continued_not_waiting(tmp_path: Path) -> None:
    """Issue 21: after its request was answered and the work went on, the first run is listed
    as continued, by the run that went on, and a search for waiting runs no longer finds it."""
    import asyncio

    from kernel import open_store
    from tests.durable.helpers import reviewing

    with open_store(f"sqlite:///{tmp_path}/answered.db") as store:
        wf = reviewing(store, "order")
        (request,) = asyncio.run(wf.run("v1")).pending_requests
        asyncio.run(wf.run(responses={request.request_id: "approve"}))
        first, second = [e.run_id for e in wf.events() if e.type == "run_started"]
        with TestClient(create_app(store), base_url=LOCAL) as client:
            waiting = client.get("/", params={"q": "waiting for input"}).text
            listed = client.get("/").text
            instance = client.get("/i/order").text
    assert rows(waiting, "data-run") == []
    for page in (listed, instance):
        row = re.search(
            rf'<tr class="run[^"]*"[^>]*>(?:(?!</tr>).)*{first[:8]}.*?</tr>', page, re.S
        )
        assert row is not None
        assert "run-continued" in row.group(0)
        assert f'title="{second}"' in row.group(0)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_serving_off_loopback_generates_a_token_and_prints_it(
    demo_store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uvicorn

    from projections.ui import serve

    served: list[tuple[Any, str, int]] = []

    def run(server: uvicorn.Server, sockets: list[socket.socket]) -> None:
        host, port = sockets[0].getsockname()[:2]
        served.append((server.config.app, host, port))

    monkeypatch.setattr(uvicorn.Server, "run", run)
    said: list[str] = []
    port = free_port()
    serve(demo_store, host="0.0.0.0", port=port, say=said.append)
    ((app, host, bound),) = served
    token = re.search(r"\?token=(\S+)", said[0])
    assert token is not None
    assert (host, bound) == ("0.0.0.0", port)
    assert f"http://0.0.0.0:{port}/?token=" in said[0]
    with TestClient(app, base_url=LOCAL) as client:
        assert client.get("/").status_code == 403
        assert client.get("/", params={"token": token.group(1)}).status_code == 200
    served.clear()
    said.clear()
    serve(demo_store, port=port, say=said.append)  # loopback: no token
    assert said[0].endswith(f"at http://127.0.0.1:{port}/  (Ctrl-C stops)")
    with TestClient(served[0][0], base_url=LOCAL) as client:
        assert client.get("/").status_code == 200


def test_a_busy_port_is_one_clear_line_and_nothing_served(
    store_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``steplog ui`` binds before it says where it serves: on a port another program listens
    on, it prints one line saying so (never the "serving ... at" line) and exits non-zero."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["--store", f"sqlite:///{store_path}", "ui", "--port", str(port)])
    out, err = capsys.readouterr()
    assert code == EXIT_BAD_INPUT
    assert "serving" not in out + err
    assert out == ""
    assert err.splitlines() == [
        f"steplog: cannot serve at http://127.0.0.1:{port}/: the port is in use (by another "
        "program, or another steplog ui): stop it, or choose another port"
    ]


@pytest.mark.parametrize("path", ["/", f"/i/{DEMO}"])
@pytest.mark.parametrize("page", ["999", "0", "-1", "two", "1.5", "\u0663"])
def test_a_page_that_does_not_exist_is_refused_never_moved(
    demo_store: EventStore, path: str, page: str
) -> None:
    """A page number past the last one, or anything but a whole number from 1, is a 404 saying
    so; it used to show the last (or the first) page as if it had been asked for."""
    with TestClient(create_app(demo_store), base_url=LOCAL) as client:
        assert client.get(path, params={"page": "1"}).status_code == 200
        response = client.get(path, params={"page": page})
    assert response.status_code == 404
    assert "no page" in html.unescape(response.text)
