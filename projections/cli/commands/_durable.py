"""The CLI's run and durable-execution commands: ``runs``, ``show``, ``checkpoints``,
``requests``, ``replay``, ``respond`` and ``fork``.

Every answer comes from the projections' run history (``fold_history``) or from the kernel
(``replay``, ``record_response``, ``fork_at``): nothing here decides what a log means.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any, NamedTuple

import orjson
from rich.console import Console
from rich.table import Table

from kernel import (
    RUN_END_TYPES,
    DecodeError,
    EventBase,
    EventStore,
    InstanceForked,
    MessageStaged,
    RecordedError,
    ResponseReceived,
    RunStarted,
    StepRecorded,
    ValueCodec,
    WorkflowEvent,
    fork_at,
    logged_checkpoints,
    record_response,
    replay,
)
from projections import REDACTED, RecordedStep, RunHistory, RunRecord, fold_history, forks_of
from projections._folds._runrecords import status_text
from projections._frontend._ids import (
    events_of,
    find_run,
    instance_id,
    pick,
    request_id,
    runs_of,
)
from projections._frontend._points import UsageError, point_in, points_of
from projections._frontend._render import (
    continues_text,
    print_paged,
    run_document,
    show_time,
    show_value,
)
from projections._frontend._safe import cell, json_text, visible
from projections._frontend._steps import step_line, steps_of
from projections.cli._json import emit, emit_line
from projections.cli._runstream import run_row, stream_runs
from projections.cli.commands import Command
from projections.cli.commands._reading import redactor, sensitivity_options

__all__ = ["COMMANDS", "add_commands", "history", "run_window"]


def add_commands(commands: Any) -> None:
    """The subcommands of this module."""
    runs = commands.add_parser("runs", help="runs of an instance (or of every instance)")
    runs.add_argument("instance", nargs="?", help="one instance (default: every instance)")
    show = commands.add_parser(
        "show", help="one run: its supersteps, outputs, requests and recorded steps"
    )
    show.add_argument("run", help="a run id, or a unique prefix of one")
    sensitivity_options(show)
    marks = commands.add_parser("checkpoints", help="the committed supersteps of an instance")
    marks.add_argument("instance")
    asked = commands.add_parser("requests", help="requests waiting for a response")
    asked.add_argument("instance", nargs="?", help="one instance (default: every instance)")
    answer = commands.add_parser(
        "respond", help="record a response to a pending request, for the workflow to go on with"
    )
    answer.add_argument("run", help="the run that waits (id or unique prefix)")
    answer.add_argument(
        "request_id", metavar="REQUEST_ID", help="the request answered (id or unique prefix)"
    )
    answer.add_argument("value", metavar="JSON", help="the response, as JSON")
    answer.add_argument(
        "--instance",
        metavar="INSTANCE",
        help="answer this instance's copy of the request: a fork's inherited request is "
        "listed with its origin's run (default: the instance the run is in)",
    )
    again = commands.add_parser("replay", help="the events a run's consumer got, from the log")
    again.add_argument("run", help="a run id, or a unique prefix of one")
    sensitivity_options(again)
    branch = commands.add_parser("fork", help="start a new instance from a point of another")
    branch.add_argument("instance")
    branch.add_argument("point", help="pos:N, step:ID, run:RUN:K or time:ISO")
    branch.add_argument("--to", required=True, metavar="NEW_INSTANCE", dest="to")


def history(store: EventStore, instance: str) -> RunHistory:
    """The instance's run history, folded window by window, with its forks (only the event
    types the history folds are decoded)."""
    events = events_of(store, instance, RunHistory.EVENT_TYPES)
    return fold_history(events, RunHistory(forks=forks_of(store, instance)))


_LATER = ("run_started", "response_received", *RUN_END_TYPES)
"""What ``show`` reads of the runs after the one shown: what answers, or stops waiting for, its
requests, and whether a later run continues it."""


class RunWindow(NamedTuple):
    """What ``run_window`` read of one run: the run ``history``, the messages each superstep of
    the run staged (``sent``), the ``ResponseReceived`` events of the responses it recorded
    (those its record lists in ``responses``), in order, and its recorded steps (``records``,
    its ``StepRecorded`` events in order)."""

    history: RunHistory
    sent: Counter[str]
    responses: list[ResponseReceived]
    records: list[StepRecorded]


def run_window(store: EventStore, instance: str, run_id: str) -> RunWindow:
    """The run history of ``instance`` folded from what concerns run ``run_id``: the fork
    event (if any), every event from the run's start to the next run's, and the starts, responses
    and ends of the later runs (the run starts are found by their rows' bytes). Its record of the
    run, and of its supersteps, are those of the whole instance's history. With it, the number
    of messages each superstep of the run staged (delivered only if the superstep committed),
    the responses the run recorded, and its step records."""
    starts = [e for e in store.find_events(instance, ("run_started",)) if isinstance(e, RunStarted)]
    at = next(n for n, e in enumerate(starts) if e.run_id == run_id)
    begin = starts[at].position - 1
    end = starts[at + 1].position - 1 if at + 1 < len(starts) else store.version(instance)

    def events() -> Iterator[EventBase]:
        if begin:
            yield from store.read(instance, upto=1, types=("instance_forked",))
        for event in events_of(store, instance, after=begin, upto=end):
            if isinstance(event, MessageStaged) and event.run_id == run_id:
                sent[event.superstep_id] += 1
            elif isinstance(event, ResponseReceived) and event.run_id == run_id:
                received.append(event)
            elif isinstance(event, StepRecorded) and event.run_id == run_id:
                records.append(event)
            yield event
        yield from store.find_events(instance, _LATER, after=end)

    sent: Counter[str] = Counter()
    received: list[ResponseReceived] = []
    records: list[StepRecorded] = []
    past = fold_history(events(), RunHistory(forks=forks_of(store, instance)))
    run = past.run(run_id)
    counted = set() if run is None else set(run.responses)
    first: dict[str, ResponseReceived] = {}
    for response in received:  # as the fold counts them: the first of each, while running
        if response.request_id in counted:
            first.setdefault(response.request_id, response)
    return RunWindow(past, sent, list(first.values()), records)


def _instances(store: EventStore, named: str | None) -> list[str]:
    return [named] if named is not None else store.instances()


def _runs(store: EventStore, args: argparse.Namespace, console: Console) -> int:
    """Each run as soon as it has ended (``_runstream``): one JSON document written piece by
    piece, or a table per page."""
    found = (
        (name, run) for name in _instances(store, args.instance) for run in stream_runs(store, name)
    )
    if args.json:
        opening = '{"runs":['
        for name, run in found:
            sys.stdout.write(opening + json_text(run_row(run, name)))
            sys.stdout.flush()
            opening = ","
        sys.stdout.write(('{"runs":[' if opening != "," else "") + "]}\n")
        return 0
    print_paged(console, found, lambda page, first: _runs_table(page, header=first))
    return 0


def _runs_table(page: list[tuple[str, RunRecord]], *, header: bool) -> Table:
    table = Table(title="runs" if header else None, expand=True, show_header=header)
    widths = {"instance": 10, "run": 8, "status": 17, "started": 12, "ended": 12}
    for column in ("instance", "run", "status", "started", "ended", "steps", "ok", "aborted"):
        table.add_column(column, no_wrap=True, min_width=widths.get(column, 5))
    table.add_column("error", overflow="fold", ratio=1)
    for name, run in page:
        error = f"{run.error.type}: {run.error.message}" if run.error else ""
        status = cell(status_text(run.status))
        if run.continued_by:  # the line break is the table's own, the ids are stored text
            status += "\ncontinued by " + cell(", ".join(r[:8] for r in run.continued_by))
        table.add_row(
            cell(name),
            cell(run.run_id[:8]),
            status,
            show_time(run.started_at),
            show_time(run.ended_at),
            str(run.supersteps),
            str(run.committed),
            str(run.aborted),
            cell(error[:400]),
        )
    return table


def _show(store: EventStore, args: argparse.Namespace, console: Console) -> int:
    instance, run_id = find_run(store, args.run)
    past, sent, responses, records = run_window(store, instance, run_id)
    run = past.run(run_id)
    assert run is not None
    steps = past.supersteps(run_id)
    asked = {r.request_id: r for r in run.pending_requests}
    rule = redactor(store, args, instance=instance)
    inside: dict[str, list[RecordedStep]] = {}
    for recorded in steps_of(store, instance, records, {s.superstep_id: s for s in steps}, rule):
        inside.setdefault(recorded.record.superstep_id, []).append(recorded)
    if args.json:
        emit(
            {
                "run": run_document(run, instance),
                "supersteps": [step.to_row() for step in steps],
                "messages": {step.superstep_id: sent[step.superstep_id] for step in steps},
                "steps": {
                    superstep_id: [recorded.to_row() for recorded in found]
                    for superstep_id, found in inside.items()
                },
                "responses": [
                    {
                        "request_id": r.request_id,
                        "value": r.value,
                        "timestamp": r.timestamp.isoformat(),
                        "run_id": r.run_id,
                        "position": r.position,
                    }
                    for r in responses
                ],
            }
        )
        return 0
    status = status_text(run.status)
    console.print(
        visible(
            f"run {run_id} of {instance} ({run.workflow_name}): {status}, started "
            f"{run.started_at.isoformat()}, ended "
            f"{run.ended_at.isoformat() if run.ended_at else '-'}"
        ),
        markup=False,
        soft_wrap=True,
    )
    if run.continues is not None:
        console.print(visible(continues_text(run)), markup=False)
    if run.continued_by:
        console.print(visible(f"continued by run {', '.join(run.continued_by)}"), markup=False)
    if run.error is not None:
        console.print(visible(f"error: {run.error.type}: {run.error.message}"), markup=False)
    if responses:
        _print_responses(console, run, responses)
    if not steps:
        console.print("no superstep: nothing executed in this run", markup=False)
        if run.outputs:
            console.print(
                visible(f"outputs: {show_value(run.outputs)}"), markup=False, soft_wrap=True
            )
        return 0
    table = Table(title="supersteps", expand=True)
    for column in ("#", "superstep", "status", "executors", "keys written", "messages"):
        table.add_column(column, overflow="fold")
    table.add_column("outputs", overflow="fold")
    table.add_column("requests", overflow="fold")
    if inside:  # the recorded steps inside each superstep (the column only when there are)
        table.add_column("recorded steps", overflow="fold")
    for step in steps:
        row = [
            str(step.index),
            cell(step.superstep_id[:8]),
            cell(step.status + (f" ({step.reason})" if step.reason else "")),
            cell(", ".join(step.executors)),
            cell(", ".join(step.keys)),
            str(sent[step.superstep_id]),
            cell(show_value(list(step.outputs))) if step.outputs else "",
            cell(", ".join(r + (" (pending)" if r in asked else "") for r in step.requests)),
        ]
        if inside:
            row.append("\n".join(cell(step_line(r)) for r in inside.get(step.superstep_id, ())))
        table.add_row(*row)
    console.print(table)
    if inside:
        console.print(
            visible(f"each step's result: steplog steps {run_id}"), markup=False, soft_wrap=True
        )
    if run.outputs:
        console.print(visible(f"outputs: {show_value(run.outputs)}"), markup=False, soft_wrap=True)
    return 0


def _print_responses(console: Console, run: RunRecord, responses: list[ResponseReceived]) -> None:
    """The responses ``run`` recorded: each request id, value, time and recording run; and
    whether a later run has delivered them yet."""
    table = Table(title="responses recorded", expand=True)
    for column in ("request", "value", "recorded at", "by run", "position"):
        table.add_column(column, overflow="fold")
    for response in responses:
        table.add_row(
            cell(response.request_id),
            cell(show_value(response.value)),
            response.timestamp.isoformat(),
            cell(response.run_id),
            str(response.position),
        )
    console.print(table)
    if run.status == "answered":
        console.print(
            "not delivered yet: the workflow's next resume() delivers them (a run with a new "
            "message is refused until then)",
            markup=False,
        )


def _checkpoints(store: EventStore, args: argparse.Namespace, console: Console) -> int:
    """The committed supersteps, each with its status where the log alone says it (None where
    only the workflow can say): ``kernel.logged_checkpoints``, one read and one fold of the log
    for both."""
    marks: list[dict[str, Any]] = [
        {
            "checkpoint_id": mark.checkpoint_id,
            "instance_id": mark.instance_id,
            "run_id": mark.run_id,
            "index": mark.index,
            "position": mark.position,
            "timestamp": mark.timestamp.isoformat(),
            "latest": mark.latest,
            "status": mark.status,
        }
        for mark in logged_checkpoints(store, args.instance)
    ]
    if args.json:
        emit({"instance_id": args.instance, "checkpoints": marks})
        return 0
    table = Table(title=cell(f"checkpoints of {args.instance}"))
    for column in (
        "checkpoint", "instance", "run", "#", "position", "committed at", "latest", "status"
    ):  # fmt: skip
        table.add_column(column, overflow="fold")
    for mark in marks:
        table.add_row(
            cell(mark["checkpoint_id"]),
            cell(mark["instance_id"]),
            cell((mark["run_id"] or "")[:8]),
            "" if mark["index"] is None else str(mark["index"]),
            str(mark["position"]),
            mark["timestamp"] or "",
            "yes" if mark["latest"] else "",
            cell(status_text(mark["status"] or "-")),
        )
    if not marks:
        console.print("no checkpoints: no superstep committed", markup=False)
        return 0
    console.print(table)
    console.print(
        "the latest is where the run goes on (wf.resume()); 'steplog fork' can branch from any "
        "of them",
        markup=False,
    )
    if any(mark["status"] is None for mark in marks):
        console.print(
            "status -: the log alone does not say (the workflow's checkpoints() does)",
            markup=False,
        )
    return 0


def _requests(store: EventStore, args: argparse.Namespace, console: Console) -> int:
    found: list[dict[str, Any]] = []
    answered: list[tuple[str, str]] = []  # runs whose recorded responses wait for resume()
    for name in _instances(store, args.instance):
        past = history(store, name)
        answered += [(name, run.run_id) for run in past.runs() if run.status == "answered"]
        owner = {r.request_id: run.run_id for run in past.runs() for r in run.pending_requests}
        forked = past.forked_from
        for request in past.pending_requests():
            run_id = owner.get(request.request_id)
            inherited = None
            if run_id is None and forked is not None:  # the fork's copy of its origin's request
                run_id, inherited = forked.origin_run, forked.origin_instance
            found.append(
                {
                    "instance_id": name,
                    "run_id": run_id,
                    **request.to_row(),
                    "inherited_from": inherited,
                }
            )
    if args.json:
        emit({"requests": found})
        return 0
    for name, run_id in answered:
        console.print(
            visible(
                f"run {run_id} of {name} recorded a response that waits for the workflow's "
                f"resume() (steplog show {run_id})"
            ),
            markup=False,
            soft_wrap=True,
        )
    if not found:
        console.print("no request is waiting for a response", markup=False)
        return 0
    table = Table(title="requests waiting for a response", expand=True)
    for column in ("instance", "run", "request", "executor", "response type"):
        table.add_column(column, no_wrap=True)
    table.add_column("data (JSON)", overflow="fold", ratio=1)
    for row in found:
        origin = row["inherited_from"]
        table.add_row(
            cell(row["instance_id"]),
            cell((row["run_id"] or "")[:8])
            + ("" if origin is None else f"\n(inherited from {cell(origin)})"),
            cell(row["request_id"]),
            cell(row["executor_id"]),
            cell(row["response_type"]),
            cell(show_value(row["data"])),
        )
    console.print(table)
    console.print("answer one with: steplog respond RUN REQUEST_ID JSON", markup=False)
    if any(row["inherited_from"] is not None for row in found):
        console.print(
            "a fork's inherited request: its run is the origin's; answer the fork's copy with "
            "steplog respond RUN REQUEST_ID JSON --instance FORK",
            markup=False,
        )
    return 0


def _hidden_steps(
    store: EventStore, args: argparse.Namespace, instance: str, run_id: str
) -> set[tuple[str, str]]:
    """The (superstep id, step name) of the run's recorded steps whose results ``replay``
    redacts: those named like a sensitive key (``SensitiveKeys``, the rule ``steps`` applies),
    unless ``--reveal``."""
    rule = redactor(store, args, instance=instance)
    if not rule:
        return set()
    return {
        (event.superstep_id, event.name)
        for event in store.find_events(instance, ("step_recorded",))
        if isinstance(event, StepRecorded) and event.run_id == run_id and event.name in rule
    }


def _replay(store: EventStore, args: argparse.Namespace, console: Console) -> int:
    instance, run_id = find_run(store, args.run)
    codec = store.codec
    hidden = _hidden_steps(store, args, instance, run_id)

    async def replayed() -> list[WorkflowEvent]:
        return [event async for event in replay(store, run_id, instance_id=instance)]

    table = Table(title=cell(f"replay of run {run_id} of {instance}"), expand=True)
    for column in ("event", "superstep", "executor"):
        table.add_column(column, no_wrap=True)
    table.add_column("data", overflow="fold", ratio=1)
    for event in asyncio.run(replayed()):  # (a custom event's type is stored text)
        error = event.error
        # A step's result (its executor id is the step's name) is redacted as ``steps`` does. An
        # executor named like a sensitive step, in the same superstep, is redacted too: the
        # stream cannot tell them apart, and hiding too much never leaks.
        if event.type in _STEP_RESULTS and (event.superstep_id, event.executor_id) in hidden:
            data: Any = dict(REDACTED)
        else:
            data = None if event.data is None else codec.encode(event.data, what="replayed data")
        document = {
            "type": event.type,
            "run_id": event.run_id,
            "superstep": event.superstep,
            "superstep_id": event.superstep_id,
            "executor_id": event.executor_id,
            "request_id": event.request_id,
            "origin": event.origin.value,
            "state": None if event.state is None else event.state.value,
            "data": data,
            "error": None
            if error is None
            else {
                "type": error.info.type
                if isinstance(error, RecordedError)
                else type(error).__name__,
                "message": error.info.message if isinstance(error, RecordedError) else str(error),
            },
        }
        if args.json:
            emit_line(document)
            continue
        detail = document["data"] if error is None else document["error"]
        table.add_row(
            cell(event.type),
            "" if event.superstep is None else str(event.superstep),
            cell(event.executor_id or ""),
            "" if detail is None else cell(show_value(detail)),
        )
    if not args.json:
        console.print(table)
    return 0


_STEP_RESULTS = frozenset({"executor_completed", "executor_bypassed"})
"""The replayed events that carry a recorded step's result."""


def _error_document(error: BaseException | None) -> dict[str, str] | None:
    if error is None:
        return None
    if isinstance(error, RecordedError):
        return {"type": error.info.type, "message": error.info.message}
    return {"type": type(error).__name__, "message": str(error)}


def _respond(store: EventStore, args: argparse.Namespace, console: Console) -> int:
    instance, run_id = _waiting_run(store, args.run, args.instance)
    try:
        value = ValueCodec().decode(orjson.loads(args.value), what="the response")
    except (orjson.JSONDecodeError, DecodeError) as error:
        raise UsageError(f"the response must be JSON, got {args.value!r}: {error}") from error
    request = request_id(store, instance, args.request_id)
    recorded = record_response(store, run_id, request, value, instance_id=instance)
    if args.json:
        emit(
            {
                "instance_id": instance,
                "request_id": request,
                "run_id": recorded.run_id,
                "continues": run_id,
                "positions": [recorded.first_position, recorded.last_position],
            }
        )
        return 0
    console.print(
        visible(
            f"recorded the response to request {request} of {instance} in run "
            f"{recorded.run_id} (positions {recorded.first_position}..{recorded.last_position}); "
            "the workflow goes on with it at its next resume()"
        ),
        markup=False,
        soft_wrap=True,
    )
    return 0


def _waiting_run(store: EventStore, run: str, instance: str | None) -> tuple[str, str]:
    """``(instance, run id)`` for ``respond``: the run ``run`` names in any instance, or, with
    ``instance``, among that instance's runs and the origin's run a fork goes on with (its
    inherited requests are that run's). A ``run`` that names no run but an instance is told to
    use ``--instance``."""
    if instance is None:
        try:
            return find_run(store, run)
        except UsageError:
            if store.version(run) > 0:
                raise UsageError(
                    f"{run!r} is an instance, not a run: give the run that waits ('steplog "
                    f"requests {run}' lists it) and --instance {run} to answer that instance's "
                    "copy of the request"
                ) from None
            raise
    name = instance_id(store, instance)
    ids = [started.run_id for started in runs_of(store, name)]
    forked = next(iter(store.read(name, upto=1, types=("instance_forked",))), None)
    if isinstance(forked, InstanceForked) and forked.origin_run is not None:
        ids.append(forked.origin_run)
    return name, pick(run, ids, "run", f"instance {name!r}")


def _fork(store: EventStore, args: argparse.Namespace, console: Console) -> int:
    events = list(events_of(store, args.instance))
    point = point_in(args.point, points_of(events))
    forked = fork_at(store, args.instance, point, args.to)
    if args.json:
        emit(
            {
                "instance_id": args.to,
                "origin_instance": forked.origin_instance,
                "origin_position": forked.origin_position,
                "checkpoint": forked.checkpoint,
                "origin_run": forked.origin_run,
                "values": sorted(forked.values),
            }
        )
        return 0
    console.print(
        visible(
            f"forked {args.instance} at position {forked.origin_position} into {args.to} "
            f"({len(forked.values)} committed keys; checkpoint {forked.checkpoint or 'none'}): "
            f"wrote {args.to}#1 (instance_forked)"
        ),
        markup=False,
        soft_wrap=True,
    )
    return 0


COMMANDS: dict[str, Command] = {
    "runs": _runs,
    "show": _show,
    "checkpoints": _checkpoints,
    "requests": _requests,
    "replay": _replay,
    "respond": _respond,
    "fork": _fork,
}
