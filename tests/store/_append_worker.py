"""Appends events to one stream from its own process, for ``test_processes``.

Usage: ``python _append_worker.py URL INSTANCE_ID COUNT``. Prints ``ready``, waits for a line on
stdin (the start signal), opens the store, appends COUNT events one append at a time, then prints
their global positions as JSON.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime

from kernel import StateStaged, open_store


def main(url: str, instance_id: str, count: int) -> None:
    print("ready", flush=True)
    sys.stdin.readline()
    with open_store(url) as store:
        positions: list[int] = []
        for position in range(1, count + 1):
            event = StateStaged(
                instance_id=instance_id,
                position=position,
                timestamp=datetime.now(UTC),
                run_id="run-1",
                superstep_id=f"ss-{position}",
                executor_id="worker",
                key="n",
                op="set",
                value=position,
            )
            positions += store.append(instance_id, [event], expected_version=position - 1)
    print(json.dumps(positions), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
