"""Appends events to one stream from its own process, for ``test_processes``.

Usage: ``python _append_worker.py URL INSTANCE_ID COUNT``. Prints ``ready``, waits for a line on
stdin (the start signal), opens the store, appends COUNT events one append at a time, then prints
their global positions as JSON.
"""

from __future__ import annotations

import json
import sys

from kernel import open_store
from kernel.testing import LogBuilder


def main(url: str, instance_id: str, count: int) -> None:
    print("ready", flush=True)
    sys.stdin.readline()
    log = LogBuilder(instance_id)
    with open_store(url) as store:
        positions: list[int] = []
        for position in range(1, count + 1):
            log.write("n", position, executor_id="worker", superstep=f"ss-{position}", run="run-1")
            positions += log.append_to(store)
    print(json.dumps(positions), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
