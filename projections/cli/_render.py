"""How the ``steplog`` command shows events, writes and verdicts (rich tables and JSON lines).

Whether a write counted is never decided here: it is the blame fold's ``WriteRecord.status``
(the kernel's commit rule, through ``SuperstepTracker``), so ``log``, ``blame`` and
``fold_committed`` always agree.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import orjson
from rich.markup import escape
from rich.table import Table

from kernel import EventBase
from projections import KeyBlame, WriteStatus

__all__ = [
    "blame_table",
    "counts",
    "event_line",
    "events_table",
    "show_json",
    "show_time",
    "verdicts",
]

_SKIP = {"type", "instance_id", "position", "timestamp", "schema_version", "run_id", "owner"}
_COUNTED: frozenset[WriteStatus] = frozenset({"committed", "superseded"})


def counts(status: WriteStatus) -> bool | None:
    """Whether a write with ``status`` counted: True, False, or None while it is ``pending``."""
    if status == "pending":
        return None
    return status in _COUNTED


def verdicts(blame: KeyBlame) -> dict[int, WriteStatus]:
    """The status of every write of ``blame``, by stream position."""
    return {w.position: w.status for key in blame.written_keys() for w in blame.writes(key)}


def event_line(event: EventBase, status: WriteStatus | None) -> str:
    """One event as a JSON line; a write also gets ``counts`` and ``write_status``."""
    tree = event.model_dump(mode="json")
    if status is not None:
        tree["counts"] = counts(status)
        tree["write_status"] = status
    return orjson.dumps(tree).decode()


def events_table(events: list[EventBase], blame: KeyBlame, *, title: str) -> Table:
    """Every event; the ``counts?`` column shows each write's verdict from ``blame``."""
    fates = verdicts(blame)
    table = Table(title=title, expand=True)
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("run", no_wrap=True)
    table.add_column("event", no_wrap=True)
    table.add_column("details", overflow="fold", ratio=1)
    table.add_column("counts?", no_wrap=True)
    for event in events:
        data = event.model_dump(mode="json", exclude=_SKIP)
        status = fates.get(event.position)
        table.add_row(
            str(event.position),
            str(getattr(event, "run_id", ""))[:8],
            event.type,
            escape(_details(data)),
            "" if status is None else _fate(status),
        )
    return table


def _fate(status: WriteStatus) -> str:
    counted = counts(status)
    if counted is None:
        return "[yellow]pending[/]"
    return "[green]yes[/]" if counted else f"[red]no ({status})[/]"


def blame_table(blame: KeyBlame, key: str, instance: str) -> Table:
    """Every write of ``key``: position, status, run and time, executor, operation, value."""
    table = Table(title=escape(f"blame of {key!r} in {instance}"), expand=True)
    for column in ("#", "counted?", "run / time", "executor", "op"):
        table.add_column(column, no_wrap=True)
    table.add_column("value", overflow="fold", ratio=1)
    for write in blame.writes(key):
        verdict = write.status + (f" ({write.reason})" if write.reason else "")
        colour = "green" if write.status == "committed" else "red"
        table.add_row(
            str(write.position),
            f"[{colour}]{verdict}[/]",
            f"{write.run_id[:8]}\n{show_time(write.timestamp)}",
            escape(write.executor_id),
            write.op,
            "" if write.op == "delete" else escape(show_json(write.value)),
        )
    return table


def _details(data: dict[str, Any]) -> str:
    parts = []
    for key, value in data.items():
        if value in (None, [], {}) or key == "durability":
            continue
        if key == "superstep_id":
            parts.append(f"step={str(value)[:8]}")
        elif key == "error":
            parts.append(f"error={value['type']}: {value['message']}")
        else:
            text = show_json(value)
            parts.append(f"{key}={text if len(text) <= 48 else text[:45] + '...'}")
    return " ".join(parts)


def show_json(value: Any) -> str:
    """A JSON tree as compact JSON text."""
    return orjson.dumps(value).decode()


def show_time(moment: datetime | None) -> str:
    """A time as ``HH:MM:SS.mmm`` (empty for None)."""
    return "" if moment is None else moment.strftime("%H:%M:%S.%f")[:-3]
