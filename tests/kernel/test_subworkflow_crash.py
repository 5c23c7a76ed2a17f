"""A parent process killed while its sub-workflow runs: the next process resumes the parent,
which runs the superstep again with a new child; the orphaned child's run is closed as crashed
by ``recover`` (or by any later run of it), and nothing of it ever reached the parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from kernel import fold_committed, recover
from projections import parent_of, subworkflows_of
from tests.kernel.subworkflow_worker import parent

WORKER = "tests.kernel.subworkflow_worker"
ROOT = Path(__file__).resolve().parents[2]


async def test_a_parent_killed_while_its_sub_workflow_runs_resumes_with_a_new_child(
    sqlite_url: str,
) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    worker = subprocess.Popen(  # noqa: ASYNC220 - the test waits for it on purpose
        [sys.executable, "-m", WORKER, sqlite_url], stdout=subprocess.PIPE, text=True, env=env
    )
    assert worker.stdout is not None
    assert worker.stdout.readline().strip() == "READY"
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=30)

    wf = parent(sqlite_url, hang=False)
    store = wf.store
    try:
        # The killed child wrote its attempt, and its run is open; the parent never linked it.
        (orphan,) = [name for name in store.instances() if name.startswith("crashy/sub/")]
        assert store.read(orphan)[-1].type == "state_staged"
        assert subworkflows_of(store, "crashy") == []
        assert parent_of(store, orphan) is not None
        assert parent_of(store, orphan).verdict == "open"  # type: ignore[union-attr]

        result = await wf.resume()
        assert result.get_outputs() == ["FINE"]
        assert wf.committed_state() == {"started": "fine", "got": "FINE"}
        ends = [e for e in wf.events() if e.type == "run_abandoned"]
        assert [e.reason for e in ends] == ["crashed"]
        (link,) = subworkflows_of(store, "crashy")
        assert link.verdict == "committed"
        assert link.child_instance != orphan
        assert store.read(link.child_instance)[-1].type == "run_completed"
        # The orphan's superstep of the killed parent is aborted, so its link reads as such.
        assert parent_of(store, orphan).verdict == "aborted"  # type: ignore[union-attr]

        closed = recover(store)
        assert [(run.instance_id) for run in closed] == [orphan]
        assert store.read(orphan)[-1].type == "run_abandoned"
        assert fold_committed(store.read(orphan)).values == {}
    finally:
        store.close()
