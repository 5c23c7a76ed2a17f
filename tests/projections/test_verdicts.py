"""Every view that says whether a write counted agrees with the one fold, on any log.

The logs are drawn at random from a small alphabet of runs, supersteps and keys, in any order, so
they include what the runner never writes but a damaged or hand-edited log may hold: writes staged
after their superstep's marker, two markers for one superstep, markers and writes after their run
ended, writes of supersteps that never started, runs interleaved. For each log, ``steplog log
--json`` (its ``counts`` column), the blame fold (folded in memory and read from the store a few
keys at a time) and ``fold_committed`` at every prefix must agree on every write.
"""

from __future__ import annotations

import io
import math
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel import (
    EventBase,
    StateStaged,
    SuperstepAborted,
    SuperstepCommitted,
    fold_committed,
    open_store,
)
from projections import blame_keys, fold_blame
from projections.cli import main
from tests.projections.helpers import raw_events

RUNS = ("r1", "r2")
KEYS = ("a", "b")

step_ids = st.tuples(st.sampled_from(RUNS), st.integers(1, 2))
ops = st.sampled_from(("set", "set", "delete"))
actions = st.one_of(
    st.tuples(st.just("run"), st.sampled_from(RUNS)),
    st.tuples(st.just("start"), step_ids),
    st.tuples(st.just("write"), step_ids, st.sampled_from(KEYS), ops),
    st.tuples(st.just("write"), step_ids, st.sampled_from(KEYS), ops),
    st.tuples(st.just("commit"), step_ids),
    st.tuples(st.just("abort"), step_ids),
    st.tuples(st.just("end"), st.sampled_from(RUNS), st.sampled_from(["completed", "crashed"])),
)


def log_column(url: str, instance_id: str) -> dict[int, bool | None]:
    """The ``counts`` of every write, as ``steplog log --json`` prints it."""
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["--store", url, "log", instance_id, "--json"]) == 0
    lines = [orjson.loads(line) for line in out.getvalue().splitlines()]
    return {line["position"]: line["counts"] for line in lines if line["type"] == "state_staged"}


def replayed(events: list[EventBase], counted: set[int], upto: float) -> dict[str, Any]:
    """The state made by the writes said to count, each applied at its superstep's first
    marker, up to position ``upto``."""
    first_marker: dict[str, int] = {}
    for event in events:
        if isinstance(event, SuperstepCommitted | SuperstepAborted):
            first_marker.setdefault(event.superstep_id, event.position)
    order = sorted(
        (first_marker[w.superstep_id], w.position, w)
        for w in events
        if isinstance(w, StateStaged) and w.position in counted
    )
    values: dict[str, Any] = {}
    for marker, _, write in order:
        if marker > upto:
            break
        if write.op == "set":
            values[write.key] = write.value
        else:
            values.pop(write.key, None)
    return values


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plan=st.lists(actions, min_size=1, max_size=24))
def test_log_blame_and_fold_committed_agree_on_every_write(tmp_path_factory, plan):
    events = raw_events("inst", plan)
    url = f"sqlite:///{Path(tmp_path_factory.mktemp('verdicts')) / 'log.db'}"
    with open_store(url) as store:
        store.append("inst", events, expected_version=0)
        from_store = blame_keys(store, "inst", KEYS, page_size=5)
    writes = [e.position for e in events if isinstance(e, StateStaged)]

    column = log_column(url, "inst")
    blame = fold_blame(events)
    status = {w.position: w.status for key in KEYS for w in blame.writes(key)}
    assert status == {w.position: w.status for key in KEYS for w in from_store.writes(key)}
    assert sorted(column) == sorted(status) == writes
    for position in writes:
        counted = status[position] in ("committed", "superseded")
        expected = None if status[position] == "pending" else counted
        assert column[position] == expected, (position, status[position])

    counted = {p for p, counts in column.items() if counts}
    for cut in range(len(events) + 1):
        upto = events[cut - 1].position if cut else 0
        assert fold_committed(events[:cut]).values == replayed(events, counted, upto), cut
    assert fold_committed(events).values == replayed(events, counted, math.inf)
