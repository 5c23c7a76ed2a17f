"""The progress bar of the long commands (``rebuild``, ``verify``), on a terminal only."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TaskProgressColumn,
    TextColumn,
    TimeRemainingColumn,
)

from projections._frontend._safe import cell

__all__ = ["progress_bar"]


@contextmanager
def progress_bar(label: str, total: int) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar on standard error when it is a terminal (else None: nothing is shown):
    the events done, their rate and the time left, the bar measured in global positions of the
    log (``total``: the last one)."""
    console = Console(stderr=True)
    if not console.is_terminal:
        yield None
        return
    with Progress(
        SpinnerColumn(),
        TextColumn(cell(label)),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[events]:,} events"),
        TextColumn("{task.fields[rate]}"),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task(label, total=max(total, 1), events=0, rate="")
        started = time.monotonic()

        def update(events: int, position: int) -> None:
            elapsed = max(time.monotonic() - started, 1e-6)
            bar.update(task, completed=position, events=events, rate=f"{events / elapsed:,.0f}/s")

        yield update
