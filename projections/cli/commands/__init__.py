"""The ``steplog`` commands, one module per family; the parser, the dispatch and the exit
statuses are ``projections.cli._main``'s.

Each family module has ``add_commands(subparsers)``, which adds its subcommands and their
options, and ``COMMANDS``, each command's function by name:

  _demo         demo: the stale-write scenario, then a run killed, recovered and a fork
  _inspect      instances, log
  _audit        state, history, blame, diff, bisect (audit and time travel)
  _views        project (catch up, --follow), rebuild
  _maintenance  verify (hash chain, saved heads, views), head, recover
  _rekey        keygen, rekey (encryption at rest)
  _durable      runs, show, checkpoints, requests, respond, replay, fork
  _steps        steps (a run's recorded steps)
  _ui           ui (the browser debugger, projections.ui)
  _completion   completion (shell scripts made from the parser)

with ``_reading``, what the reading commands share (redaction, ``--reveal``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from rich.console import Console

from kernel import EventStore

__all__ = ["Command"]

Command = Callable[[EventStore, argparse.Namespace, Console], int]
"""A command: given the open store, the parsed arguments and the console to print on, it
prints its answer and returns the exit status (``projections.cli._status``)."""
