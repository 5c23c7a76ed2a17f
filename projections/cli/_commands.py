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
    steplog rebuild VIEW               rebuild a view aside and swap it in
    steplog verify [VIEW...]           check the hash chain, then compare views with a rebuild
    steplog head INSTANCE              print its chain head as JSON (signed with a key), to keep
    steplog recover [INSTANCE]         close runs left open by dead processes; say what was closed
    steplog keygen                     print a new key for encryption at rest
    steplog rekey                      re-seal every row and view document with the first key
    steplog ui                         a read-only time-travel debugger in the browser

A POINT is ``pos:N``, ``step:SUPERSTEP``, ``run:RUN:INDEX``, ``time:ISO-8601`` or
``inside:SUPERSTEP`` (ids may be shortened to a unique prefix).

Every command takes ``--store URL`` (default ``$STEPLOG_STORE``, else ``sqlite:///steplog.db``)
and opens it with the keys of ``--keys-file FILE``, else ``$STEPLOG_KEYS`` (``_keys``).
The commands that show state values (``log``, ``state``, ``blame``, ``diff``, ``bisect``) show
the values of sensitive keys redacted (``{"$t": "redacted"}``): the keys any run of the instance
declared sensitive, and those matching ``--sensitive PATTERN`` (repeatable). ``--reveal`` shows
them; ``bisect --equals`` on a sensitive key needs it.

Only ``demo``, ``project`` and ``rebuild`` may create a store; the others (``recover`` too, though
it writes) refuse a store that does not exist, and create nothing.

Exit status: 0 on success, 1 when a command finds a problem (the demo finding a leak), 2 for bad
input (unknown instance, bad URL), 3 when the store is missing or cannot be reached, 4 when the
log's hash chain is broken (``--allow-broken-chain`` reads it anyway, labelled on stderr), 141
when standard output was closed by its reader (``| head``: quietly).
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TaskProgressColumn,
    TextColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from kernel import (
    DEFAULT_STORE_ENV,
    EVENT_TYPES,
    ChainHead,
    ChainProblem,
    ChainReport,
    DecodeError,
    EventBase,
    EventStore,
    LogIntegrityError,
    SchemaVersionError,
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
    RunHistory,
    SensitiveKeys,
    VerifyReport,
    backend_for,
    bisect,
    blame_keys,
    default_views,
    diff_points,
    fold_blame,
    forks_of,
    sensitive_keys_of,
    state_at,
)
from projections.cli._completion import add_completion_command, completion_command
from projections.cli._demo import demo_instances, free_demo_instance, run_demo
from projections.cli._demo_recovery import run_recovery_act
from projections.cli._durable import DURABLE_COMMANDS, add_durable_commands
from projections.cli._ids import (
    closest,
    find_run,
    instance_id,
    pick,
    superstep_ids,
    written_keys,
)
from projections.cli._json import emit, emit_line, json_text, quiet_console
from projections.cli._keys import (
    add_key_commands,
    add_keys_option,
    keygen,
    keyring_of,
    rekey_command,
    warn_if_plain,
)
from projections.cli._logstream import stream_log
from projections.cli._points import UsageError, point_in, points_of
from projections.cli._render import (
    bisect_document,
    blame_table,
    broken_chain_text,
    event_document,
    events_table,
    history_document,
    history_rest_tables,
    history_runs_table,
    history_title,
    log_table,
    print_paged,
    read_error_text,
    recovered_json,
    recovered_table,
    show_time,
    show_value,
)
from projections.cli._runstream import continuations, stream_history, with_continuations
from projections.cli._safe import SafeConsole, cell, visible
from projections.cli._ui import add_ui_command, ui_command

__all__ = [
    "COMMANDS",
    "EXIT_BAD_INPUT",
    "EXIT_BROKEN_CHAIN",
    "EXIT_CLOSED_PIPE",
    "EXIT_INTERNAL",
    "EXIT_NEWER_SCHEMA",
    "EXIT_PROBLEM",
    "EXIT_STORE",
    "READING_COMMANDS",
    "WRITING_COMMANDS",
    "main",
]

CLI_DEFAULT_STORE = "sqlite:///steplog.db"
EXIT_PROBLEM = 1
"""A command found a problem: the demo found a leak, ``verify`` a difference, ``bisect`` nothing."""
EXIT_BAD_INPUT = 2
"""Bad input: an unknown instance, key, view or point, a bad store URL, a log it cannot read."""
EXIT_STORE = 3
"""The store does not exist (a reading command never creates one) or cannot be reached."""
EXIT_BROKEN_CHAIN = 4
"""The log's hash chain is broken: ``verify`` found a problem (or a saved head's signature does
not match), or a command met one while reading without ``--allow-broken-chain``."""
EXIT_NEWER_SCHEMA = 5
"""The store (its database, or a row) was written by a newer steplog: upgrade steplog."""
EXIT_INTERNAL = 70
"""An unexpected error (a bug): one line on standard error; ``--debug`` shows the traceback."""
EXIT_CLOSED_PIPE = 128 + signal.SIGPIPE
"""Standard output was closed by its reader (``steplog log X | head -1``): the command stopped
quietly, with the status of a Unix tool killed by SIGPIPE (141), and printed nothing more."""
WRITING_COMMANDS = frozenset({"demo", "project", "rebuild"})
"""The commands that may create the store (they write to it). ``recover``, ``respond``, ``fork``
and ``rekey`` write too, but only to a store that exists: a missing one is ``EXIT_STORE``, and
nothing is created."""
_WRITERS = WRITING_COMMANDS | {"recover", "respond", "fork", "rekey", "keygen", "completion"}
_NAMES_AN_INSTANCE = frozenset(
    {"log", "state", "history", "blame", "diff", "bisect", "head", "recover", "runs", "requests",
     "checkpoints", "fork"}
)  # fmt: skip
"""The commands whose ``instance`` names an existing one, or a unique prefix of one. (``verify
--instance`` takes the exact id: an instance deleted whole has no events, only a chain head.)"""


_EPILOG = """\
ids: instance, run, superstep and request ids may be shortened to a unique prefix (an id
  that starts with '-' goes after '--').
points: pos:N, step:SUPERSTEP, run:RUN:INDEX, time:ISO-8601 (with a timezone), inside:SUPERSTEP.
--json: one JSON document on standard output (JSON lines for log and replay), nothing else.
exit status: 0 ok, 1 a problem found, 2 bad input, 3 store missing or unreachable,
  4 hash chain broken, 5 store written by a newer steplog, 70 a bug (--debug shows it),
  141 standard output closed by its reader (as by SIGPIPE: '| head').
See docs/cli.md."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="steplog",
        description="Audit, time travel and replay of steplog workflow logs.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=_EPILOG,
    )
    parser.add_argument(
        "--store",
        default=None,
        help=f"store URL (default: ${DEFAULT_STORE_ENV}, else {CLI_DEFAULT_STORE})",
    )
    parser.add_argument(
        "--allow-broken-chain",
        action="store_true",
        help="read a log whose hash chain is broken anyway (labelled on standard error)",
    )
    parser.add_argument(
        "--debug", action="store_true", help="show a traceback on an error (for bug reports)"
    )
    parser.add_argument("--json", dest="global_json", action="store_true", help="as COMMAND --json")
    add_keys_option(parser)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_key_commands(commands)
    demo = commands.add_parser("demo", help="run the stale-write bug scenario; show nothing leaked")
    demo.add_argument("--instance", default=None, help="instance id (default: a fresh one)")
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
    for command in (log, state, blame, changes, search):
        _sensitivity_options(command)
    project = commands.add_parser("project", help="catch the materialized views up with the log")
    project.add_argument("--views", default=",".join(VIEW_NAMES), help="comma-separated views")
    project.add_argument("--follow", action="store_true", help="keep following until interrupted")
    rebuild = commands.add_parser("rebuild", help="rebuild views aside and swap them in")
    rebuild.add_argument(
        "views", nargs="*", metavar="VIEW", help=f"{', '.join(VIEW_NAMES)} (default: all)"
    )
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
    add_durable_commands(commands)
    add_ui_command(commands)
    add_completion_command(commands)
    for name, command in commands.choices.items():
        if name not in ("completion", "ui"):
            command.add_argument(
                "--json",
                action="store_true",
                help="print one JSON document (JSON lines for log and replay), nothing else",
            )
    return parser


def _sensitivity_options(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--reveal", action="store_true", help="show the values of sensitive keys (not redacted)"
    )
    command.add_argument(
        "--sensitive",
        action="append",
        default=[],
        metavar="PATTERN",
        help="also redact the keys matching PATTERN (a key or an fnmatch glob; repeatable)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """The ``steplog`` console script. Exit status: 0 ok, 1 a problem found (``EXIT_PROBLEM``),
    2 bad input (``EXIT_BAD_INPUT``), 3 the store is missing or unreachable (``EXIT_STORE``),
    4 the log's hash chain is broken (``EXIT_BROKEN_CHAIN``), 5 the store was written by a newer
    steplog (``EXIT_NEWER_SCHEMA``), 70 an unexpected error (``EXIT_INTERNAL``), 141 standard
    output closed by its reader (``EXIT_CLOSED_PIPE``: quietly, nothing more printed)."""
    args = _parser().parse_args(argv)
    try:
        code = (
            completion_command(_parser(), args.shell)  # needs no store
            if args.command == "completion"
            else _run(args)
        )
        sys.stdout.flush()  # here, not at exit: a reader gone meanwhile is a closed pipe too
        return code
    except BrokenPipeError as error:
        if not _stdout_closed():  # (not standard output's pipe: a bug)
            return _unexpected(error, debug=args.debug)
        _stdout_to_devnull()
        return EXIT_CLOSED_PIPE
    except Exception as error:  # the last line of defence: one line, no traceback
        return _unexpected(error, debug=args.debug)


def _unexpected(error: Exception, *, debug: bool) -> int:
    if debug:
        raise error
    _complain(StepLogError(f"unexpected {type(error).__name__}: {error} (--debug shows where)"))
    return EXIT_INTERNAL


def _stdout_closed() -> bool:
    """Whether standard output is a pipe (or socket) whose reader has gone: ``head`` read what
    it wanted. (Where ``poll`` cannot say, a broken pipe is taken to be standard output's.)"""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):
        return False
    if not hasattr(select, "poll"):  # pragma: no cover
        return True
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _stdout_to_devnull() -> None:
    """Point standard output at the null device, so that what is still buffered for it is
    dropped at exit instead of failing again (Python's documentation on SIGPIPE)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


def _run(args: argparse.Namespace) -> int:
    args.json = getattr(args, "json", False) or args.global_json
    console = quiet_console() if args.json else SafeConsole(highlight=False)
    url = args.store or os.environ.get(DEFAULT_STORE_ENV) or CLI_DEFAULT_STORE
    args.store_url = url  # for the demo's child process, which opens the same store
    if args.command == "keygen":  # needs no store
        return keygen(console, as_json=args.json)
    try:
        with open_store(
            url,
            create=args.command in WRITING_COMMANDS,
            read_only=args.command not in _WRITERS,  # the reading commands, and ui
            allow_broken_chain=args.allow_broken_chain,
            keyring=keyring_of(args),
        ) as store:
            if args.command != "rekey":  # which seals the plain rows it would warn about
                warn_if_plain(store)
            if args.command in _NAMES_AN_INSTANCE and getattr(args, "instance", None) is not None:
                args.instance = instance_id(store, args.instance)
            code = COMMANDS[args.command](store, args, console)
            _label_broken(store.chain_problems)
            return code
    except StepLogError as error:
        if args.debug:
            raise
        return _failed(error)


def _failed(error: StepLogError) -> int:
    """Say what went wrong in one line on standard error; return the exit status for it."""
    if isinstance(error, LogIntegrityError):
        _complain_broken(error)
        return EXIT_BROKEN_CHAIN
    if isinstance(error, StoreUnavailableError):
        _complain(error)  # (the store's errors show its URL masked)
        return EXIT_STORE
    if isinstance(error, SchemaVersionError):
        _complain(error)  # (its message says to upgrade steplog)
        return EXIT_NEWER_SCHEMA
    if isinstance(error, DecodeError):  # (a missing key's says which key to give, and how)
        _complain(DecodeError(read_error_text(error)))
        return EXIT_BAD_INPUT
    _complain(error)  # bad input
    return EXIT_BAD_INPUT


def _complain(error: StepLogError) -> None:
    """One line on standard error (never wrapped: scripts grep it)."""
    text = " ".join(str(error).split())
    SafeConsole(stderr=True, highlight=False).print(
        f"[bold red]steplog:[/] {cell(text)}", soft_wrap=True
    )


def _complain_broken(error: LogIntegrityError) -> None:
    """The one line a command that met a broken chain prints (no traceback)."""
    _complain(
        LogIntegrityError(
            broken_chain_text(error, also="--allow-broken-chain reads the log anyway")
        )
    )


def _label_broken(problems: Sequence[ChainProblem]) -> None:
    """After a command run with ``--allow-broken-chain``: say on standard error (never on
    standard output, which may be one JSON document) that what it showed may have been altered."""
    if not problems:
        return
    first = problems[0]
    more = f" and {len(problems) - 1} more place(s)" if len(problems) > 1 else ""
    where = f"{first.instance_id!r}#{first.position}" if first.instance_id else "its meta table"
    SafeConsole(stderr=True, highlight=False).print(
        f"WARNING: this log's hash chain is broken at {where} "
        f"({first.kind}){more}; what was shown may have been altered ('steplog verify' lists "
        "every problem)",
        markup=False,
        soft_wrap=True,
    )


# -- demo and raw log ------------------------------------------------------------------------


def _demo(store: EventStore, args: argparse.Namespace, console: Console) -> int:
    asked = args.instance or f"orders-{uuid_ids()[:8]}"
    instance_id = free_demo_instance(store, asked)  # before anything is appended
    taken = [name for name in demo_instances(asked) if store.version(name)]
    console.rule("[bold]steplog demo: the stale-write bug (Agent Framework #7859)")
    if taken:
        console.print(
            f"{', '.join(taken)} already {'has' if len(taken) == 1 else 'have'} events (an "
            f"earlier demo?) and {'is' if len(taken) == 1 else 'are'} left as "
            f"{'it is' if len(taken) == 1 else 'they are'}: this demo writes to fresh instances "
            f"{', '.join(demo_instances(instance_id))}.\n",
            markup=False,
        )
    console.print(
        "Run 1: the handler stages [bold]secret[/] and then raises.\n"
        "Run 2: the same workflow object runs again and succeeds.\n"
        "Upstream, run 2 committed run 1's pending write. Here is what steplog's log says.\n"
    )
    wf, outcome = asyncio.run(run_demo(store, instance_id))
    report: dict[str, Any] = {**outcome.model_dump(mode="json"), "recovery": None, "kept": taken}
    console.print(f"store: {cell(store.url)}   instance: [bold]{cell(instance_id)}[/]")
    console.print(f"run 1 raised: [red]{outcome.first_error}[/]")
    console.print(f"run 2 outputs: {outcome.second_outputs}\n")
    events = wf.events()
    blame = fold_blame(events)
    console.print(events_table(events, blame, title=f"the log of {instance_id}"))
    console.print(f"\ncommitted state: {outcome.committed_state}\n")
    console.print(blame_table(blame, "secret", instance_id))
    if outcome.leaked:
        console.print("[bold red]LEAK: 'secret' is in committed state[/]")
        code = EXIT_PROBLEM
    else:
        console.print(
            "[bold green]nothing leaked:[/] the write of 'secret' is in the log, its superstep "
            "was aborted (failed), and no commit exists for it."
        )
        recovery = demo_instances(instance_id)[1]
        code = _demo_recovery(store, args.store_url, recovery, console, report)
    report["wrote"] = [i for i in demo_instances(instance_id) if store.version(i)]
    report["ok"] = code == 0
    if args.json:
        emit(report)
    else:
        console.print(f"wrote instances: {', '.join(report['wrote'])}", markup=False)
    return code


def _demo_recovery(
    store: EventStore, url: str, instance_id: str, console: Console, report: dict[str, Any]
) -> int:
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
    report["recovery"] = outcome.model_dump(mode="json")
    console.print(f"instance: [bold]{cell(instance_id)}[/]")
    console.print(f"child process killed by signal {outcome.killed_by}")
    for closed in outcome.recovered:
        console.print(f"recovered (superstep aborted as crashed): {cell(closed)}")
    console.print(f"resumed run outputs: {cell(str(outcome.resumed_outputs))}")
    console.print(f"committed state: {cell(str(outcome.resumed_state))}\n")
    console.print(blame_table(fold_blame(store.read(instance_id)), "total", instance_id))
    console.print(
        f"fork [bold]{cell(outcome.fork_id)}[/] (quantity 5 from the second stage): "
        f"{cell(str(outcome.fork_state))}"
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
    names = store.instances()
    if args.json:
        emit({"instances": [{"instance_id": n, "events": store.version(n)} for n in names]})
        return 0
    for instance in names:
        console.print(visible(instance), markup=False)
    return 0


def _require_events(store: EventStore, instance: str) -> list[EventBase]:
    events = store.read(instance)
    if not events:
        raise UsageError(f"no instance {instance!r} in {store.url}")
    return events


def _redactor(
    store: EventStore, args: argparse.Namespace, events: list[EventBase] | None = None
) -> SensitiveKeys:
    """What a reading command redacts: nothing with ``--reveal``, else the instance's sensitive
    keys and the ``--sensitive`` patterns (``events``: the instance's, when read already)."""
    extra = SensitiveKeys(args.sensitive)  # a bad pattern is bad input, --reveal or not
    if args.reveal:
        return SensitiveKeys()
    return sensitive_keys_of(store, args.instance, extra=extra.patterns, events=events)


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
        _redactor(store, args),
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


# -- audit and time travel -------------------------------------------------------------------


def _state(store: EventStore, args: argparse.Namespace, console: Console) -> int:
    events = _require_events(store, args.instance)
    point = (
        point_in(args.point, points_of(events)) if args.point else AtPosition(events[-1].position)
    )
    at = _redactor(store, args, events).state(state_at(events, point))
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
    blame = _redactor(store, args).blame(blame_keys(store, args.instance, [args.key]))
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
    events = _require_events(store, args.instance)
    log = points_of(events)
    before, after = point_in(args.before, log), point_in(args.after, log)
    changes = _redactor(store, args, events).diff(diff_points(events, before, after))
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
    events = _require_events(store, args.instance)
    key = args.key
    hidden = key in _redactor(store, args, events)
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


# -- materialized views ----------------------------------------------------------------------


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
    names = _views_named(args.views) or list(VIEW_NAMES)
    done: dict[str, dict[str, int]] = {}
    for name in names:
        projector = Projector(store, [name])
        with _progress(f"rebuilding {name}", store.last_position()) as progress:
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


def _views_named(named: Sequence[str]) -> list[str]:
    unknown = sorted(set(named) - set(VIEW_NAMES))
    if unknown:
        close = difflib.get_close_matches(unknown[0], VIEW_NAMES, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UsageError(f"unknown views {unknown}{hint}; choose from {', '.join(VIEW_NAMES)}")
    return list(dict.fromkeys(named))


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
                _complain(
                    LogIntegrityError(
                        f"the chain head in {path} ({head.instance_id!r}#{head.position}) {why}"
                    )
                )
                return EXIT_BROKEN_CHAIN
    with _progress("checking the hash chain", store.last_position()) as progress:
        counted = None if progress is None else (lambda events: progress(events, 0))
        report = store.verify_chain(args.instance, heads=heads, progress=counted)
    views: dict[str, VerifyReport] | None = None
    if report.ok or args.allow_broken_chain:
        views = {}
        for name in names:
            with _progress(f"verifying {name}", store.last_position()) as progress:
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
        return _views_named(named)
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


@contextmanager
def _progress(label: str, total: int) -> Iterator[Callable[[int, int], None] | None]:
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
    "head": _head,
    "recover": _recover,
    "keygen": lambda store, args, console: keygen(console, as_json=args.json),
    "rekey": rekey_command,
    **DURABLE_COMMANDS,
    "ui": ui_command,
    # (main runs it before opening any store: a completion script needs none)
    "completion": lambda store, args, console: completion_command(_parser(), args.shell),
}
READING_COMMANDS = frozenset(COMMANDS) - _WRITERS - {"ui"}
"""The commands that only read: none of them creates a file, a schema or a row."""


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
