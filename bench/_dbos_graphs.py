"""The steps benchmark's work in DBOS Transact (the bench extra pins 3.4): one ``@DBOS.workflow``
calling ``@DBOS.step`` ``n`` times, each step advancing a count by one; sync and async forms.

DBOS is one instance per process (``DBOS(config=...)``, ``launch``, ``destroy``): ``launched``
opens it on a SQLite system database file, with no Conductor key and no OTLP export, so it reaches
nothing but that file (its background threads poll the file; ``destroy`` joins them).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dbos import DBOS, DBOSConfig, SetWorkflowID

__all__ = [
    "SetWorkflowID",
    "advance_async",
    "launched",
    "recorded_steps",
    "steps",
    "steps_async",
    "steps_gathered",
]


@DBOS.step()
def advance(count: int) -> int:
    return count + 1


@DBOS.workflow()
def steps(n: int) -> int:
    """``n`` recorded steps, one after the other; returns the count they reached."""
    count = 0
    while count < n:
        count = advance(count)
    return count


@DBOS.step()
async def advance_async(count: int) -> int:
    return count + 1


@DBOS.workflow()
async def steps_async(n: int) -> int:
    """``steps`` with an async workflow and step."""
    count = 0
    while count < n:
        count = await advance_async(count)
    return count


@DBOS.workflow()
async def steps_gathered(n: int, width: int) -> int:
    """``n`` async steps, ``width`` at a time gathered (``asyncio.gather``, which DBOS allows in
    an async workflow: each call takes its step number when it is made, before it is awaited);
    the call after a wave starts from its last result."""
    count = 0
    while count < n:
        wave = min(width, n - count)
        got = await asyncio.gather(*(advance_async(count + j) for j in range(wave)))
        count = got[-1]
    return count


@contextmanager
def launched(path: Path) -> Iterator[None]:
    """DBOS launched on the SQLite system database ``path`` (created by its migrations, outside
    any clock), destroyed on exit. Refuses to run when DBOS's environment would connect it to DBOS
    Cloud (``DBOS__CLOUD``): the benchmark reaches no network."""
    if os.environ.get("DBOS__CLOUD") == "true":
        raise RuntimeError("DBOS__CLOUD=true would connect DBOS to its cloud: unset it")
    config: DBOSConfig = {
        "name": "steplog-bench",
        "system_database_url": f"sqlite:///{path}",
        "log_level": "WARNING",
        "enable_otlp": False,
    }
    DBOS(config=config)
    try:
        DBOS.launch()
        yield
    finally:
        DBOS.destroy()


def recorded_steps(workflow_id: str) -> list[Any]:
    """The steps DBOS recorded for ``workflow_id``, read back from its system database."""
    return list(DBOS.list_workflow_steps(workflow_id))
