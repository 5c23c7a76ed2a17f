"""What the group commit's hand-off costs a lone instance: the loop on SQLite, one instance,
appending through the store's group commit (its rounds led inline by the event loop, as by
default), through the committer thread only (``GroupCommitter.inline`` off, as before issue 25),
and directly on the event loop (no group commit), alternating.

``python -m bench.handoff [--supersteps N] [--rounds R]``; prints supersteps/s of each.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from bench._steplog_graphs import loop_workflow


def _rate(supersteps: int, *, shared: bool, inline: bool = True) -> float:
    from kernel import open_store
    from kernel._store._sqlite import SQLiteStore

    with tempfile.TemporaryDirectory() as folder:
        store = open_store(f"sqlite:///{Path(folder) / 'handoff.db'}")
        store.shares_commits = shared  # type: ignore[misc]  # this store only
        assert isinstance(store, SQLiteStore)
        store.group_committer().inline = inline
        try:
            workflow = loop_workflow(store, "handoff", supersteps)
            start = time.perf_counter()
            asyncio.run(workflow.run(0))
            return supersteps / (time.perf_counter() - start)
        finally:
            store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--supersteps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for _ in range(args.rounds):
        grouped = _rate(args.supersteps, shared=True)
        thread = _rate(args.supersteps, shared=True, inline=False)
        direct = _rate(args.supersteps, shared=False)
        print(
            f"group commit {grouped:,.0f}/s   committer thread only {thread:,.0f}/s   "
            f"directly {direct:,.0f}/s"
        )


if __name__ == "__main__":
    main()
