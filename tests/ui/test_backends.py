"""The UI's pages on every backend (memory, SQLite, PostgreSQL): the timeline's verdicts and the
state after each superstep are the projections'."""

from __future__ import annotations

import asyncio
import html
import re

from starlette.testclient import TestClient

from kernel import EventStore, fold_committed, open_store
from projections import fold_history
from projections._frontend._render import show_value
from projections.ui import create_app
from tests.ui.conftest import LOCAL
from tests.ui.workflows import write_chain


def test_the_pages_on_each_backend(store_url: str) -> None:
    with open_store(store_url) as store:
        asyncio.run(write_chain(store, "chain", stop=3, fail_at=2))
        asyncio.run(write_chain(store, "chain", stop=4))
        check(store)


def check(store: EventStore) -> None:
    events = store.read("chain")
    steps = fold_history(events).supersteps()
    with TestClient(create_app(store, reveal=True), base_url=LOCAL) as client:
        timeline = client.get("/i/chain").text
        assert re.findall(r'data-status="([^"]*)"', timeline) == [s.status for s in steps]
        for step in steps:
            assert step.position is not None
            page = client.get("/i/chain/state", params={"at": f"step:{step.superstep_id}"}).text
            shown = dict(
                re.findall(
                    r'<tr data-key="([^"]*)"><td class="key">.*?</td><td><code class="value">'
                    r"(.*?)</code>",
                    page,
                    re.S,
                )
            )
            expected = fold_committed([e for e in events if e.position <= step.position])
            assert {html.unescape(k): html.unescape(v) for k, v in shown.items()} == {
                k: show_value(v, limit=2000) for k, v in expected.values.items()
            }
