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
    steplog steps RUN                  the recorded steps of a run: verdicts, results, reuse
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
them; ``bisect --equals`` on a sensitive key needs it. ``steps``, ``show`` and ``log`` redact the
results of recorded steps whose name matches those patterns.

Only ``demo``, ``project`` and ``rebuild`` may create a store; the others (``recover`` too, though
it writes) refuse a store that does not exist, and create nothing.

Exit status: 0 on success, 1 when a command finds a problem (the demo finding a leak), 2 for bad
input (unknown instance, bad URL), 3 when the store is missing or cannot be reached, 4 when the
log's hash chain is broken (``--allow-broken-chain`` reads it anyway, labelled on stderr), 141
when standard output was closed by its reader (``| head``: quietly).
"""

from __future__ import annotations

import argparse
import os
import select
import sys
from collections.abc import Sequence

from kernel import DEFAULT_STORE_ENV, StepLogError, open_store
from projections._frontend._ids import instance_id
from projections._frontend._safe import SafeConsole
from projections.cli._json import quiet_console
from projections.cli._keys import add_keys_option, keyring_of, warn_if_plain
from projections.cli._status import (
    EXIT_CLOSED_PIPE,
    failed,
    label_broken,
    unexpected,
)
from projections.cli.commands import (
    Command,
    _audit,
    _completion,
    _demo,
    _durable,
    _inspect,
    _maintenance,
    _rekey,
    _steps,
    _ui,
    _views,
)
from projections.cli.commands._completion import completion_command
from projections.cli.commands._rekey import keygen

__all__ = [
    "COMMANDS",
    "READING_COMMANDS",
    "WRITING_COMMANDS",
    "main",
]

CLI_DEFAULT_STORE = "sqlite:///steplog.db"
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

_FAMILIES = (
    _rekey, _demo, _inspect, _audit, _views, _maintenance, _durable, _steps, _ui, _completion
)  # fmt: skip
"""The command families, in the order ``steplog --help`` lists their commands."""


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
    for family in _FAMILIES:
        family.add_commands(commands)
    for name, command in commands.choices.items():
        if name not in ("completion", "ui"):
            command.add_argument(
                "--json",
                action="store_true",
                help="print one JSON document (JSON lines for log and replay), nothing else",
            )
    return parser


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
            return unexpected(error, debug=args.debug)
        _stdout_to_devnull()
        return EXIT_CLOSED_PIPE
    except Exception as error:  # the last line of defence: one line, no traceback
        return unexpected(error, debug=args.debug)


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
            label_broken(store.chain_problems)
            return code
    except StepLogError as error:
        if args.debug:
            raise
        return failed(error)


COMMANDS: dict[str, Command] = {
    **_demo.COMMANDS,
    **_inspect.COMMANDS,
    **_audit.COMMANDS,
    **_views.COMMANDS,
    **_maintenance.COMMANDS,
    **_rekey.COMMANDS,
    **_durable.COMMANDS,
    **_steps.COMMANDS,
    **_ui.COMMANDS,
    # (main runs it before opening any store: a completion script needs none)
    "completion": lambda store, args, console: completion_command(_parser(), args.shell),
}
READING_COMMANDS = frozenset(COMMANDS) - _WRITERS - {"ui"}
"""The commands that only read: none of them creates a file, a schema or a row."""


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
