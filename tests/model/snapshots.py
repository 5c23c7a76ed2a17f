"""What an open decides, with the instance's snapshot and without it: the two must be equal.

``views_of(wf)`` opens ``wf``'s instance afresh (a new ``WorkflowInstance`` over the same store,
settings and graph, so nothing is cached from an earlier open) and gathers everything a run
started on it would act on: committed state, the open run (which a new run closes first), what
waits on the last run (which a new run with a message refuses over), and what ``resume()`` would
go on from (the run and checkpoint, the position: index, inbox, fan-in buffers, pending requests;
the outputs so far, the run's arguments, the recorded steps it would be served), or why it
would refuse. Used by the model-based test after every step and by ``tests/kernel/test_snapshots``.
"""

from __future__ import annotations

from typing import Any

from kernel import ResumeError, Workflow
from kernel._ops._settings import WorkflowInstance
from kernel._run._ledger import Continuation, HistoryNeeded, Ledger, continued_run, waiting

__all__ = ["views_of"]


def _instance(wf: Workflow, snapshots: bool) -> WorkflowInstance:
    settings = wf._instance.settings.replace(snapshot_every=1 if snapshots else 0)
    return WorkflowInstance(wf.store, wf._instance.router.graph, settings)


def _continuation(instance: WorkflowInstance, ledger: Ledger) -> Any:
    try:
        line, checkpoint = continued_run(ledger, Continuation(), instance.workflow_name)
        standing = ledger.standing(
            line,
            checkpoint,
            router=instance.router,
            codec=instance.codec,
            origin=instance.origin_ledger,
        )
        book = ledger.step_book(line)
    except ResumeError as refused:
        return ("refused", str(refused))
    position = standing.position
    return (
        line,
        checkpoint,
        position.index,
        repr(position.inbox),
        repr(sorted((g.target, sorted(got.items())) for g, got in position.buffers.items())),
        repr(position.requests),
        repr(standing.outputs),
        repr(standing.intermediate_outputs),
        standing.kwargs,
        book.lineage,
        repr(sorted(book._by_superstep.items())),
        repr(sorted(book._by_lineage.items())),
        repr(sorted(book._served_in.items())),
        book.aborted,
    )


def _asked(instance: WorkflowInstance, ledger: Ledger, question: Any) -> Any:
    """``question(ledger)``, asked again of the whole log's ledger if the snapshot's is pruned
    past what it needs (as the runner does)."""
    try:
        return question(ledger)
    except HistoryNeeded:
        return question(instance.full_ledger())


def views_of(wf: Workflow, *, snapshots: bool) -> tuple[dict[str, Any], str]:
    """What an open of ``wf``'s instance decides, with its snapshot or folding the whole log;
    and what became of the snapshot (``InstanceContext.snapshot_note``)."""
    instance = _instance(wf, snapshots)
    head, ledger = instance.catch_up_ledger()
    found = _asked(instance, ledger, waiting)
    views = {
        "committed": instance.committed_values(),
        "open run": (
            head.version,
            head.run_id,
            head.owner,
            head.superstep_id,
            head.index,
            head.requests_may_wait,
        ),
        "latest": ledger.latest,
        "waiting": (found.requests, [r.request_id for r in found.responses]),
        "continuation": _asked(instance, ledger, lambda led: _continuation(instance, led)),
    }
    return views, instance.snapshot_note
