"""How the ``steplog`` command shows events, writes and verdicts (rich tables and JSON lines).

Whether a write counted is never decided here: it is the blame fold's ``WriteRecord.status``
(the kernel's commit rule, through ``SuperstepTracker``), so ``log``, ``blame`` and
``fold_committed`` always agree.

Every piece of stored text goes into a table through ``_safe.cell`` (control characters shown
escaped, markup never applied), and every value as JSON through ``show_json``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

import orjson
from rich.console import Console
from rich.table import Table

from kernel import (
    KEYS_ENV,
    DecodeError,
    EventBase,
    LogIntegrityError,
    MessageStaged,
    MissingKeyError,
    RecoveredRun,
)
from projections import BisectResult, KeyBlame, RunHistory, RunRecord, WriteStatus
from projections._folds._runrecords import closer_label, status_text
from projections._frontend._safe import cell, json_safe, json_text
from projections._views._manifest import VIEW_MISMATCH

__all__ = [
    "LOG_PAGE",
    "bisect_document",
    "blame_table",
    "broken_chain_text",
    "counts",
    "cut_text",
    "event_document",
    "events_table",
    "history_document",
    "history_rest_tables",
    "history_runs_table",
    "history_tables",
    "history_title",
    "log_table",
    "print_paged",
    "read_error_text",
    "recovered_json",
    "recovered_table",
    "run_document",
    "show_json",
    "show_time",
    "show_value",
    "verdicts",
]

SHOWN_CHARS = 400
"""The most characters of a value, an error message or request data a table cell shows: a longer
one is cut, with its length, so that every command's output is linear in what it shows (rich
folds a long cell in time quadratic in its length)."""

T = TypeVar("T")
_SKIP = {"type", "instance_id", "position", "timestamp", "schema_version", "run_id", "owner"}
_COUNTED: frozenset[WriteStatus] = frozenset({"committed", "superseded"})


def broken_chain_text(error: LogIntegrityError, *, also: str = "") -> str:
    """What a reader that met a broken chain says (the CLI's one line, the UI's error page): the
    first bad place (``'orders'#11 (edited)``), the error, where every problem is listed, and
    ``also`` (another way on, when the reader has one). A view that no longer matches the log
    is not a broken chain: its own error says so, and how to rebuild the view."""
    if error.kind == VIEW_MISMATCH:
        return str(error)
    if error.kind == "reused":  # the chain holds; the log's own records do not agree
        return f"the log does not hold together at {error.instance_id!r}#{error.position}: {error}"
    where = (
        f"the hash chain is broken at {error.instance_id!r}#{error.position} "
        f"({error.kind or 'malformed'})"
        if error.instance_id
        else "the log was altered"
    )
    return f"{where}: {error}; 'steplog verify' lists every problem" + (f", {also}" if also else "")


def read_error_text(error: DecodeError) -> str:
    """What a reader that met a row it cannot read says (the CLI's one line, the UI's error
    page). A sealed row whose key was not given (``MissingKeyError``): where, which key it needs
    and which were given (fingerprints, never keys), and how to give it: ``$STEPLOG_KEYS`` or
    ``--keys-file``. Neither is evidence that the log was altered, and the text never says so.
    Any other ``DecodeError``: a row that is damaged or written by another program."""
    if isinstance(error, MissingKeyError):
        if error.where is None:
            return str(error)
        needs = f" with key {error.key}" if error.key else ""
        if error.given:
            why = (
                f"which is not among the keys given ({', '.join(error.given)}): wrong or "
                "missing key"
            )
        else:
            why = "and no key was given"
        return (
            f"{error.where} is encrypted{needs}, {why}; give its key ({KEYS_ENV}=... or "
            "--keys-file FILE)"
        )
    return (
        f"{error}; the row is damaged or was written by another program: nothing was "
        "changed; 'steplog verify' lists every unreadable row, and a backup restores it"
    )


def counts(status: WriteStatus) -> bool | None:
    """Whether a write with ``status`` counted: True, False, or None while it is ``pending``."""
    if status == "pending":
        return None
    return status in _COUNTED


def verdicts(blame: KeyBlame) -> dict[int, WriteStatus]:
    """The status of every write of ``blame``, by stream position (the values a fork started
    with are not writes of any event of the log: they are left out)."""
    return {
        w.position: w.status
        for key in blame.written_keys()
        for w in blame.writes(key)
        if not w.from_fork
    }


def events_table(
    events: list[EventBase],
    blame: KeyBlame,
    *,
    title: str,
) -> Table:
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
        fate = "" if status is None else _fate(status)
        table.add_row(
            str(event.position),
            cell(str(getattr(event, "run_id", ""))[:8]),
            event.type,
            cell(_details(data)),
            fate,
        )
    return table


_DROP_FATES = {"committed": "[red]dropped[/]", "aborted": "[red]no (aborted)[/]"}
_DROP_TEXT = {
    "no_edges": "its sender has no outgoing edge",
    "target_mismatch": "no edge joins its sender to the target it named",
    "type_mismatch": "no connected target handles its type",
}


def _fate(status: WriteStatus) -> str:
    counted = counts(status)
    if counted is None:
        return "[yellow]pending[/]"
    return "[green]yes[/]" if counted else f"[red]no ({status})[/]"


def blame_table(blame: KeyBlame, key: str, instance: str) -> Table:
    """Every write of ``key``: position, status, run and time, executor, operation, value."""
    table = Table(title=cell(f"blame of {key!r} in {instance}"), expand=True)
    for column in ("#", "counted?", "run / time", "executor", "op"):
        table.add_column(column, no_wrap=True)
    table.add_column("value", overflow="fold", ratio=1)
    for write in blame.writes(key):
        verdict = write.status + (f" ({write.reason})" if write.reason else "")
        colour = "green" if write.status == "committed" else "red"
        writer = cell(write.executor_id)
        if write.from_fork:
            writer = cell(f"the fork from {write.origin_instance} @ pos {write.origin_position}")
        table.add_row(
            str(write.position),
            f"[{colour}]{cell(verdict)}[/]",
            f"{cell(write.run_id[:8])}\n{show_time(write.timestamp)}",
            writer,
            cell(write.op),
            "" if write.op == "delete" else cell(show_value(write.value)),
        )
    return table


def history_tables(history: RunHistory, instance: str) -> list[Table]:
    """The runs (status, times, counts, lineage, error), the supersteps, the requests still
    waiting for a response, and the instance's forks: what ``steplog history`` prints."""
    return [
        history_runs_table(history.runs(), history_title(history, instance)),
        *history_rest_tables(history, instance),
    ]


def history_title(history: RunHistory, instance: str) -> str:
    """The title of ``history``'s runs table."""
    forked = history.forked_from
    title = f"runs of {instance}"
    if forked is not None:
        title += f" (forked from {forked.origin_instance} at position {forked.origin_position})"
    return title


def history_runs_table(
    runs: Iterable[RunRecord],
    title: str | None,
    *,
    header: bool = True,
    continued_by: Mapping[str, Sequence[str]] | None = None,
) -> Table:
    """The runs table of ``history`` (or a page of it: ``title`` None and no ``header`` after
    the first). ``continued_by`` gives the runs continuing each run when the runs are shown
    before the later runs are folded."""
    table = Table(title=None if title is None else cell(title), expand=True, show_header=header)
    for column in ("run", "status", "started / ended", "steps", "ok", "aborted", "lineage"):
        table.add_column(column, no_wrap=column != "lineage")
    table.add_column("error", overflow="fold", ratio=1)
    for run in runs:
        error = cut_text(f"{run.error.type}: {run.error.message}") if run.error else ""
        lineage = []
        if run.continues is not None:
            lineage.append(continues_text(run, width=8))
        later = run.continued_by if continued_by is None else continued_by.get(run.run_id, ())
        if later:
            lineage.append("continued by " + ", ".join(r[:8] for r in later))
        if run.responses:
            lineage.append(f"{len(run.responses)} response(s)")
        if run.closed_by is not None:
            lineage.append(f"closed by {closer_label(run.closed_by)}")
        status = status_text(run.status)
        table.add_row(
            cell(run.run_id[:8]),
            status,
            f"{show_time(run.started_at)}\n{show_time(run.ended_at)}",
            str(run.supersteps),
            str(run.committed),
            str(run.aborted),
            "\n".join(cell(line) for line in lineage),
            cell(error),
        )
    return table


def history_rest_tables(history: RunHistory, instance: str) -> list[Table]:
    """The tables ``history`` prints after the runs: supersteps, messages dropped, requests
    waiting, forks."""
    steps = Table(title="supersteps", expand=True)
    for column in ("run", "#", "superstep", "status", "executors", "keys written", "requests"):
        steps.add_column(column, overflow="fold")
    for step in history.supersteps():
        status = step.status + (f" ({step.reason})" if step.reason else "")
        steps.add_row(
            cell(step.run_id[:8]),
            str(step.index),
            cell(step.superstep_id[:8]),
            cell(status),
            cell(", ".join(step.executors)),
            cell(", ".join(step.keys)),
            cell(", ".join(r[:8] for r in step.requests)),
        )
    tables = [steps]
    dropped = [(step, drop) for step in history.supersteps() for drop in step.dropped]
    if dropped:
        table = Table(title="messages dropped: no edge delivered them", expand=True)
        for column in ("#", "run", "step", "from", "to", "why", "dropped?"):
            table.add_column(column, overflow="fold")
        table.add_column("message (JSON)", overflow="fold", ratio=1)
        for step, drop in dropped:
            fate = _DROP_FATES.get(step.status, "[yellow]pending[/]")
            table.add_row(
                str(drop.position),
                cell(step.run_id[:8]),
                str(step.index),
                cell(drop.source),
                cell(drop.target or ""),
                cell(_DROP_TEXT.get(drop.reason, drop.reason)),
                "yes" if step.status == "committed" else fate,
                cell(show_value(drop.message)),
            )
        tables.append(table)
    forked = history.forked_from
    asked_in_origin = f"{(forked.origin_run or '')[:8]} (origin)" if forked is not None else ""
    pending = [(run.run_id[:8], r) for run in history.runs() for r in run.pending_requests]
    owned = {request.request_id for _, request in pending}
    pending[:0] = [
        (asked_in_origin, r) for r in history.pending_requests() if r.request_id not in owned
    ]
    if pending:
        waiting = Table(title="requests waiting for a response", expand=True)
        for column in ("request", "run", "executor", "response type"):
            waiting.add_column(column, no_wrap=True)
        waiting.add_column("data (JSON)", overflow="fold", ratio=1)
        for asker, request in pending:
            waiting.add_row(
                cell(request.request_id),
                cell(asker),
                cell(request.executor_id),
                cell(request.response_type),
                cell(show_value(request.data)),
            )
        tables.append(waiting)
    forks = history.forks()
    if forks:
        table = Table(title=cell(f"forks of {instance}"), expand=True)
        for column in ("instance", "at position", "checkpoint", "of run", "forked at"):
            table.add_column(column, overflow="fold")
        for fork in forks:
            table.add_row(
                cell(fork.instance_id),
                str(fork.origin_position),
                cell((fork.checkpoint or "")[:8]),
                cell((fork.origin_run or "")[:8]),
                show_time(fork.forked_at),
            )
        tables.append(table)
    return tables


def recovered_table(closed: list[RecoveredRun]) -> Table:
    """The runs ``recover`` closed: instance, run, the superstep aborted as crashed, owner."""
    table = Table(title="closed as crashed", expand=True)
    for column in ("instance", "run", "superstep", "owner"):
        table.add_column(column, overflow="fold")
    for run in closed:
        table.add_row(
            cell(run.instance_id),
            cell(run.run_id),
            cell(run.superstep_id or "(none open)"),
            cell(run.owner),
        )
    return table


def recovered_json(closed: list[RecoveredRun]) -> str:
    """The runs ``recover`` closed as one JSON list (empty when it closed nothing)."""
    return json_text(
        [
            {
                "instance_id": run.instance_id,
                "run_id": run.run_id,
                "superstep_id": run.superstep_id,
                "owner": run.owner,
            }
            for run in closed
        ]
    )


def _details(data: dict[str, Any]) -> str:
    parts = []
    for key, value in data.items():
        if value in (None, [], {}) or key == "durability":
            continue
        if key == "superstep_id":
            parts.append(f"step={str(value)[:8]}")
        elif key == "error":
            parts.append(cut_text(f"error={value['type']}: {value['message']}"))
        else:
            text = show_json(value)
            parts.append(f"{key}={text if len(text) <= 48 else text[:45] + '...'}")
    return " ".join(parts)


def show_json(value: Any) -> str:
    """A JSON tree as compact JSON text, safe on a terminal (``_safe.json_safe``)."""
    return json_safe(orjson.dumps(value).decode())


def show_value(value: Any, *, limit: int = SHOWN_CHARS, hint: str = "") -> str:
    """A JSON tree as compact JSON text for a table cell: whole when it has at most ``limit``
    characters, else its first ``limit`` followed by ``... (N characters in all)`` and ``hint``
    (say, which option prints it whole)."""
    return cut_text(show_json(value), limit=limit, hint=hint)


def cut_text(text: str, *, limit: int = SHOWN_CHARS, hint: str = "") -> str:
    """``text`` whole when it has at most ``limit`` characters, else its first ``limit`` followed
    by ``... (N characters in all)`` and ``hint``: never cut without saying so."""
    if len(text) <= limit:
        return text
    extra = f"; {hint}" if hint else ""
    return f"{text[:limit]}... ({len(text):,} characters in all{extra})"


def show_time(moment: datetime | None) -> str:
    """A time as ``HH:MM:SS.mmm`` (empty for None)."""
    return "" if moment is None else moment.strftime("%H:%M:%S.%f")[:-3]


# -- streamed log pages and JSON documents ------------------------------------------------------

LOG_PAGE = 200
"""Events per table that ``steplog log`` prints (the log is streamed, a table per page)."""


def event_document(event: EventBase, status: WriteStatus | None) -> dict[str, Any]:
    """One event as ``log --json`` prints it: the event's fields; a write's also ``counts`` and
    ``write_status`` (the blame fold's verdict when its superstep was decided)."""
    tree = event.model_dump(mode="json")
    if status is None:
        return tree
    tree["counts"] = counts(status)
    if not _is_drop(event):  # a dropped message's status is its superstep's fate
        tree["write_status"] = status
    return tree


def log_table(
    page: list[tuple[EventBase, WriteStatus | None]], *, title: str, header: bool
) -> Table:
    """One page of ``steplog log``: the events with each write's verdict."""
    table = Table(title=title if header else None, expand=True, show_header=header)
    table.add_column("#", justify="right", no_wrap=True, min_width=5)
    table.add_column("run", no_wrap=True, min_width=8)
    table.add_column("event", no_wrap=True, min_width=20)
    table.add_column("details", overflow="fold", ratio=1)
    table.add_column("counts?", no_wrap=True, min_width=12)
    for event, status in page:
        data = event.model_dump(mode="json", exclude=_SKIP)
        table.add_row(
            str(event.position),
            cell(str(getattr(event, "run_id", ""))[:8]),
            event.type,
            cell(_details(data)),
            "" if status is None else _drop_fate(status) if _is_drop(event) else _fate(status),
        )
    return table


def _is_drop(event: EventBase) -> bool:
    return isinstance(event, MessageStaged) and event.dropped is not None


def _drop_fate(status: WriteStatus) -> str:
    return _DROP_FATES.get(status, "[yellow]pending[/]")


def continues_text(run: RunRecord, *, width: int | None = None) -> str:
    """What ``run`` continues, as ``show`` and ``history`` say it (ids cut to ``width``): the
    run and the checkpoint it went on after, or, without one (``checkpoint`` None), from where
    that run stood before its first superstep (it committed none: a run that only recorded
    responses)."""
    assert run.continues is not None
    cut = slice(None, width)
    if run.checkpoint is not None:
        return f"continues run {run.continues[cut]} after checkpoint {run.checkpoint[cut]}"
    return f"continues run {run.continues[cut]} from its start (it committed no superstep)"


def run_document(run: RunRecord, instance_id: str) -> dict[str, Any]:
    """A run as ``runs``, ``show`` and ``history`` print it in JSON."""
    return {
        "instance_id": instance_id,
        **run.to_row(),
        "continued_by": list(run.continued_by),
        "outputs": list(run.outputs),
    }


def history_document(history: RunHistory, instance_id: str) -> dict[str, Any]:
    """What ``history --json`` prints."""
    forked = history.forked_from
    return {
        "instance_id": instance_id,
        "forked_from": None if forked is None else forked.to_row(),
        "runs": [run_document(run, instance_id) for run in history.runs()],
        "supersteps": [step.to_row() for step in history.supersteps()],
        "pending_requests": [r.to_row() for r in history.pending_requests()],
        "forks": [fork.to_row() for fork in history.forks()],
    }


def bisect_document(found: BisectResult) -> dict[str, Any]:
    """Where ``bisect`` found the condition first true (without the values: a sensitive one
    would show)."""
    return {
        "superstep_id": found.superstep_id,
        "run_id": found.run_id,
        "index": found.index,
        "position": found.position,
        "timestamp": None if found.timestamp is None else found.timestamp.isoformat(),
        "origin_instance": found.origin_instance,
    }


def print_paged(
    console: Console,
    items: Iterable[T],
    table_of: Callable[[list[T], bool], Table],
    *,
    first_page: int = 20,
    page_size: int = LOG_PAGE,
) -> None:
    """Print ``items`` as they come, a table per page: the first of ``first_page`` rows (shown
    at once, however slowly the rest comes), the next of ``page_size``. ``table_of(rows,
    first)`` makes a page's table (``first``: the page with the title and the header)."""
    page: list[T] = []
    first = True
    for item in items:
        page.append(item)
        if len(page) >= (first_page if first else page_size):
            console.print(table_of(page, first))
            page, first = [], False
    if page or first:
        console.print(table_of(page, first))
