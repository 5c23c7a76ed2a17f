"""Keeping a store sound: ``verify`` (the hash chain, saved heads, then the views against a
rebuild), ``head`` (an instance's chain head to keep, signed with a key) and ``recover`` (close
the runs of dead processes). Re-sealing with a new key is ``_rekey``'s."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

from kernel import (
    ChainHead,
    ChainReport,
    EventStore,
    LogIntegrityError,
    StepLogError,
    recover,
)
from projections import VIEW_NAMES, Projector, VerifyReport, backend_for, default_views
from projections._frontend._points import UsageError
from projections._frontend._render import recovered_json, recovered_table
from projections._frontend._safe import cell, json_text
from projections.cli._json import emit
from projections.cli._progress import progress_bar
from projections.cli._status import EXIT_BROKEN_CHAIN, EXIT_PROBLEM, complain
from projections.cli.commands import Command
from projections.cli.commands._views import views_named

__all__ = ["COMMANDS", "add_commands"]


def add_commands(commands: Any) -> None:
    """The ``verify``, ``head`` and ``recover`` subcommands."""
    check = commands.add_parser(
        "verify", help="check the log's hash chain, then compare views with a rebuild"
    )
    check.add_argument(
        "views",
        nargs="*",
        metavar="VIEW",
        help=f"views to compare ({', '.join(VIEW_NAMES)}; default: every view built)",
    )
    check.add_argument("--instance", default=None, help="check one instance's chain only")
    check.add_argument(
        "--head",
        action="append",
        default=[],
        metavar="FILE",
        help="a chain head saved by 'steplog head', checked against the log (repeatable)",
    )
    check.add_argument(
        "--sign-key-file", default=None, metavar="FILE", help="check each head's signature"
    )
    head = commands.add_parser("head", help="print an instance's chain head as JSON, to keep")
    head.add_argument("instance")
    head.add_argument(
        "--sign-key-file", default=None, metavar="FILE", help="sign it (HMAC-SHA256) with this key"
    )
    recovery = commands.add_parser(
        "recover", help="close runs left open by dead processes (aborted as crashed)"
    )
    recovery.add_argument("instance", nargs="?", help="one instance (default: every instance)")


def _verify(store: EventStore, args: argparse.Namespace, console: Console) -> int:
    """The hash chain of every instance (or ``--instance``), with any saved heads; then the
    views, unless the chain is broken (``--allow-broken-chain`` compares them anyway)."""
    names = _views_to_verify(store, args.views)
    key = _signing_key(args.sign_key_file)
    heads = [_saved_head(path) for path in args.head]
    if args.instance is not None:
        if store.version(args.instance) == 0 and store.chain_head(args.instance) is None:
            raise UsageError(f"no instance {args.instance!r} in {store.url}")
        for path, head in zip(args.head, heads, strict=True):
            if head.instance_id != args.instance:
                raise UsageError(
                    f"{path} is the chain head of {head.instance_id!r}, not of --instance "
                    f"{args.instance!r}"
                )
    if key is not None:
        for path, head in zip(args.head, heads, strict=True):
            if not head.signed_by(key):
                why = (
                    "carries no signature"
                    if not head.signature
                    else f"has a signature that does not match the key in {args.sign_key_file}: "
                    "the head was altered, or signed with another key"
                )
                complain(
                    LogIntegrityError(
                        f"the chain head in {path} ({head.instance_id!r}#{head.position}) {why}"
                    )
                )
                return EXIT_BROKEN_CHAIN
    with progress_bar("checking the hash chain", store.last_position()) as progress:
        counted = None if progress is None else (lambda events: progress(events, 0))
        report = store.verify_chain(args.instance, heads=heads, progress=counted)
    views: dict[str, VerifyReport] | None = None
    if report.ok or args.allow_broken_chain:
        views = {}
        for name in names:
            with progress_bar(f"verifying {name}", store.last_position()) as progress:
                views[name] = Projector(store, [name]).verify(name, progress=progress)
    if args.json:
        emit(
            {
                "chain": _chain_json(report, args.head, heads, signed=key is not None),
                "views": None if views is None else {n: _view_json(r) for n, r in views.items()},
            }
        )
    else:
        _print_chain(console, report, args.head, heads, signed=key is not None)
        _print_views(console, views, names)
    if not report.ok:
        return EXIT_BROKEN_CHAIN
    if not report.verified:  # events without hashes: nothing checked them
        return EXIT_PROBLEM
    return 0 if views is None or all(r.ok for r in views.values()) else EXIT_PROBLEM


def _views_to_verify(store: EventStore, named: Sequence[str]) -> list[str]:
    """The views named (checked), or every built-in view whose table exists."""
    if named:
        return views_named(named)
    backend = backend_for(store)
    return [spec.name for spec in default_views() if backend.exists(spec.table)]


def _signing_key(path: str | None) -> bytes | None:
    """The key in the file at ``path`` (its bytes, trailing line ends removed), never shown."""
    if path is None:
        return None
    try:
        key = Path(path).read_bytes().rstrip(b"\r\n")
    except OSError as error:
        raise UsageError(f"cannot read the signing key file {path}: {error.strerror}") from None
    if not key:
        raise UsageError(f"the signing key file {path} is empty")
    return key


def _saved_head(path: str) -> ChainHead:
    """The chain head saved in the file at ``path`` (as ``steplog head`` prints it)."""
    try:
        data = orjson.loads(Path(path).read_bytes())
    except OSError as error:
        raise UsageError(f"cannot read the chain head file {path}: {error.strerror}") from None
    except orjson.JSONDecodeError as error:
        raise UsageError(f"the chain head file {path} is not JSON: {error}") from None
    try:
        return ChainHead.from_json(data)
    except StepLogError as error:
        raise UsageError(f"the chain head file {path}: {error}") from None


def _chain_json(
    report: ChainReport, paths: Sequence[str], heads: Sequence[ChainHead], *, signed: bool
) -> dict[str, Any]:
    return {
        "ok": report.ok,
        "verified": report.verified,
        "instances": report.instances,
        "rows": report.rows,
        "events": report.events,
        "unchained_events": report.unchained_events,
        "problems": [
            {
                "instance_id": p.instance_id,
                "position": p.position,
                "kind": p.kind,
                "detail": p.detail,
            }
            for p in report.problems
        ],
        "heads": [
            {
                "file": path,
                "instance_id": head.instance_id,
                "position": head.position,
                "signature": "checked" if signed else ("unchecked" if head.signature else "none"),
            }
            for path, head in zip(paths, heads, strict=True)
        ],
    }


def _view_json(report: VerifyReport) -> dict[str, Any]:
    return {
        "ok": report.ok,
        "position": report.position,
        "log_end": report.log_end,
        "only_live": [list(row) for row in report.only_live],
        "only_rebuilt": [list(row) for row in report.only_rebuilt],
        "different": [list(row) for row in report.different],
    }


def _print_chain(
    console: Console,
    report: ChainReport,
    paths: Sequence[str],
    heads: Sequence[ChainHead],
    *,
    signed: bool,
) -> None:
    for path, head in zip(paths, heads, strict=True):
        signature = (
            "signature checked"
            if signed
            else ("signature not checked: no --sign-key-file" if head.signature else "unsigned")
        )
        console.print(
            f"saved head {head.instance_id!r}#{head.position} from {path} ({signature})",
            markup=False,
            soft_wrap=True,
        )
    unchecked = (
        f"{report.unchained_events} of {report.events} events carry no hashes and could not be "
        "checked: written before the hash chain existed, or rewritten without it by someone "
        "with write access (only a head exported earlier can tell; docs/security.md)"
    )
    if report.verified:
        console.print(
            f"chain ok: {report.instances} instances, {report.events} events (0 before the chain)",
            markup=False,
            soft_wrap=True,
        )
        return
    if report.ok:
        console.print(
            f"chain unchecked: {report.instances} instances, {unchecked}",
            markup=False,
            soft_wrap=True,
        )
        return
    broken = len({p.instance_id for p in report.problems})
    table = Table(
        title=cell(
            f"hash chain broken: {len(report.problems)} problem(s) in {broken} of "
            f"{report.instances} instances"
        )
    )
    for column in ("instance", "position", "kind"):
        table.add_column(column, no_wrap=True)
    table.add_column("detail", overflow="fold", ratio=1)
    for problem in sorted(report.problems, key=lambda p: (p.instance_id, p.position)):
        table.add_row(
            cell(problem.instance_id) if problem.instance_id else "(meta table)",
            str(problem.position),
            f"[bold red]{cell(problem.kind)}[/]",
            cell(problem.detail),
        )
    console.print(table)
    if report.unchained_events:
        console.print(f"also: {unchecked}", markup=False, soft_wrap=True)


def _print_views(
    console: Console, views: dict[str, VerifyReport] | None, names: Sequence[str]
) -> None:
    if views is None:
        if names:
            console.print(
                f"views not compared ({', '.join(names)}): the chain is broken "
                "(--allow-broken-chain compares them anyway)",
                markup=False,
                soft_wrap=True,
            )
        return
    if not views:
        console.print("no materialized views to compare ('steplog project' builds them)")
    for name, report in views.items():
        if report.ok:
            console.print(f"{name}: the live view equals a rebuild from the log")
        else:
            console.print(f"[bold red]{name}: the live view differs from a rebuild[/]")
            if report.log_end is not None:
                console.print(
                    f"{name}: the view has folded the log up to global position "
                    f"{report.position}, but the log now ends at {report.log_end}: events were "
                    "removed from the log's end (a truncated tail) after the view folded them",
                    markup=False,
                    soft_wrap=True,
                )
            console.print(report, markup=False)


def _head(store: EventStore, args: argparse.Namespace, console: Console) -> int:
    """The instance's chain head as JSON, signed with the key in ``--sign-key-file`` if given;
    refused when the instance's chain is broken (a head of an altered log vouches for it)."""
    key = _signing_key(args.sign_key_file)
    if store.version(args.instance) == 0:
        raise UsageError(f"no instance {args.instance!r} in {store.url}")
    problem = store.verify_chain(args.instance).first_problem(args.instance)
    if problem is not None:
        raise problem.error()
    head = store.chain_head(args.instance)
    if head is None:
        raise UsageError(
            f"{args.instance!r} has no chain head: its events were written before the hash chain"
        )
    if key is not None:
        head = head.sign(key)
    option = 0 if args.json else orjson.OPT_INDENT_2
    sys.stdout.write(json_text(head.to_json(), option) + "\n")
    return 0


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


COMMANDS: dict[str, Command] = {"verify": _verify, "head": _head, "recover": _recover}
