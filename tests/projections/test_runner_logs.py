"""The projections on a log written by the kernel's own runner (the demo scenario)."""

from __future__ import annotations

from projections import InsideSuperstep, Projector, fold_blame, fold_history, state_at
from projections.cli._demo import run_demo
from tests.projections.reference import Reference


async def test_projections_agree_with_the_reference_on_a_runner_log(store):
    await run_demo(store, "demo-1")
    events = store.read("demo-1")
    ref = Reference(events)
    history = fold_history(events)
    assert [r.status for r in history.runs()] == [r["status"] for r in ref.runs()]
    assert "failed" in [r.status for r in history.runs()]
    blame = fold_blame(events)
    got = {
        k: [(w.position, w.status, w.reason) for w in blame.writes(k)] for k in blame.written_keys()
    }
    assert got == ref.blame()
    assert ref.blame()["secret"][0][1] == "aborted"  # the failed executor's write never counted
    failed = next(s for s in history.supersteps() if s.status == "aborted")
    seen = state_at(events, InsideSuperstep(failed.superstep_id))
    assert (seen.values, seen.status) == ref.inside(failed.superstep_id)
    assert "secret" in seen.values
    assert "secret" not in ref.state()
    projector = Projector(store)
    projector.catch_up()
    assert projector.state("demo-1") == ref.state()
