"""Looking at what a store holds: ``steplog instances`` and ``steplog log`` (every event of an
instance, streamed window by window, with what each did)."""

from __future__ import annotations

import argparse
import difflib
from typing import Any

from rich.console import Console

from kernel import EVENT_TYPES, EventStore
from projections._frontend._ids import find_run, pick, superstep_ids
from projections._frontend._points import UsageError
from projections._frontend._render import event_document, log_table, print_paged
from projections._frontend._safe import cell, visible
from projections.cli._json import emit, emit_line
from projections.cli._logstream import stream_log
from projections.cli.commands import Command
from projections.cli.commands._reading import redactor, sensitivity_options

__all__ = ["COMMANDS", "add_commands"]


def add_commands(commands: Any) -> None:
    """The ``instances`` and ``log`` subcommands."""
    commands.add_parser("instances", help="list workflow instances in the store")
    log = commands.add_parser("log", help="show the events of an instance, streamed")
    log.add_argument("instance")
    log.add_argument("--run", default=None, metavar="RUN", help="only this run's events")
    log.add_argument(
        "--superstep", default=None, metavar="SUPERSTEP", help="only this superstep's events"
    )
    log.add_argument(
        "--type",
        action="append",
        default=[],
        metavar="TYPE",
        help="only events of this type, e.g. state_staged (repeatable)",
    )
    log.add_argument(
        "--from", dest="start", type=int, default=1, metavar="POS", help="from this position"
    )
    log.add_argument("--limit", type=int, default=None, metavar="N", help="at most N events")
    sensitivity_options(log)


def _instances(store: EventStore, args: argparse.Namespace, console: Console) -> int:
    names = store.instances()
    if args.json:
        emit({"instances": [{"instance_id": n, "events": store.version(n)} for n in names]})
        return 0
    for instance in names:
        console.print(visible(instance), markup=False)
    return 0


def _log(store: EventStore, args: argparse.Namespace, console: Console) -> int:
    """The events, streamed window by window (see ``_logstream``); a table per page."""
    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit must be at least 1, got {args.limit}")
    unknown = sorted(set(args.type) - EVENT_TYPES.keys())
    if unknown:
        close = {t: difflib.get_close_matches(t, list(EVENT_TYPES), n=1) for t in unknown}
        hint = "; ".join(f"{t!r}: did you mean {c[0]!r}?" for t, c in close.items() if c)
        raise UsageError(f"unknown event types {unknown}{'; ' + hint if hint else ''}")
    run = superstep = None
    if args.run is not None:
        run = find_run(store, args.run, args.instance)[1]
    if args.superstep is not None:
        superstep = pick(
            args.superstep, superstep_ids(store, args.instance), "superstep", repr(args.instance)
        )
    stream = stream_log(
        store,
        args.instance,
        redactor(store, args),
        run=run,
        superstep=superstep,
        types=args.type,
        start=args.start,
        limit=args.limit,
    )
    if args.json:
        for event, status in stream:
            emit_line(event_document(event, status))
        return 0
    title = cell(f"the log of {args.instance}")
    print_paged(console, stream, lambda page, first: log_table(page, title=title, header=first))
    return 0


COMMANDS: dict[str, Command] = {"instances": _instances, "log": _log}
