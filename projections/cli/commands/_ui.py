"""``steplog ui``: serve the read-only time-travel debugger in the browser (``projections.ui``).

It needs the ``ui`` extra (``pip install 'steplog[ui]'``); without it, the command says so (bad
input, status 2). It has no JSON output: it prints the address to open and serves until Ctrl-C.
An address it cannot bind (a port in use) is bad input too: one line, and nothing is served; so
is a store marked encrypted when no keys were given (``MissingKeyError``), since no page of it
could be read.
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from kernel import EventStore, MissingKeyError
from projections._frontend._points import UsageError
from projections.cli.commands import Command
from projections.cli.commands._reading import sensitivity_options

__all__ = ["COMMANDS", "add_commands"]


def add_commands(commands: Any) -> None:
    """The ``ui`` subcommand."""
    ui = commands.add_parser("ui", help="a read-only time-travel debugger in the browser")
    ui.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    ui.add_argument("--port", type=int, default=8765, help="port (default: 8765)")
    ui.add_argument(
        "--token",
        default=None,
        help="access token every request must carry (generated and printed when --host is "
        "not a loopback address)",
    )
    ui.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer requests for this host name (one a proxy or the network gives this "
        "machine; repeatable). Always answered: 127.0.0.1, localhost, [::1] and --host; any "
        "other name is refused (DNS rebinding)",
    )
    sensitivity_options(ui)


def _ui(store: EventStore, args: argparse.Namespace, console: Console) -> int:
    """Serve the UI over ``store`` until interrupted."""
    if args.json:
        raise UsageError("'steplog ui' has no JSON output: it serves web pages; drop --json")
    if not 0 < args.port < 65536:
        raise UsageError(f"--port must be between 1 and 65535, got {args.port}")
    try:
        from projections.ui import allowed_names, serve
    except ImportError as error:
        raise UsageError(
            f"'steplog ui' needs the ui extra ({error.name} is missing): pip install 'steplog[ui]'"
        ) from error
    from projections import SensitiveKeys

    if store.encrypted and store.keyring is None:  # no page could be read: say so, serve none
        raise MissingKeyError(f"the store {store.url} is encrypted", where=f"the store {store.url}")
    SensitiveKeys(args.sensitive)  # a bad pattern is bad input before anything is served
    allowed_names(tuple(args.allowed_host))  # and so is a host that is not a name
    serve(
        store,
        host=args.host,
        port=args.port,
        token=args.token,
        reveal=args.reveal,
        sensitive=tuple(args.sensitive),
        allow_broken_chain=args.allow_broken_chain,
        allowed_hosts=tuple(args.allowed_host),
        say=lambda line: console.print(line, markup=False, soft_wrap=True),
    )
    return 0


COMMANDS: dict[str, Command] = {"ui": _ui}
