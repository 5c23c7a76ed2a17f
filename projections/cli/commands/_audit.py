"""Audit and time travel of one instance: ``state`` (now or at a point), ``history`` (its runs
and supersteps), ``blame`` (every write of a key and whether it counted), ``diff`` (between two
points) and ``bisect`` (the first superstep after which a key has a value). Each answer is a
fold's (``projections``); values of sensitive keys are shown redacted unless ``--reveal``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

from kernel import DecodeError, EventStore, ValueCodec
from projections import (
    AtPosition,
    RunHistory,
    bisect,
    blame_keys,
    diff_points,
    forks_of,
    state_at,
)
from projections._frontend._ids import closest, written_keys
from projections._frontend._points import UsageError, point_in, points_of
from projections._frontend._render import (
    bisect_document,
    blame_table,
    history_document,
    history_rest_tables,
    history_runs_table,
    history_title,
    print_paged,
    show_time,
    show_value,
)
from projections._frontend._safe import cell, json_text, visible
from projections.cli._json import emit
from projections.cli._runstream import continuations, stream_history, with_continuations
from projections.cli._status import EXIT_PROBLEM
from projections.cli.commands import Command
from projections.cli.commands._reading import redactor, require_events, sensitivity_options

__all__ = ["COMMANDS", "add_commands"]


def add_commands(commands: Any) -> None:
    """The ``state``, ``history``, ``blame``, ``diff`` and ``bisect`` subcommands."""
    state = commands.add_parser("state", help="committed state, now or at a POINT")
    state.add_argument("instance")
    state.add_argument("point", nargs="?", help="pos:N, step:ID, run:RUN:K, time:ISO, inside:ID")
    state.add_argument("--key", action="append", default=[], metavar="K", help="only key K")
    history = commands.add_parser("history", help="runs of an instance and their supersteps")
    history.add_argument("instance")
    blame = commands.add_parser("blame", help="every write of a key and whether it counted")
    blame.add_argument("instance")
    blame.add_argument("key")
    changes = commands.add_parser("diff", help="keys added, removed, changed between two points")
    changes.add_argument("instance")
    changes.add_argument("before")
    changes.add_argument("after")
    search = commands.add_parser("bisect", help="first superstep after which KEY has a value")
    search.add_argument("instance")
    search.add_argument("--key", required=True)
    wanted = search.add_mutually_exclusive_group()
    wanted.add_argument("--equals", default=None, help="a JSON value the key must equal")
    wanted.add_argument("--exists", action="store_true", help="the key has a value (the default)")
    for command in (state, blame, changes, search):
        sensitivity_options(command)


def _state(store: EventStore, args: argparse.Namespace, console: Console) -> int:
    events = require_events(store, args.instance)
    point = (
        point_in(args.point, points_of(events)) if args.point else AtPosition(events[-1].position)
    )
    at = redactor(store, args, events).state(state_at(events, point))
    values = at.values
    if args.key:
        missing = [k for k in args.key if k not in values]
        if missing:
            hint = closest(missing[0], values)
            raise UsageError(
                f"key {missing[0]!r} has no value in {args.instance!r} ({at.label}){hint}"
            )
        values = {k: values[k] for k in args.key}
    if args.json:
        sys.stdout.write(json_text(values, orjson.OPT_SORT_KEYS) + "\n")
        return 0
    table = Table(title=cell(f"{args.instance}: {at.label}"))
    table.add_column("key")
    table.add_column("value (JSON)", overflow="fold")
    for key in sorted(values):
        table.add_row(cell(key), cell(show_value(values[key], hint="--json shows it whole")))
    console.print(table)
    return 0


def _history(store: EventStore, args: argparse.Namespace, console: Console) -> int:
    """Folded window by window (the events are never all in memory); the runs table is printed
    page by page as the runs end, the other tables once everything is folded."""
    if store.version(args.instance) == 0:
        raise UsageError(f"no instance {args.instance!r} in {store.url}")
    history = RunHistory(forks=forks_of(store, args.instance))
    runs = stream_history(store, history, args.instance)
    if args.json:
        for _ in runs:
            pass
        emit(history_document(history, args.instance))
        return 0
    later = continuations(store, args.instance)
    print_paged(  # (the title is made with the first page: a fork's first event is folded then)
        console,
        (with_continuations(run, later) for run in runs),
        lambda page, first: history_runs_table(
            page,
            history_title(history, args.instance) if first else None,
            header=first,
            continued_by=later,
        ),
    )
    for table in history_rest_tables(history, args.instance):
        console.print(table)
    return 0


def _blame(store: EventStore, args: argparse.Namespace, console: Console) -> int:
    blame = redactor(store, args).blame(blame_keys(store, args.instance, [args.key]))
    if not blame.writes(args.key):
        hint = closest(args.key, written_keys(store, args.instance))
        raise UsageError(f"key {args.key!r} was never written in {args.instance!r}{hint}")
    if args.json:
        writes = [w.model_dump(mode="json") for w in blame.writes(args.key)]
        emit({"instance_id": args.instance, "key": args.key, "writes": writes})
        return 0
    console.print(blame_table(blame, args.key, args.instance))
    return 0


def _diff(store: EventStore, args: argparse.Namespace, console: Console) -> int:
    events = require_events(store, args.instance)
    log = points_of(events)
    before, after = point_in(args.before, log), point_in(args.after, log)
    changes = redactor(store, args, events).diff(diff_points(events, before, after))
    if args.json:
        emit(
            {
                "instance_id": args.instance,
                "before": args.before,
                "after": args.after,
                "added": changes.added,
                "removed": changes.removed,
                "changed": {k: {"old": c.old, "new": c.new} for k, c in changes.changed.items()},
            }
        )
        return 0
    table = Table(title=cell(f"{args.instance}: {args.before} -> {args.after}"))
    for column in ("key", "change", "before", "after"):
        table.add_column(column, overflow="fold")
    for key, value in sorted(changes.added.items()):
        table.add_row(cell(key), "[green]added[/]", "", cell(show_value(value)))
    for key, value in sorted(changes.removed.items()):
        table.add_row(cell(key), "[red]removed[/]", cell(show_value(value)), "")
    for key, change in sorted(changes.changed.items()):
        old, new = cell(show_value(change.old)), cell(show_value(change.new))
        table.add_row(cell(key), "[yellow]changed[/]", old, new)
    console.print(table if changes else "no difference")
    return 0


def _bisect(store: EventStore, args: argparse.Namespace, console: Console) -> int:
    events = require_events(store, args.instance)
    key = args.key
    hidden = key in redactor(store, args, events)
    if args.equals is None:
        predicate: Callable[[Mapping[str, Any]], bool] = lambda state: key in state  # noqa: E731
        wanted = f"{key!r} has a value"
    elif hidden:
        raise UsageError(
            f"key {key!r} of {args.instance!r} is sensitive: --equals would reveal its value by "
            "probing; add --reveal to compare it"
        )
    else:
        try:
            expected = ValueCodec().decode(orjson.loads(args.equals), what="--equals")
        except (orjson.JSONDecodeError, DecodeError) as error:
            raise UsageError(f"--equals must be JSON, got {args.equals!r}: {error}") from error
        predicate = lambda state: key in state and state[key] == expected  # noqa: E731
        wanted = f"{key!r} == {args.equals}"
    found = bisect(events, predicate)
    if args.json:
        emit(
            {
                "instance_id": args.instance,
                "key": key,
                "condition": {"exists": True} if args.equals is None else {"equals": args.equals},
                "found": None if found is None else bisect_document(found),
            }
        )
        return EXIT_PROBLEM if found is None else 0
    if found is None:
        console.print(
            visible(f"never: no committed superstep of {args.instance} has {wanted}"), markup=False
        )
        return EXIT_PROBLEM
    if found.origin_instance is not None:
        console.print(
            visible(
                f"true from the start of the fork: {wanted} in the values forked from "
                f"{found.origin_instance} (checkpoint {found.superstep_id} of run "
                f"{found.run_id}), log position {found.position}, at {show_time(found.timestamp)}"
            ),
            markup=False,
        )
        return 0
    console.print(
        visible(
            f"first true after superstep {found.index} ({found.superstep_id}) of run "
            f"{found.run_id}, log position {found.position}, at {show_time(found.timestamp)}: "
            f"{wanted}"
        ),
        markup=False,
    )
    return 0


COMMANDS: dict[str, Command] = {
    "state": _state,
    "history": _history,
    "blame": _blame,
    "diff": _diff,
    "bisect": _bisect,
}
