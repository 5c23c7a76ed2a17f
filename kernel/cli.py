"""The ``steplog`` command: the demo, and audit of what is in a store.

    steplog demo                      run the stale-write scenario on SQLite and show the log
    steplog instances                 list workflow instances
    steplog log INSTANCE              every event of an instance
    steplog state INSTANCE            its committed state

Every command takes ``--store URL`` (default ``$STEPLOG_STORE``, else ``sqlite:///steplog.db``).
Exit status: 0 on success, 1 when a command finds a problem (the demo finding a leak), 2 for bad
input (unknown instance, bad URL).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

from kernel._errors import StepLogError
from kernel._events import EventBase
from kernel._fold import fold_committed
from kernel._store import DEFAULT_STORE_ENV, EventStore, open_store

__all__ = ["main"]

CLI_DEFAULT_STORE = "sqlite:///steplog.db"
_SKIP = {
    "type",
    "instance_id",
    "position",
    "timestamp",
    "schema_version",
    "run_id",
    "owner",
    "durability",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="steplog", description="Audit and replay steplog workflow logs."
    )
    parser.add_argument(
        "--store",
        default=None,
        help=f"store URL (default: ${DEFAULT_STORE_ENV}, else {CLI_DEFAULT_STORE})",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = commands.add_parser(
        "demo", help="run the stale-write bug scenario and show that nothing leaked"
    )
    demo.add_argument("--instance", default=None, help="instance id (default: a fresh one)")
    commands.add_parser("instances", help="list workflow instances in the store")
    log = commands.add_parser("log", help="show every event of an instance")
    log.add_argument("instance")
    log.add_argument("--json", action="store_true", help="one JSON object per line")
    state = commands.add_parser("state", help="show the committed state of an instance")
    state.add_argument("instance")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``steplog`` console script."""
    args = _parser().parse_args(argv)
    console = Console(highlight=False)
    url = args.store or os.environ.get(DEFAULT_STORE_ENV) or CLI_DEFAULT_STORE
    try:
        with open_store(url) as store:
            handler = _COMMANDS[args.command]
            return handler(store, args, console)
    except StepLogError as error:
        Console(stderr=True, highlight=False).print(f"[bold red]steplog:[/] {error}")
        return 2


def _demo(store: EventStore, args: argparse.Namespace, console: Console) -> int:
    from kernel._clock import uuid_ids
    from kernel._demo import run_demo

    instance_id = args.instance or f"orders-{uuid_ids()[:8]}"
    console.rule("[bold]steplog demo: the stale-write bug (Agent Framework #7859)")
    console.print(
        "Run 1: the handler stages [bold]secret[/] and then raises.\n"
        "Run 2: the same workflow object runs again and succeeds.\n"
        "Upstream, run 2 committed run 1's pending write. Here is what steplog's log says.\n"
    )
    wf, outcome = asyncio.run(run_demo(store, instance_id))
    console.print(f"store: {store.url}   instance: [bold]{instance_id}[/]")
    console.print(f"run 1 raised: [red]{outcome.first_error}[/]")
    console.print(f"run 2 outputs: {outcome.second_outputs}\n")
    console.print(_events_table(wf.events(), title=f"the log of {instance_id}"))
    console.print(f"\ncommitted state: {outcome.committed_state}")
    if outcome.leaked:
        console.print("[bold red]LEAK: 'secret' is in committed state[/]")
        return 1
    console.print(
        "[bold green]nothing leaked:[/] the write of 'secret' is in the log, its superstep was "
        "aborted (failed), and no commit exists for it."
    )
    return 0


def _instances(store: EventStore, args: argparse.Namespace, console: Console) -> int:
    for instance in store.instances():
        console.print(instance)
    return 0


def _require_events(store: EventStore, instance: str) -> list[EventBase]:
    events = store.read(instance)
    if not events:
        raise _UnknownInstance(f"no instance {instance!r} in {store.url}")
    return events


class _UnknownInstance(StepLogError):
    pass


def _log(store: EventStore, args: argparse.Namespace, console: Console) -> int:
    events = _require_events(store, args.instance)
    if args.json:
        for event in events:
            sys.stdout.write(event.model_dump_json() + "\n")
        return 0
    console.print(_events_table(events, title=f"the log of {args.instance}"))
    return 0


def _state(store: EventStore, args: argparse.Namespace, console: Console) -> int:
    events = _require_events(store, args.instance)
    values = fold_committed(events).values
    table = Table(title=f"committed state of {args.instance}")
    table.add_column("key")
    table.add_column("value (JSON)")
    for key in sorted(values):
        table.add_row(key, _json(values[key]))
    console.print(table)
    return 0


def _events_table(events: list[EventBase], *, title: str) -> Table:
    markers = {
        getattr(e, "superstep_id", None): e.type  # type: ignore[attr-defined]
        for e in events
        if e.type in ("superstep_committed", "superstep_aborted")  # type: ignore[attr-defined]
    }
    table = Table(title=title, expand=True)
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("run", no_wrap=True)
    table.add_column("event", no_wrap=True)
    table.add_column("details", overflow="fold", ratio=1)
    table.add_column("counts?", no_wrap=True)
    for event in events:
        data = event.model_dump(mode="json", exclude=_SKIP)
        fate = ""
        if event.type == "state_staged":  # type: ignore[attr-defined]
            outcome = markers.get(event.superstep_id)  # type: ignore[attr-defined]
            fate = "[green]yes[/]" if outcome == "superstep_committed" else "[red]no[/]"
        table.add_row(
            str(event.position),
            str(getattr(event, "run_id", ""))[:8],
            event.type,  # type: ignore[attr-defined]
            _details(data),
            fate,
        )
    return table


def _details(data: dict[str, Any]) -> str:
    parts = []
    for key, value in data.items():
        if value in (None, [], {}):
            continue
        if key == "superstep_id":
            parts.append(f"step={str(value)[:8]}")
        elif key == "error":
            parts.append(f"error={value['type']}: {value['message']}")
        else:
            text = _json(value)
            parts.append(f"{key}={text if len(text) <= 48 else text[:45] + '...'}")
    return " ".join(parts)


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()


_COMMANDS = {"demo": _demo, "instances": _instances, "log": _log, "state": _state}


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
