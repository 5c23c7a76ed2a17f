"""The materialized views: ``project`` (catch up, or ``--follow`` the log) and ``rebuild`` (aside,
then swapped in). ``verify`` compares them with a rebuild (``_maintenance``)."""

from __future__ import annotations

import argparse
import difflib
import signal
import threading
from collections.abc import Sequence
from typing import Any

from rich.console import Console

from kernel import EventStore, StepLogError
from projections import VIEW_NAMES, Projector
from projections._frontend._points import UsageError
from projections._frontend._safe import SafeConsole
from projections.cli._json import emit
from projections.cli._progress import progress_bar
from projections.cli.commands import Command

__all__ = ["COMMANDS", "add_commands", "views_named"]


def add_commands(commands: Any) -> None:
    """The ``project`` and ``rebuild`` subcommands."""
    project = commands.add_parser("project", help="catch the materialized views up with the log")
    project.add_argument("--views", default=",".join(VIEW_NAMES), help="comma-separated views")
    project.add_argument("--follow", action="store_true", help="keep following until interrupted")
    rebuild = commands.add_parser("rebuild", help="rebuild views aside and swap them in")
    rebuild.add_argument(
        "views", nargs="*", metavar="VIEW", help=f"{', '.join(VIEW_NAMES)} (default: all)"
    )


def _project(store: EventStore, args: argparse.Namespace, console: Console) -> int:
    names = [n.strip() for n in args.views.split(",") if n.strip()]
    unknown = sorted(set(names) - set(VIEW_NAMES))
    if unknown:
        raise UsageError(f"unknown views {unknown}; choose from {', '.join(VIEW_NAMES)}")
    projector = Projector(store, names)
    if not args.follow:
        projector.catch_up()
        if args.json:
            emit({"views": {name: {"position": projector.position(name)} for name in names}})
            return 0
        for name in names:
            console.print(f"{name}: at global position {projector.position(name)}")
        return 0
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    console.print(f"following {store.url} into {', '.join(names)} (Ctrl-C stops)", markup=False)
    errors = SafeConsole(stderr=True, highlight=False)

    def waiting(error: StepLogError, delay: float) -> None:
        text = " ".join(str(error).split())
        errors.print(f"steplog: retrying in {delay:.1f} s: {text}", markup=False, soft_wrap=True)

    projector.follow(stop, on_retry=waiting)
    return 0


def _rebuild(store: EventStore, args: argparse.Namespace, console: Console) -> int:
    """Rebuild the named views (every view when none is named) aside, one by one, and swap each
    in; with a progress bar on a terminal."""
    names = views_named(args.views) or list(VIEW_NAMES)
    done: dict[str, dict[str, int]] = {}
    for name in names:
        projector = Projector(store, [name])
        with progress_bar(f"rebuilding {name}", store.last_position()) as progress:
            folded = projector.rebuild(name, progress=progress)
        done[name] = {"position": projector.position(name), "folded": folded}
        if not args.json:
            console.print(
                f"{name}: rebuilt up to global position {done[name]['position']} "
                f"({folded} events folded)"
            )
    if args.json:
        emit({"views": done})
    return 0


def views_named(named: Sequence[str]) -> list[str]:
    unknown = sorted(set(named) - set(VIEW_NAMES))
    if unknown:
        close = difflib.get_close_matches(unknown[0], VIEW_NAMES, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UsageError(f"unknown views {unknown}{hint}; choose from {', '.join(VIEW_NAMES)}")
    return list(dict.fromkeys(named))


COMMANDS: dict[str, Command] = {"project": _project, "rebuild": _rebuild}
