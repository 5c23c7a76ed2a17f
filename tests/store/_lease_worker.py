"""Takes instance leases from its own process, for ``test_leases``.

Usage: ``python _lease_worker.py URL``. Opens the store, prints ``ready``, then for each line
``try INSTANCE_ID`` on stdin tries ``LeaseKeeper.acquire`` on that instance with ``wait=0`` and
prints one JSON line: ``{"instance": ..., "holder": ..., "won": bool, "taken_over": bool,
"error_holder": str | null}``. A lease it wins is kept (never released or renewed): the process
ends, on end of input, without giving it back, as a crashed run would.
"""

from __future__ import annotations

import asyncio
import json
import sys

from kernel import RunInProgressError, open_store
from kernel._store._lease import LeaseKeeper
from kernel._store._owner import process_owner


def main(url: str) -> None:
    with open_store(url) as store:
        print("ready", flush=True)
        for line in sys.stdin:
            command, _, instance_id = line.strip().partition(" ")
            if command != "try":
                raise SystemExit(f"unknown command {line!r}")
            keeper = LeaseKeeper(store, instance_id, owner=process_owner(), ttl=60.0)
            result: dict[str, object] = {"instance": instance_id, "holder": keeper.holder}
            try:
                result["taken_over"] = asyncio.run(keeper.acquire())
                result.update(won=True, error_holder=None)
            except RunInProgressError as error:
                result.update(won=False, taken_over=False, error_holder=error.holder)
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
