"""Durable execution in the projections: requests waiting for input, resumed runs and forks in
run history (pure folds and the materialized view), and blame, time travel, diff and bisect on a
forked instance."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from kernel import (
    EventBase,
    InfoRequested,
    WorkflowBuilder,
    open_store,
    record_response,
)
from kernel.testing import LogBuilder, ticking_clock
from projections import (
    AtPosition,
    AtSuperstep,
    HistoryView,
    Projector,
    RunHistory,
    TimeTravel,
    bisect,
    blame_keys,
    diff_points,
    fold_blame,
    fold_committed,
    fold_history,
    forks_of,
    history_of,
    state_at,
)
from tests.durable.helpers import AsksThenFails, Tick, counting, reviewing


def projected(store: Any, *names: str) -> Projector:
    projector = Projector(store, list(names) or ["history", "blame"], page_size=3)
    projector.catch_up()
    return projector


# -- requests and responses ----------------------------------------------------------------


async def test_a_run_waiting_for_input_shows_its_pending_requests_until_answered(store_url):
    store = open_store(store_url)
    wf = reviewing(store)
    first = await wf.run("v1")
    (request,) = first.pending_requests

    history = fold_history(wf.events())
    (run,) = history.runs()
    assert run.status == "awaiting_input"
    (pending,) = run.pending_requests
    assert (pending.request_id, pending.executor_id, pending.response_type) == (
        request.request_id,
        "reviewer",
        "str",
    )
    assert pending.data["v"] == {"draft": "v1"}  # the request as a wire JSON tree
    (step,) = history.supersteps(run.run_id)
    assert step.requests == (request.request_id,)
    assert pending.superstep_id == step.superstep_id
    assert projected(store).history("r") == history

    await wf.run(responses={request.request_id: "approve"})

    history = fold_history(wf.events())
    first_run, answering = history.runs()
    assert first_run.pending_requests == []
    assert history.pending_requests() == []
    assert answering.responses == [request.request_id]
    assert answering.status == "completed"
    assert answering.outputs == ["v1"]
    assert projected(store).history("r") == history


async def test_a_run_answered_and_continued_no_longer_waits_in_the_fold_and_the_view(store_url):
    """Issue 21: a run that stopped waiting for input and was continued is ``continued`` (and
    lists the run that continues it), in the pure fold and in the materialized view alike, the
    view folded page by page as the log grew."""
    store = open_store(store_url)
    wf = reviewing(store)
    projector = Projector(store, ["history"], page_size=2)
    (request,) = (await wf.run("v1")).pending_requests
    projector.catch_up()
    assert [r.status for r in projector.history("r").runs()] == ["awaiting_input"]
    (again,) = (await wf.run(responses={request.request_id: "shorter"})).pending_requests
    projector.catch_up()
    await wf.run(responses={again.request_id: "approve"})
    projector.catch_up()

    history = fold_history(wf.events())
    first, second, third = history.runs()
    assert (first.status, first.continued_by) == ("continued", [second.run_id])
    assert (second.status, second.continued_by) == ("continued", [third.run_id])
    assert (third.status, third.continued_by) == ("completed", [])
    assert [run for run in history.runs() if run.status == "awaiting_input"] == []
    assert history.pending_requests() == []
    assert projector.history("r") == history
    assert projected(store).history("r") == history  # the view folded from nothing


async def test_a_run_that_recorded_a_response_is_answered_in_the_fold_and_the_view(store_url):
    """Issue 21: the run ``record_response`` (``steplog respond``) writes executes nothing and
    waits for nothing: it is ``answered`` (its response waits for ``resume()``), not
    ``awaiting_input``, in the fold and the view alike; ``continued`` once resumed, and
    ``superseded`` if a new run gives its response up."""
    store = open_store(store_url)
    wf = reviewing(store)
    projector = Projector(store, ["history"], page_size=2)
    (request,) = (await wf.run("v1")).pending_requests
    record_response(store, request.run_id, request.request_id, "approve")
    projector.catch_up()
    history = fold_history(wf.events())
    first, answering = history.runs()
    assert (first.status, answering.status) == ("continued", "answered")
    assert answering.responses == [request.request_id]
    assert history.pending_requests() == []
    assert projector.history("r") == history
    await wf.resume()
    projector.catch_up()
    history = fold_history(wf.events())
    assert [r.status for r in history.runs()] == ["continued", "continued", "completed"]
    assert projector.history("r") == history
    assert projected(store).history("r") == history

    (again,) = (await wf.run("v2")).pending_requests
    record_response(store, again.run_id, again.request_id, "approve")
    await wf.run("v3", supersede_requests=True)
    statuses = [r.status for r in fold_history(wf.events()).runs()]
    assert statuses[3:] == ["continued", "superseded", "awaiting_input"]
    assert projected(store).history("r") == fold_history(wf.events())


async def test_a_request_of_an_aborted_superstep_never_waits(store_url):
    store = open_store(store_url)
    wf = WorkflowBuilder(
        start_executor=AsksThenFails("flaky"), store=store, instance_id="f"
    ).build()
    with pytest.raises(RuntimeError):
        await wf.run("v1")
    history = fold_history(wf.events())
    (run,) = history.runs()
    (step,) = history.supersteps()
    assert run.status == "failed"
    assert step.status == "aborted"
    assert len(step.requests) == 1
    assert run.pending_requests == []
    assert projected(store).history("f") == history


async def test_a_new_run_ends_the_wait_as_the_kernel_does(store_url):
    store = open_store(store_url)
    wf = reviewing(store)
    (request,) = (await wf.run("v1")).pending_requests
    assert [r.request_id for r in fold_history(wf.events()).pending_requests()] == [
        request.request_id
    ]
    await wf.run("v2", supersede_requests=True)  # a new line: v1's request is given up

    history = fold_history(wf.events())
    first, second = history.runs()
    assert first.pending_requests == []
    assert (first.status, second.status) == ("superseded", "awaiting_input")  # one waits
    (waiting,) = wf.pending_requests()  # v2's request, by the kernel
    assert [r.request_id for r in second.pending_requests] == [waiting.request_id]
    assert [r.request_id for r in history.pending_requests()] == [waiting.request_id]
    assert history.supersteps(first.run_id)[0].requests == (request.request_id,)
    assert projected(store).history("r") == history


def _with_requests(events: list[EventBase], after: dict[int, InfoRequested]) -> list[EventBase]:
    """``events`` with a request inserted after each named position, renumbered."""
    out: list[EventBase] = []
    for event in events:
        out.append(event)
        if event.position in after:
            out.append(after[event.position])
    return [e.model_copy(update={"position": n}) for n, e in enumerate(out, start=1)]


def _request(request_id: str, superstep_id: str, run_id: str) -> InfoRequested:
    return InfoRequested(
        instance_id="hand",
        position=1,
        timestamp=datetime(2025, 1, 1, tzinfo=UTC),
        run_id=run_id,
        superstep_id=superstep_id,
        request_id=request_id,
        executor_id="asker",
        data={"q": request_id},
        response_type="str",
    )


def test_a_crashed_run_says_what_happened_and_who_closed_it():
    """Issue 21: the record of a run found unfinished and closed has an error that says why it
    ended, which superstep was aborted, who closed it and when; a log written before ``recover``
    named itself (``closed_by`` None: only ``recover`` left it empty) says ``recover``."""
    log = LogBuilder("hand", clock=ticking_clock(datetime(2025, 1, 1, tzinfo=UTC), step=1))
    log.start_run(run_id="run-1")
    log.start_superstep(superstep_id="s1")
    log.abort("crashed")
    log.abandon_run("crashed", superstep_id="s1")  # as recover wrote it before (closed_by None)
    log.start_run(run_id="run-2")
    log.start_superstep(superstep_id="s2")
    log.abort("abandoned")
    ended = log.abandon_run("abandoned", superstep_id="s2", closed_by="run-3")
    log.start_run(run_id="run-3")
    first, second, _ = fold_history(log.events()).runs()
    assert (first.status, first.closed_by) == ("crashed", "recover")
    assert first.error is not None
    assert first.error.type == "crashed"
    assert first.error.message.startswith("its process died")
    assert "its open superstep s1 was aborted; closed by recover at 2025-01-01T00:00:" in (
        first.error.message
    )
    assert (second.status, second.closed_by) == ("abandoned", "run-3")
    assert second.error is not None
    assert second.error.message.endswith(f"closed by run-3 at {ended.timestamp.isoformat()}")


def test_a_request_counts_only_if_staged_before_its_superstep_commits():
    log = LogBuilder("hand", clock=ticking_clock(datetime(2025, 1, 1, tzinfo=UTC), step=1))
    log.start_run(run_id="run-1")
    log.start_superstep(superstep_id="s1")
    log.invoke("asker")  # position 3
    log.commit()  # position 4
    log.start_superstep(superstep_id="s2")  # position 5
    log.abort("failed")  # position 6
    log.fail_run(RuntimeError("x"))
    events = _with_requests(
        log.events(),
        {
            3: _request("in-time", "s1", "run-1"),
            4: _request("late", "s1", "run-1"),  # after s1's marker
            5: _request("aborted", "s2", "run-1"),
        },
    )
    history = fold_history(events)
    (run,) = history.runs()
    assert [r.request_id for r in run.pending_requests] == ["in-time"]
    assert [s.requests for s in history.supersteps()] == [("in-time", "late"), ("aborted",)]
    # the history's verdict is the committed-state fold's marker rule, whatever the order
    assert fold_committed(events).last_committed == "s1"


# -- resumed runs ----------------------------------------------------------------------------


async def test_a_resumed_run_shows_its_lineage_both_ways(store_url):
    store = open_store(store_url)
    with pytest.raises(RuntimeError, match="boom at 3"):
        await counting(store, fail_at=3).run(Tick(1))
    wf = counting(store)
    checkpoint = wf.checkpoints()[-1].checkpoint_id
    await wf.resume()

    history = fold_history(wf.events())
    failed, resumed = history.runs()
    assert failed.status == "failed"
    assert failed.continued_by == [resumed.run_id]
    assert (resumed.continues, resumed.checkpoint) == (failed.run_id, checkpoint)
    assert resumed.status == "completed"
    assert resumed.continued_by == []
    assert projected(store).history("count") == history
    assert RunHistory.from_json(history.to_json()) == history
    assert RunHistory.from_json(history.to_json()).run(failed.run_id).continued_by == [
        resumed.run_id
    ]


# -- forks -----------------------------------------------------------------------------------


async def _forked(store: Any) -> tuple[Any, Any, str]:
    """Instance ``count`` fails at 4; ``count-fork`` is forked after its second superstep and
    resumed there. Returns the origin, the fork, and the checkpoint forked at."""
    origin = counting(store, fail_at=4)
    with pytest.raises(RuntimeError):
        await origin.run(Tick(1))
    second = origin.checkpoints()[1].checkpoint_id
    fork = counting(store).fork(at=second, instance_id="count-fork")
    await fork.resume()
    return origin, fork, second


async def test_a_fork_shows_its_origin_and_the_origin_lists_its_forks(store_url):
    store = open_store(store_url)
    origin, fork, second = await _forked(store)
    origin_runs = fold_history(origin.events()).runs()

    history = fold_history(fork.events())
    forked = history.forked_from
    assert forked is not None
    assert (forked.instance_id, forked.origin_instance, forked.checkpoint) == (
        "count-fork",
        "count",
        second,
    )
    assert forked.origin_run == origin_runs[0].run_id
    (run,) = history.runs()
    assert (run.continues, run.checkpoint) == (origin_runs[0].run_id, second)
    assert history.forks() == []  # a fold of one instance cannot see its forks

    assert fold_history(origin.events()).forked_from is None
    assert forks_of(store, "count") == [forked]
    assert forks_of(store, "count-fork") == []
    assert history_of(store, "count").forks() == [forked]
    assert history_of(store, "count-fork") == history

    projector = projected(store)
    assert projector.forks("count") == [forked]
    assert projector.history("count").forks() == [forked]
    assert projector.history("count") == fold_history(origin.events())
    assert projector.history("count-fork") == history
    assert projector.verify("history").ok
    projector.rebuild("history")
    assert projector.forks("count") == [forked]


async def test_blame_of_a_forked_value_names_the_fork_and_its_origin(store_url):
    store = open_store(store_url)
    origin = counting(store, fail_at=4)
    with pytest.raises(RuntimeError):
        await origin.run(Tick(1))
    fork = counting(store).fork(at=origin.checkpoints()[1].checkpoint_id, instance_id="f")
    fork_position = fork.events()[0].origin_position

    blame = fold_blame(fork.events())
    current = blame.current("count")
    assert current is not None
    assert current.from_fork
    assert (current.origin_instance, current.origin_position) == ("count", fork_position)
    assert (current.status, current.value, current.position) == ("committed", 2, 1)
    assert blame_keys(store, "f", ["count"]).writes("count") == blame.writes("count")

    await fork.resume()
    blame = fold_blame(fork.events())
    forked, *written = blame.writes("count")
    assert forked.from_fork
    assert forked.status == "superseded"
    assert forked.superseded_by == written[0].position
    assert blame.current("count").value == 5
    assert not blame.current("count").from_fork
    assert blame.current("count").executor_id == "counter"
    projector = projected(store, "blame")
    assert projector.blame("f") == blame
    assert projector.blame("f").current("count") == blame.current("count")
    assert projector.verify("blame").ok


async def test_time_travel_diff_and_bisect_on_a_forked_instance(store_url):
    store = open_store(store_url)
    _, fork, _ = await _forked(store)
    events = fork.events()
    first_commit = next(e for e in events if e.type == "superstep_committed")

    assert state_at(events, AtPosition(0)).values == {}
    assert state_at(events, AtPosition(1)).values == {"count": 2}
    assert state_at(events, AtSuperstep(first_commit.superstep_id)).values == {"count": 3}
    change = diff_points(events, AtPosition(0), AtPosition(1))
    assert change.added == {"count": 2}
    assert diff_points(events, AtPosition(1), AtPosition(len(events))).changed["count"].new == 5

    from_fork = bisect(events, lambda s: s["count"] == 2)
    assert from_fork is not None
    assert (from_fork.origin_instance, from_fork.position, from_fork.index) == ("count", 1, None)
    later = bisect(events, lambda s: s["count"] == 4)
    assert later is not None
    assert later.origin_instance is None
    assert later.index == 4

    projected(store, "snapshots")
    travel = TimeTravel(store)
    assert travel.state("count-fork", AtPosition(1)).values == {"count": 2}
    assert travel.state("count-fork", AtSuperstep(first_commit.superstep_id)).values == {"count": 3}


# -- the view's version ----------------------------------------------------------------------


async def test_the_history_view_moved_to_a_new_table_folded_from_the_start(store_url):
    store = open_store(store_url)
    wf = reviewing(store)
    await wf.run("v1")
    projector = Projector(store, ["history"])
    assert HistoryView().table == "steplog_view_history_v3"
    old = "steplog_view_history_v2"
    projector.backend.ensure(old)
    with projector.backend.transaction() as tx:  # an old table, past the whole log
        assert tx.claim(old, 0)
        tx.put(old, "r", "t", {"tracker": "an older shape"})
        tx.set_position(old, store.last_position())
    projector.catch_up()
    history = projector.history("r")
    assert history == fold_history(wf.events())
    assert history.runs()[0].pending_requests  # the new shape, refolded from the start


async def test_a_fork_of_a_waiting_run_shows_the_requests_it_inherited(store_url):
    store = open_store(store_url)
    origin = reviewing(store)
    await origin.run("v1")
    fork = origin.fork(at=origin.checkpoints()[-1].checkpoint_id, instance_id="r-fork")

    waiting = [r.request_id for r in fork.pending_requests()]
    assert len(waiting) == 1
    history = fold_history(fork.events())
    assert [r.request_id for r in history.pending_requests()] == waiting
    assert history.pending_requests()[0].executor_id == "reviewer"
    projector = projected(store)
    assert [r.request_id for r in projector.history("r-fork").pending_requests()] == waiting

    done = await fork.run(responses={waiting[0]: "approve"})
    assert done.get_outputs() == ["v1"]
    assert fold_history(fork.events()).pending_requests() == []
    projector.catch_up()
    assert projector.history("r-fork").pending_requests() == []
    assert projector.verify("history").ok
