"""``steplog demo``: the stale-write scenario on a store, shown from its log; then a run killed,
recovered and resumed, and a fork. The scenarios themselves (their workflows, whose classes the
demo's logs name) are ``projections.cli._demo`` and ``_demo_recovery``; this module prints them.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from typing import Any

from rich.console import Console

from kernel import EventStore, uuid_ids
from projections import fold_blame
from projections._frontend._render import blame_table, events_table
from projections._frontend._safe import cell
from projections.cli._demo import demo_instances, free_demo_instance, run_demo
from projections.cli._demo_recovery import run_recovery_act
from projections.cli._json import emit
from projections.cli._status import EXIT_PROBLEM
from projections.cli.commands import Command

__all__ = ["COMMANDS", "add_commands"]


def add_commands(commands: Any) -> None:
    """The ``demo`` subcommand."""
    demo = commands.add_parser("demo", help="run the stale-write bug scenario; show nothing leaked")
    demo.add_argument("--instance", default=None, help="instance id (default: a fresh one)")


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


COMMANDS: dict[str, Command] = {"demo": _demo}
