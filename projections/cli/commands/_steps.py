"""The CLI's ``steps`` command: a run's recorded steps (the ``@step`` calls inside its handlers).

Each step is listed with its superstep (index and id) and that superstep's verdict, as the run
history decides it (``RecordedStep``); its executor, name and call index, duration, token counts,
its arguments when its step records them, and its result (as stored: a JSON tree; both redacted when
the step's name matches a sensitive-key pattern, ``SensitiveKeys``) or error. In the table a
conversation (a model call's prompt and response) is shown one message a line, role and text; any
other value as compact JSON; all of it escaped. A call served from the log shows the result it was
served and where from: the position of the record it reused and the run that first recorded it.
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kernel import EventStore
from projections import RecordedStep
from projections._frontend._ids import find_run
from projections._frontend._render import cut_text, print_paged, show_value
from projections._frontend._safe import cell, visible
from projections._frontend._steps import (
    conversation_text,
    duration_text,
    reused_text,
    steps_of,
    usage_parts,
    verdict_text,
)
from projections.cli._json import emit
from projections.cli.commands import Command
from projections.cli.commands._durable import run_window
from projections.cli.commands._reading import redactor, sensitivity_options

__all__ = ["COMMANDS", "add_commands"]


def add_commands(commands: Any) -> None:
    """The subcommands of this module."""
    steps = commands.add_parser(
        "steps", help="the recorded steps of a run: verdicts, results, what was reused"
    )
    steps.add_argument("run", help="a run id, or a unique prefix of one")
    sensitivity_options(steps)


def _steps(store: EventStore, args: argparse.Namespace, console: Console) -> int:
    instance, run_id = find_run(store, args.run)
    window = run_window(store, instance, run_id)
    supersteps = {s.superstep_id: s for s in window.history.supersteps(run_id)}
    rule = redactor(store, args, instance=instance)
    found = steps_of(store, instance, window.records, supersteps, rule)
    if args.json:
        emit(
            {
                "instance_id": instance,
                "run_id": run_id,
                "steps": [step.to_row() for step in found],
            }
        )
        return 0
    if not found:
        console.print(
            visible(f"no recorded step in run {run_id} of {instance}"), markup=False, soft_wrap=True
        )
        return 0
    title = f"recorded steps of run {run_id} of {instance}"
    print_paged(console, found, lambda page, first: _table(page, title if first else None))
    if any(step.served for step in found):
        console.print(
            "reused: served from the log, not run again; the result shown is the one its run "
            "recorded first",
            markup=False,
        )
    return 0


_WHOLE = "--json prints it whole"


def _shown(value: Any) -> str:
    """A stored value in a cell: a conversation one message a line, anything else compact JSON;
    escaped, and cut saying so."""
    conversation = conversation_text(value)
    if conversation is None:
        return cell(show_value(value, hint=_WHOLE))
    return escape(visible(cut_text(conversation, hint=_WHOLE), keep="\n"))


def _arguments(arguments: Any) -> str:
    """Recorded arguments in a cell: ``name: value`` a line each (a redacted whole as it is)."""
    if isinstance(arguments, dict) and "$t" not in arguments:
        return "\n".join(f"{cell(str(name))}: {_shown(value)}" for name, value in arguments.items())
    return _shown(arguments)


def _table(page: list[RecordedStep], title: str | None) -> Table:
    """One page of ``steps``: position, superstep, its verdict, the step (name, executor, call
    index), duration, tokens, and its result (or error, or where a served call's result comes
    from), after its arguments when its step records them."""
    table = Table(title=None if title is None else cell(title), expand=True)
    for column in ("#", "superstep", "verdict", "step", "duration", "tokens"):
        table.add_column(column, overflow="fold")
    table.add_column("result", overflow="fold", ratio=1, min_width=30)
    for step in page:
        record = step.record
        if record.error is not None:
            error = f"error: {record.error.type}: {record.error.message}"
            outcome = cell(cut_text(error, hint=_WHOLE))
        else:
            outcome = _shown(step.result)
            if step.served:
                outcome = f"{cell(reused_text(step, width=8))}\n{outcome}"
        if step.arguments is not None:
            outcome = f"arguments:\n{_arguments(step.arguments)}\nresult:\n{outcome}"
        index = "" if step.index is None else f"{step.index} "
        table.add_row(
            str(record.position),
            cell(f"{index}{record.superstep_id[:8]}"),
            cell(verdict_text(step)),
            f"{cell(record.name)}\n{cell(record.executor_id)}, call {record.call}",
            "" if step.served else duration_text(record.duration),
            "\n".join(cell(count) for count in usage_parts(record.usage)),
            outcome,
        )
    return table


COMMANDS: dict[str, Command] = {"steps": _steps}
