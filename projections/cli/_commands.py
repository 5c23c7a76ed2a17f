"""The ``steplog`` command: the demo, audit and time travel over a store (docs/cli.md).

    steplog demo                       the stale-write scenario on SQLite, shown from the log; then
                                       a run killed, recovered and resumed, and a fork
    steplog instances                  list workflow instances
    steplog log INSTANCE               every event of an instance
    steplog state INSTANCE [POINT]     its committed state, now or at a point
    steplog history INSTANCE           its runs, supersteps, pending requests and lineage
    steplog blame INSTANCE KEY         every write of a key, and whether it counted
    steplog diff INSTANCE POINT POINT  keys added, removed and changed between two points
    steplog bisect INSTANCE --key K    the first superstep after which a key has a value
    steplog project [--follow]         keep the materialized views caught up
    steplog rebuild VIEW | verify VIEW rebuild a view aside and swap it in; compare with a rebuild
    steplog recover [INSTANCE]         close runs left open by dead processes; say what was closed

A POINT is ``pos:N``, ``step:SUPERSTEP``, ``run:RUN:INDEX``, ``time:ISO-8601`` or
``inside:SUPERSTEP`` (ids may be shortened to a unique prefix).

Every command takes ``--store URL`` (default ``$STEPLOG_STORE``, else ``sqlite:///steplog.db``).
Only ``demo``, ``project`` and ``rebuild`` may create a store; the others (``recover`` too, though
it writes) refuse a store that does not exist, and create nothing.

Exit status: 0 on success, 1 when a command finds a problem (the demo finding a leak), 2 for bad
input (unknown instance, bad URL), 3 when the store is missing or cannot be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kernel import (
    DEFAULT_STORE_ENV,
    DecodeError,
    EventBase,
    EventStore,
    StepLogError,
    StoreUnavailableError,
    ValueCodec,
    open_store,
    recover,
    uuid_ids,
)
from projections import (
    VIEW_NAMES,
    AtPosition,
    Projector,
    bisect,
    blame_keys,
    diff_points,
    fold_blame,
    history_of,
    state_at,
)
from projections.cli._demo import run_demo
from projections.cli._demo_recovery import run_recovery_act
from projections.cli._points import UsageError, parse_point
from projections.cli._render import (
    blame_table,
    event_line,
    events_table,
    history_tables,
    recovered_json,
    recovered_table,
    show_json,
    show_time,
    verdicts,
)

__all__ = ["COMMANDS", "EXIT_BAD_INPUT", "EXIT_PROBLEM", "EXIT_STORE", "WRITING_COMMANDS", "main"]

CLI_DEFAULT_STORE = "sqlite:///steplog.db"
EXIT_PROBLEM = 1
"""A command found a problem: the demo found a leak, ``verify`` a difference, ``bisect`` nothing."""
EXIT_BAD_INPUT = 2
"""Bad input: an unknown instance, key, view or point, a bad store URL, a log it cannot read."""
EXIT_STORE = 3
"""The store does not exist (a reading command never creates one) or cannot be reached."""
WRITING_COMMANDS = frozenset({"demo", "project", "rebuild"})
"""The commands that may create the store (they write to it). ``recover`` writes too, but only to
a store that exists: a missing one is ``EXIT_STORE``, and nothing is created."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="steplog", description="Audit, time travel and replay of steplog workflow logs."
    )
    parser.add_argument(
        "--store",
        default=None,
        help=f"store URL (default: ${DEFAULT_STORE_ENV}, else {CLI_DEFAULT_STORE})",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = commands.add_parser("demo", help="run the stale-write bug scenario; show nothing leaked")
    demo.add_argument("--instance", default=None, help="instance id (default: a fresh one)")
    commands.add_parser("instances", help="list workflow instances in the store")
    log = commands.add_parser("log", help="show every event of an instance")
    log.add_argument("instance")
    log.add_argument("--json", action="store_true", help="one JSON object per line")
    state = commands.add_parser("state", help="committed state, now or at a POINT")
    state.add_argument("instance")
    state.add_argument("point", nargs="?", help="pos:N, step:ID, run:RUN:K, time:ISO, inside:ID")
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
    search.add_argument("--equals", default=None, help="a JSON value the key must equal")
    project = commands.add_parser("project", help="catch the materialized views up with the log")
    project.add_argument("--views", default=",".join(VIEW_NAMES), help="comma-separated views")
    project.add_argument("--follow", action="store_true", help="keep following until interrupted")
    for name, text in (
        ("rebuild", "rebuild a view aside and swap it in"),
        ("verify", "compare a view with a rebuild"),
    ):
        command = commands.add_parser(name, help=text)
        command.add_argument("view", choices=VIEW_NAMES)
    recovery = commands.add_parser(
        "recover", help="close runs left open by dead processes (aborted as crashed)"
    )
    recovery.add_argument("instance", nargs="?", help="one instance (default: every instance)")
    recovery.add_argument("--json", action="store_true", help="a JSON list of the closed runs")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The ``steplog`` console script. Exit status: 0 ok, 1 a problem found (``EXIT_PROBLEM``),
    2 bad input (``EXIT_BAD_INPUT``), 3 the store is missing or unreachable (``EXIT_STORE``)."""
    args = _parser().parse_args(argv)
    console = Console(highlight=False)
    url = args.store or os.environ.get(DEFAULT_STORE_ENV) or CLI_DEFAULT_STORE
    args.store_url = url  # for the demo's child process, which opens the same store
    try:
        with open_store(url, create=args.command in WRITING_COMMANDS) as store:
            return COMMANDS[args.command](store, args, console)
    except StoreUnavailableError as error:
        _complain(error)
        return EXIT_STORE
    except StepLogError as error:
        _complain(error)
        return EXIT_BAD_INPUT


def _complain(error: StepLogError) -> None:
    """One line on standard error (never wrapped: scripts grep it)."""
    text = " ".join(str(error).split())
    Console(stderr=True, highlight=False).print(
        f"[bold red]steplog:[/] {escape(text)}", soft_wrap=True
    )


# -- demo and raw log ------------------------------------------------------------------------


def _demo(store: EventStore, args: argparse.Namespace, console: Console) -> int:
    instance_id = args.instance or f"orders-{uuid_ids()[:8]}"
    console.rule("[bold]steplog demo: the stale-write bug (Agent Framework #7859)")
    console.print(
        "Run 1: the handler stages [bold]secret[/] and then raises.\n"
        "Run 2: the same workflow object runs again and succeeds.\n"
        "Upstream, run 2 committed run 1's pending write. Here is what steplog's log says.\n"
    )
    wf, outcome = asyncio.run(run_demo(store, instance_id))
    console.print(f"store: {escape(store.url)}   instance: [bold]{escape(instance_id)}[/]")
    console.print(f"run 1 raised: [red]{outcome.first_error}[/]")
    console.print(f"run 2 outputs: {outcome.second_outputs}\n")
    events = wf.events()
    blame = fold_blame(events)
    console.print(events_table(events, blame, title=f"the log of {instance_id}"))
    console.print(f"\ncommitted state: {outcome.committed_state}\n")
    console.print(blame_table(blame, "secret", instance_id))
    if outcome.leaked:
        console.print("[bold red]LEAK: 'secret' is in committed state[/]")
        return EXIT_PROBLEM
    console.print(
        "[bold green]nothing leaked:[/] the write of 'secret' is in the log, its superstep was "
        "aborted (failed), and no commit exists for it."
    )
    return _demo_recovery(store, args.store_url, f"{instance_id}-recovery", console)


def _demo_recovery(store: EventStore, url: str, instance_id: str, console: Console) -> int:
    """The second act: a run killed mid-superstep, recovered, resumed; then a fork."""
    console.rule("[bold]act 2: a run killed mid-superstep, recovered and resumed; then a fork")
    if store.url.startswith("memory"):
        console.print("skipped: a memory store cannot be shared with the process that is killed")
        return 0
    console.print(
        "A child process runs a four-stage order pipeline and is killed (SIGKILL) in superstep 3, "
        "after staging its writes. steplog recovers the instance, resumes the run from its last "
        "checkpoint in this process, and compares with an uninterrupted run. Then it forks the "
        "instance at the first checkpoint and runs the fork with a changed order.\n"
    )
    outcome = asyncio.run(run_recovery_act(store, url, instance_id))
    console.print(f"instance: [bold]{escape(instance_id)}[/]")
    console.print(f"child process killed by signal {outcome.killed_by}")
    for closed in outcome.recovered:
        console.print(f"recovered (superstep aborted as crashed): {escape(closed)}")
    console.print(f"resumed run outputs: {escape(str(outcome.resumed_outputs))}")
    console.print(f"committed state: {escape(str(outcome.resumed_state))}\n")
    console.print(blame_table(fold_blame(store.read(instance_id)), "total", instance_id))
    console.print(
        f"fork [bold]{escape(outcome.fork_id)}[/] (quantity 5 from the second stage): "
        f"{escape(str(outcome.fork_state))}"
    )
    fine = (
        outcome.killed_by == signal.SIGKILL
        and len(outcome.recovered) == 1
        and outcome.same_as_uninterrupted
        and outcome.origin_unchanged
    )
    if not fine:
        console.print("[bold red]PROBLEM: the resumed run differs, or the origin changed[/]")
        return EXIT_PROBLEM
    console.print(
        "[bold green]same result as an uninterrupted run[/], and the fork left its origin as it "
        "was."
    )
    return 0


def _instances(store: EventStore, args: argparse.Namespace, console: Console) -> int:
    for instance in store.instances():
        console.print(instance, markup=False)
    return 0


def _require_events(store: EventStore, instance: str) -> list[EventBase]:
    events = store.read(instance)
    if not events:
        raise UsageError(f"no instance {instance!r} in {store.url}")
    return events


def _log(store: EventStore, args: argparse.Namespace, console: Console) -> int:
    events = _require_events(store, args.instance)
    blame = fold_blame(events)
    if args.json:
        fates = verdicts(blame)
        for event in events:
            sys.stdout.write(event_line(event, fates.get(event.position)) + "\n")
        return 0
    console.print(events_table(events, blame, title=escape(f"the log of {args.instance}")))
    return 0


# -- audit and time travel -------------------------------------------------------------------


def _state(store: EventStore, args: argparse.Namespace, console: Console) -> int:
    events = _require_events(store, args.instance)
    point = parse_point(args.point, events) if args.point else AtPosition(events[-1].position)
    at = state_at(events, point)
    table = Table(title=escape(f"{args.instance}: {at.label}"))
    table.add_column("key")
    table.add_column("value (JSON)", overflow="fold")
    for key in sorted(at.values):
        table.add_row(escape(key), escape(show_json(at.values[key])))
    console.print(table)
    return 0


def _history(store: EventStore, args: argparse.Namespace, console: Console) -> int:
    _require_events(store, args.instance)
    for table in history_tables(history_of(store, args.instance), args.instance):
        console.print(table)
    return 0


def _blame(store: EventStore, args: argparse.Namespace, console: Console) -> int:
    if store.version(args.instance) == 0:
        raise UsageError(f"no instance {args.instance!r} in {store.url}")
    blame = blame_keys(store, args.instance, [args.key])
    if not blame.writes(args.key):
        raise UsageError(f"key {args.key!r} was never written in {args.instance!r}")
    console.print(blame_table(blame, args.key, args.instance))
    return 0


def _diff(store: EventStore, args: argparse.Namespace, console: Console) -> int:
    events = _require_events(store, args.instance)
    changes = diff_points(events, parse_point(args.before, events), parse_point(args.after, events))
    table = Table(title=escape(f"{args.instance}: {args.before} -> {args.after}"))
    for column in ("key", "change", "before", "after"):
        table.add_column(column, overflow="fold")
    for key, value in sorted(changes.added.items()):
        table.add_row(escape(key), "[green]added[/]", "", escape(show_json(value)))
    for key, value in sorted(changes.removed.items()):
        table.add_row(escape(key), "[red]removed[/]", escape(show_json(value)), "")
    for key, change in sorted(changes.changed.items()):
        old, new = escape(show_json(change.old)), escape(show_json(change.new))
        table.add_row(escape(key), "[yellow]changed[/]", old, new)
    console.print(table if changes else "no difference")
    return 0


def _bisect(store: EventStore, args: argparse.Namespace, console: Console) -> int:
    events = _require_events(store, args.instance)
    key = args.key
    if args.equals is None:
        predicate: Callable[[Mapping[str, Any]], bool] = lambda state: key in state  # noqa: E731
        wanted = f"{key!r} has a value"
    else:
        try:
            expected = ValueCodec().decode(orjson.loads(args.equals), what="--equals")
        except (orjson.JSONDecodeError, DecodeError) as error:
            raise UsageError(f"--equals must be JSON, got {args.equals!r}: {error}") from error
        predicate = lambda state: key in state and state[key] == expected  # noqa: E731
        wanted = f"{key!r} == {args.equals}"
    found = bisect(events, predicate)
    if found is None:
        console.print(
            f"never: no committed superstep of {args.instance} has {wanted}", markup=False
        )
        return EXIT_PROBLEM
    if found.origin_instance is not None:
        console.print(
            f"true from the start of the fork: {wanted} in the values forked from "
            f"{found.origin_instance} (checkpoint {found.superstep_id} of run {found.run_id}), "
            f"log position {found.position}, at {show_time(found.timestamp)}",
            markup=False,
        )
        return 0
    console.print(
        f"first true after superstep {found.index} ({found.superstep_id}) of run {found.run_id}, "
        f"log position {found.position}, at {show_time(found.timestamp)}: {wanted}",
        markup=False,
    )
    return 0


# -- materialized views ----------------------------------------------------------------------


def _project(store: EventStore, args: argparse.Namespace, console: Console) -> int:
    names = [n.strip() for n in args.views.split(",") if n.strip()]
    unknown = sorted(set(names) - set(VIEW_NAMES))
    if unknown:
        raise UsageError(f"unknown views {unknown}; choose from {', '.join(VIEW_NAMES)}")
    projector = Projector(store, names)
    if not args.follow:
        projector.catch_up()
        for name in names:
            console.print(f"{name}: at global position {projector.position(name)}")
        return 0
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    console.print(f"following {store.url} into {', '.join(names)} (Ctrl-C stops)", markup=False)
    projector.follow(stop)
    return 0


def _rebuild(store: EventStore, args: argparse.Namespace, console: Console) -> int:
    projector = Projector(store, [args.view])
    folded = projector.rebuild(args.view)
    console.print(
        f"{args.view}: rebuilt up to global position {projector.position(args.view)} "
        f"({folded} events folded)"
    )
    return 0


def _verify(store: EventStore, args: argparse.Namespace, console: Console) -> int:
    report = Projector(store, [args.view]).verify(args.view)
    if report.ok:
        console.print(f"{args.view}: the live view equals a rebuild from the log")
        return 0
    console.print(f"[bold red]{args.view}: the live view differs from a rebuild[/]")
    console.print(report, markup=False)
    return EXIT_PROBLEM


def _recover(store: EventStore, args: argparse.Namespace, console: Console) -> int:
    if args.instance is not None and store.version(args.instance) == 0:
        raise UsageError(f"no instance {args.instance!r} in {store.url}")
    closed = recover(store, args.instance)
    if args.json:
        sys.stdout.write(recovered_json(closed) + "\n")
    elif closed:
        console.print(recovered_table(closed))
    else:
        console.print("nothing to recover", markup=False)
    return 0


COMMANDS: dict[str, Callable[[EventStore, argparse.Namespace, Console], int]] = {
    "demo": _demo,
    "instances": _instances,
    "log": _log,
    "state": _state,
    "history": _history,
    "blame": _blame,
    "diff": _diff,
    "bisect": _bisect,
    "project": _project,
    "rebuild": _rebuild,
    "verify": _verify,
    "recover": _recover,
}


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
