"""Checkpoints: every committed superstep, and where a run stands after it, rebuilt from the log.

Nothing is stored on the side. ``Ledger`` is a pure fold of an instance's events that keeps, per
run, how it started (fresh, or continuing another run from a checkpoint, with the responses it
recorded) and its committed supersteps with what they sent, yielded and requested; the marker rule
is ``SuperstepFold``'s, the same one committed state obeys. ``Ledger.standing`` replays that
lineage through the step algebra (``Position.after``) to the ``Standing`` of a run after any of
its checkpoints: the next superstep's index, inbox and fan-in buffers, the pending requests and
the outputs so far, which is everything a run needs to go on in another process.

Which checkpoint may be continued: only the instance's latest committed superstep (see
``Ledger.latest``). Continuing from an older one would silently rewrite what came after it;
that is refused (``ResumeError``), and ``Workflow.fork`` branches a new instance instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from kernel._base._errors import ResponseError, ResumeError
from kernel._define._graph import FanIn
from kernel._log._events import (
    RUN_END_TYPES,
    InfoRequested,
    InstanceForked,
    MessageStaged,
    OutputYielded,
    ResponseReceived,
    RunEvent,
    RunStarted,
    StepRecorded,
    SuperstepEvent,
    SuperstepStarted,
)
from kernel._log._fold import SuperstepFold, folds
from kernel._log._requests import PendingRequest, Response
from kernel._run._algo import Position, Sent
from kernel._run._steps import StepBook

if TYPE_CHECKING:
    from kernel._codec._values import ValueCodec
    from kernel._define._graph import Graph
    from kernel._run._algo import Router

__all__ = [
    "Checkpoint",
    "CheckpointStatus",
    "Continuation",
    "HistoryNeeded",
    "Ledger",
    "Root",
    "RunLine",
    "Standing",
    "Waiting",
    "answer",
    "check_responses",
    "continued_run",
    "pending_wire",
    "undelivered",
    "waiting",
]

CheckpointStatus = Literal[
    "resumable", "awaiting_input", "completed", "running", "superseded", "foreign"
]


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A committed superstep of an instance: a point its run can be continued from.

    ``checkpoint_id`` is the superstep's id (stable and printable); ``index`` its index in its
    run (``iteration_count`` too, as Agent Framework names it); ``timestamp`` the time of its
    commit marker, ``position`` the marker's stream position. ``status`` says what continuing from
    it would do: ``resumable`` (messages are pending: ``run(checkpoint_id=...)`` goes on),
    ``awaiting_input`` (requests wait: ``run(responses=...)``), ``completed`` (nothing left),
    ``running`` (its run is still open), ``superseded`` (a later superstep committed: fork it), or
    ``foreign`` (the instance's last run was run by a workflow of another name: this one cannot
    continue it).
    """

    checkpoint_id: str
    instance_id: str
    run_id: str
    index: int
    timestamp: datetime
    position: int
    status: CheckpointStatus = "superseded"

    @property
    def iteration_count(self) -> int:
        return self.index


@dataclass(slots=True)
class _Step:
    """A committed superstep and what it staged that counts (messages, outputs, requests)."""

    superstep_id: str
    run_id: str
    index: int
    timestamp: datetime
    position: int
    items: list[SuperstepEvent]


class HistoryNeeded(Exception):
    """A pruned ledger (one rebuilt from a snapshot, ``kernel._run._snapshot``) was asked about
    what it no longer holds (an older run or checkpoint): ask a ledger folded from the whole log.
    Never escapes the kernel: whoever holds a pruned ledger catches it and reads the log."""


@dataclass(slots=True)
class Root:
    """Where a pruned run line stands on what was pruned before it: its ``Standing`` after its
    last committed superstep (its only kept step, ``RunLine.steps[0]``), or at its start if it
    had none, as a tree of wire values (``kernel._run._snapshot``); the requests then pending
    (wire data, as ``pending_wire`` gives them); and the responses that the step-less runs it
    continues recorded and did not deliver (as ``waiting`` gathers them)."""

    standing: dict[str, Any]
    pending: dict[str, dict[str, Any]]
    responses: list[ResponseReceived]
    skip: int
    """How many of the line's kept steps the standing already includes (0 or 1)."""


@dataclass(slots=True)
class RunLine:
    """One run as the ledger keeps it: its start, responses, committed supersteps and end.

    ``base`` is the instance's latest checkpoint when the run started: if the run commits nothing,
    that is still where it would be continued from.
    """

    started: RunStarted
    base: str | None
    responses: list[ResponseReceived] = field(default_factory=list)
    steps: list[_Step] = field(default_factory=list)
    end: RunEvent | None = None
    tried_after: bool = False
    """Whether a superstep started after the run's last committed one was decided uncommitted
    (aborted): the runner starts a superstep only with messages to deliver."""
    lineage: str = ""
    """The run that began this run's line: itself when it started with a message, else its
    continued run's lineage (a run continued from another instance, a fork's origin, names it)."""
    root: Root | None = None
    """Set on a pruned ledger's line: the lineage is not walked past it (see ``Root``)."""

    @property
    def run_id(self) -> str:
        return self.started.run_id

    @property
    def resume_point(self) -> str | None:
        """The checkpoint this run goes on from: its last committed superstep, else its base."""
        return self.steps[-1].superstep_id if self.steps else self.base


@dataclass(slots=True)
class Standing:
    """Where a run stands after a checkpoint: its ``Position``, the outputs so far, and the run
    arguments its lineage recorded (wire values; a continuation inherits them)."""

    position: Position
    outputs: list[Any]
    kwargs: dict[str, Any] = field(default_factory=dict)
    intermediate_outputs: list[Any] = field(default_factory=list)


class Ledger(SuperstepFold):
    """Runs and checkpoints of one instance, as a pure fold (see the module's docstring)."""

    __slots__ = (
        "_starts",
        "_step_aborts",
        "_step_lineage",
        "_step_records",
        "answered",
        "checkpoints",
        "forked",
        "instance_id",
        "pruned",
        "runs",
    )

    def __init__(self, instance_id: str) -> None:
        super().__init__()
        self.instance_id = instance_id
        self.runs: dict[str, RunLine] = {}
        self.checkpoints: list[_Step] = []
        self.forked: InstanceForked | None = None
        # The ids of every request a run recorded a response to (``check_responses``).
        self.answered: set[str] = set()
        self.pruned = False
        """Whether older runs and checkpoints were pruned (a snapshot's ledger): a question about
        them raises ``HistoryNeeded``."""
        self._starts: dict[str, SuperstepStarted] = {}
        # The recorded steps of the latest lineage that recorded any, with their supersteps'
        # lineage indexes, and the abort reasons of the supersteps that recorded them.
        self._step_lineage: str | None = None
        self._step_records: list[tuple[StepRecorded, int | None]] = []
        self._step_aborts: dict[str, str] = {}

    # -- the fold -----------------------------------------------------------------------------

    @folds("run_started")
    def _run_started(self, event: RunStarted) -> None:
        continued = None if event.continues is None else self.runs.get(event.continues)
        lineage = continued.lineage if continued is not None else event.continues or event.run_id
        self.runs[event.run_id] = RunLine(event, self.latest, lineage=lineage)

    @folds("step_recorded")
    def _step_recorded(self, event: StepRecorded) -> None:
        if event.lineage != self._step_lineage:
            self._step_lineage = event.lineage
            self._step_records = []
            self._step_aborts = {}
        start = self._starts.get(event.superstep_id)
        self._step_records.append((event, None if start is None else start.index))

    @folds("response_received")
    def _responded(self, event: ResponseReceived) -> None:
        line = self.runs.get(event.run_id)
        if line is not None and line.end is None and not line.steps:
            line.responses.append(event)
            self.answered.add(event.request_id)

    @folds("superstep_started")
    def _superstep_started(self, event: SuperstepStarted) -> None:
        if event.run_id not in self._ended_runs:
            self._starts[event.superstep_id] = event

    @folds("message_staged", "output_yielded", "info_requested")
    def _staged(self, event: SuperstepEvent) -> None:
        self._stage(event)

    @folds(*RUN_END_TYPES)
    def _ended(self, event: RunEvent) -> None:
        self._run_ended(event)
        line = self.runs.get(event.run_id)
        if line is not None and line.end is None:
            line.end = event

    @folds("instance_forked")
    def _forked(self, event: InstanceForked) -> None:
        self.forked = event

    def _decided(self, marker: SuperstepEvent, committed: bool, items: list[Any]) -> None:
        start = self._starts.pop(marker.superstep_id, None)
        if not committed and self._step_records:
            reason = getattr(marker, "reason", None)
            if isinstance(reason, str):
                self._step_aborts[marker.superstep_id] = reason
        line = self.runs.get(marker.run_id)
        if line is not None and start is not None:
            line.tried_after = not committed
        if not committed or start is None or line is None:
            return
        step = _Step(
            marker.superstep_id,
            marker.run_id,
            start.index,
            marker.timestamp,
            marker.position,
            items,
        )
        line.steps.append(step)
        self.checkpoints.append(step)

    # -- questions ----------------------------------------------------------------------------

    @property
    def latest(self) -> str | None:
        """The instance's latest committed superstep: the only checkpoint a run may continue
        from (for a fork that has committed nothing, the origin's checkpoint it was forked at)."""
        if self.checkpoints:
            return self.checkpoints[-1].superstep_id
        return self.forked.checkpoint if self.forked is not None else None

    def last_run(self) -> RunLine | None:
        """The run started last, if any."""
        return next(reversed(self.runs.values()), None)

    def tried_after(self, line: RunLine) -> bool:
        """Whether ``line`` started a superstep after its last committed one that did not
        commit (aborted, or never marked)."""
        return line.tried_after or any(s.run_id == line.run_id for s in self._starts.values())

    def step_book(self, run_id: str) -> StepBook:
        """The recorded steps a run that continues ``run_id`` may be served: those of its
        lineage."""
        line = self.runs.get(run_id)
        lineage = run_id if line is None else line.lineage
        book = StepBook(lineage)
        if self._step_lineage == lineage:
            book.add_all(self._step_records)
            for superstep_id, reason in self._step_aborts.items():
                book.abort(superstep_id, reason)
        return book

    def find(self, checkpoint_id: str) -> _Step | None:
        for step in reversed(self.checkpoints):
            if step.superstep_id == checkpoint_id:
                return step
        if self.pruned:
            raise HistoryNeeded(f"checkpoint {checkpoint_id!r}")
        return None

    def run(self, run_id: str) -> RunLine | None:
        """``runs.get(run_id)``; ``HistoryNeeded`` for a run a pruned ledger may have dropped."""
        line = self.runs.get(run_id)
        if line is None and self.pruned:
            raise HistoryNeeded(f"run {run_id!r}")
        return line

    def lineage(
        self,
        run_id: str,
        checkpoint_id: str | None,
        origin: Callable[[InstanceForked], Ledger] | None = None,
    ) -> tuple[list[tuple[RunLine, str | None]], InstanceForked | None]:
        """The runs that run ``run_id`` continues, oldest first, each with the checkpoint it is
        taken up to (``checkpoint_id`` for the last; None: its start). A run this instance was
        forked from is followed into ``origin(forked)``'s ledger; without ``origin`` the walk
        stops there and returns the fork as well (None when the lineage begins here). Raises
        ``ResumeError`` when the log has no such run."""
        chain: list[tuple[RunLine, str | None]] = []
        ledger: Ledger = self
        while True:
            line = ledger.runs.get(run_id)
            if line is None and ledger.pruned:
                raise HistoryNeeded(f"run {run_id!r}")
            if line is None:
                forked = ledger.forked
                if forked is None or forked.origin_run != run_id:
                    raise ResumeError(f"instance {ledger.instance_id!r} has no run {run_id!r}")
                if origin is None:
                    chain.reverse()
                    return chain, forked
                ledger = origin(forked)
                continue
            chain.append((line, checkpoint_id))
            if line.started.continues is None or line.root is not None:
                chain.reverse()
                return chain, None
            run_id, checkpoint_id = line.started.continues, line.started.checkpoint

    def standing(
        self,
        run_id: str,
        checkpoint_id: str | None,
        *,
        router: Router,
        codec: ValueCodec,
        origin: Callable[[InstanceForked], Ledger],
    ) -> Standing:
        """Where run ``run_id`` stands after its checkpoint ``checkpoint_id`` (None: at its
        start). ``origin(forked)`` gives the ledger of the instance this one was forked from, for
        a run that continues the origin's run. Raises ``ResumeError`` if the log names what the
        workflow does not have."""
        chain, _ = self.lineage(run_id, checkpoint_id, origin)
        rebuild = _Rebuild(router, codec, self.instance_id)
        standing: Standing | None = None
        for line, upto in chain:
            steps = line.steps
            root = line.root if standing is None else None
            if root is not None:
                standing = rebuild.root(root)
                steps = steps[root.skip :]
                if upto is None or (root.skip and upto == line.steps[0].superstep_id):
                    if upto is None and root.skip:
                        raise HistoryNeeded(f"the start of run {line.run_id}")
                    continue
            else:
                standing = rebuild.start(line, standing)
            for step in steps:
                if upto is None:
                    break
                standing = rebuild.after(standing, step)
                if step.superstep_id == upto:
                    break
            else:
                if upto is not None:
                    if root is not None:
                        raise HistoryNeeded(f"superstep {upto!r} of run {line.run_id}")
                    raise ResumeError(f"run {line.run_id} has no committed superstep {upto!r}")
        assert standing is not None
        standing.kwargs = dict(chain[-1][0].started.kwargs)
        return standing


class _Rebuild:
    """Decodes what the log recorded and moves a ``Standing`` on with the step algebra."""

    def __init__(self, router: Router, codec: ValueCodec, instance_id: str) -> None:
        self.router = router
        self.codec = codec
        self.instance_id = instance_id

    def root(self, root: Root) -> Standing:
        """A pruned line's standing, decoded from its root's wire tree."""
        return standing_from_tree(root.standing, self.router.graph, self.codec.decode)

    def start(self, line: RunLine, before: Standing | None) -> Standing:
        """A run's standing at its start: a fresh run's input to the start executor, or the run
        it continues where it stood, with this run's responses delivered."""
        started = line.started
        if started.continues is None or before is None:
            start = self.router.graph.start
            return Standing(Position.start(start, self.codec.decode(started.input)), [])
        requests = before.position.requests
        answers = [
            (requests[response.request_id], self.codec.decode(response.value))
            for response in line.responses
            # a response to no pending request was refused when given: a tampered log cannot
            # revive one
            if response.request_id in requests
        ]
        return Standing(
            answer(before.position, answers),
            list(before.outputs),
            intermediate_outputs=list(before.intermediate_outputs),
        )

    def after(self, standing: Standing, step: _Step) -> Standing:
        decode = self.codec.decode
        sent: list[Sent] = []
        requested: list[PendingRequest] = []
        outputs = standing.outputs
        for item in step.items:
            if isinstance(item, MessageStaged):
                try:
                    delivery = self.router.delivery_of(item.source, item.targets)
                except KeyError as missing:
                    raise ResumeError(
                        f"superstep {step.index} ({step.superstep_id}) of run {step.run_id} sent "
                        f"a message to executor {missing.args[0]!r}, which this workflow does not "
                        "have: resume with the workflow that wrote the log"
                    ) from None
                sent.append(Sent(item.source, decode(item.message), delivery))
            elif isinstance(item, OutputYielded):
                if item.designation == "output":
                    outputs.append(decode(item.value))
                elif item.designation == "intermediate":
                    standing.intermediate_outputs.append(decode(item.value))
            elif isinstance(item, InfoRequested):
                requested.append(
                    PendingRequest(
                        item.request_id,
                        item.executor_id,
                        decode(item.data),
                        item.response_type,
                        item.run_id,
                        item.superstep_id,
                    )
                )
        return Standing(
            standing.position.after(sent, requested),
            outputs,
            intermediate_outputs=standing.intermediate_outputs,
        )


def pending_wire(
    ledger: Ledger, run_id: str, checkpoint: str | None, *, forked_requests: list[Any]
) -> dict[str, dict[str, Any]]:
    """The requests still pending where run ``run_id`` stands after ``checkpoint``, as the log
    recorded them (wire data), by request id in the order they were made."""
    chain, forked = ledger.lineage(run_id, checkpoint)
    base = list(forked_requests) if forked is not None else []
    pending: dict[str, dict[str, Any]] = {r["request_id"]: dict(r) for r in base}
    for i, (line, upto) in enumerate(chain):
        steps = line.steps
        root = line.root if i == 0 else None
        if root is not None:
            pending = {rid: dict(r) for rid, r in root.pending.items()}
            steps = steps[root.skip :]
            if upto is None and root.skip:
                raise HistoryNeeded(f"the start of run {line.run_id}")
            if root.skip and upto == line.steps[0].superstep_id:
                continue
        else:
            if line.started.continues is None:
                pending = {}
            for response in line.responses:
                pending.pop(response.request_id, None)
        for step in steps:
            if upto is None:
                break
            for item in step.items:
                if isinstance(item, InfoRequested):
                    pending[item.request_id] = {
                        "request_id": item.request_id,
                        "executor_id": item.executor_id,
                        "response_type": item.response_type,
                        "data": item.data,
                        "run_id": item.run_id,
                        "superstep_id": item.superstep_id,
                    }
            if step.superstep_id == upto:
                break
    return pending


@dataclass(frozen=True, slots=True)
class Waiting:
    """What waits on an instance's last run, where it stands now: what a run started with a new
    message would leave behind (it continues nothing). ``requests`` still wait for a response
    (wire data, by request id); ``responses`` were recorded (``record_response``, or a
    continuation that committed nothing) and are delivered only by the next ``resume()``."""

    requests: dict[str, dict[str, Any]]
    responses: list[ResponseReceived]

    def __bool__(self) -> bool:
        return bool(self.requests or self.responses)


def waiting(ledger: Ledger) -> Waiting:
    """The one rule for whether something waits on the instance (see ``Waiting``): the requests
    of the last run's lineage (a fork's inherited ones too) that count and have no response, and
    the responses the runs at the end of that lineage recorded without committing a superstep
    after them (so not delivered yet: a continuation delivers them again)."""
    forked = ledger.forked
    inherited = list(forked.requests) if forked is not None else []
    line = ledger.last_run()
    if line is None:
        return Waiting({r["request_id"]: dict(r) for r in inherited}, [])
    checkpoint = line.steps[-1].superstep_id if line.steps else None
    requests = pending_wire(ledger, line.run_id, checkpoint, forked_requests=inherited)
    return Waiting(requests, undelivered(ledger, line))


def undelivered(ledger: Ledger, run: RunLine | None) -> list[ResponseReceived]:
    """The responses recorded by ``run`` and the runs it continues that no superstep has
    delivered yet: walking back while a run committed nothing and continues another (a
    snapshot's ``Root`` holds those of the runs it pruned), oldest first."""
    responses: list[ResponseReceived] = []
    while run is not None and not run.steps and run.started.continues is not None:
        responses[:0] = run.responses
        if run.root is not None:
            responses[:0] = run.root.responses
            break
        run = ledger.run(run.started.continues)
    return responses


@dataclass(frozen=True)
class Continuation:
    """What a run that continues another goes on from: the run ``run_id``, or the run whose
    resume point is ``checkpoint_id``, or (neither) the instance's last run; and the
    ``responses`` to record and deliver."""

    run_id: str | None = None
    checkpoint_id: str | None = None
    responses: Mapping[str, Any] = field(default_factory=dict)


def continued_run(ledger: Ledger, plan: Continuation, workflow_name: str) -> tuple[str, str | None]:
    """Which run a continuation goes on with, and from which of its checkpoints (None: from its
    start): always the instance's last run (for a fork that has not run yet, its origin's run), so
    from the instance's latest checkpoint. An older checkpoint or run is refused
    (``ResumeError``, pointing to ``fork``)."""
    where = f"instance {ledger.instance_id!r}"
    latest = ledger.latest
    forked = ledger.forked
    line = ledger.last_run()
    if plan.checkpoint_id is not None:
        checkpoint_id = plan.checkpoint_id
        step = ledger.find(checkpoint_id)
        at_fork = forked is not None and forked.checkpoint == checkpoint_id
        if step is None and not at_fork:
            raise ResumeError(
                f"{where} has no checkpoint {checkpoint_id!r}; wf.checkpoints() lists them"
            )
        if checkpoint_id != latest:
            what = (
                f"superstep {step.index} of run {step.run_id}"
                if step is not None
                else f"the origin's superstep {where} was forked after"
            )
            raise ResumeError(
                f"checkpoint {checkpoint_id!r} ({what}) is not the latest committed superstep of "
                f"{where} ({latest!r}): continuing from it would rewrite what was committed after "
                f"it. Fork it instead: wf.fork(at={checkpoint_id!r}, instance_id=...)"
            )
    elif plan.run_id is not None:
        named = ledger.run(plan.run_id)
        if named is None:
            known = ", ".join(list(ledger.runs)[-5:]) or "none"
            raise ResumeError(f"{where} has no run {plan.run_id!r} (latest runs: {known})")
        if named is not line:
            assert line is not None
            raise ResumeError(
                f"run {plan.run_id} cannot be continued: run {line.run_id} of {where} started "
                "after it, and only an instance's last run goes on (wf.resume() continues it). "
                "Fork the run's latest checkpoint instead: "
                f"wf.fork(at={named.resume_point or named.run_id!r}, instance_id=...)"
            )
    if line is None:
        if forked is not None and forked.origin_run is not None:
            return forked.origin_run, forked.checkpoint  # a fork goes on with its origin's run
        raise ResumeError(f"{where} has no run to continue; start one with a message")
    if line.started.workflow_name != workflow_name:
        raise ResumeError(
            f"run {line.run_id} of {where} was run by workflow {line.started.workflow_name!r}, "
            f"not {workflow_name!r}: continue it with the workflow that wrote it"
        )
    return line.run_id, line.steps[-1].superstep_id if line.steps else None


def check_responses(
    ledger: Ledger, position: Position, responses: Mapping[str, Any], graph: Graph
) -> dict[str, tuple[PendingRequest, Any]]:
    """The requests ``responses`` answer, each with its value, in the order given. Refuses
    (``ResponseError``) a response to an unknown or already answered request, or of a type no
    response handler of the requesting executor takes."""
    answers: dict[str, tuple[PendingRequest, Any]] = {}
    if not responses:
        return answers
    answered = ledger.answered
    for request_id, value in responses.items():
        if request_id in answered:
            raise ResponseError(
                f"request {request_id!r} of instance {ledger.instance_id!r} was already "
                "answered; a request takes one response"
            )
        request = position.requests.get(request_id)
        if request is None:
            pending = ", ".join(position.requests) or "none"
            raise ResponseError(
                f"instance {ledger.instance_id!r} has no pending request {request_id!r} "
                f"(pending: {pending})"
            )
        executor = graph.executors.get(request.executor_id)
        if executor is None:
            raise ResumeError(
                f"request {request_id!r} was made by executor {request.executor_id!r}, which "
                "this workflow does not have"
            )
        specs = [spec for spec in executor.response_handlers if spec.takes_request(request.data)]
        if not any(spec.takes(request.data, value) for spec in specs):
            wanted = sorted(
                {t.__qualname__ for spec in specs for t in (spec.responses or (object,))}
            )
            raise ResponseError(
                f"the response to request {request_id!r} (a {type(request.data).__qualname__} "
                f"from {request.executor_id!r}, asking for {request.response_type or 'anything'}) "
                f"must be a {' or '.join(wanted) or 'value its response handlers take'}; got a "
                f"{type(value).__qualname__}"
            )
        answers[request_id] = (request, value)
    return answers


def answer(position: Position, answers: list[tuple[PendingRequest, Any]]) -> Position:
    """``position`` with each request answered: no longer pending, and its ``Response`` in the
    requesting executor's inbox."""
    if not answers:
        return position
    requests = dict(position.requests)
    inbox = {target: list(messages) for target, messages in position.inbox.items()}
    for request, value in answers:
        requests.pop(request.request_id, None)
        inbox.setdefault(request.executor_id, []).append(Response(request, value))
    return Position(position.index, inbox, position.buffers, requests)


# -- standings as trees of wire values (a snapshot's roots) ---------------------------------------


class Wire:
    """A wire value (a JSON tree) standing for the value it decodes to, in a ``Standing`` rebuilt
    without decoding (``WIRE``): messages, outputs and request data pass through the step algebra
    unopened, so the standing can be written as it was recorded."""

    __slots__ = ("tree",)

    def __init__(self, tree: Any) -> None:
        self.tree = tree


class _WireCodec:
    """The ``decode`` a ``_Rebuild`` uses to rebuild a standing of ``Wire`` values."""

    @staticmethod
    def decode(tree: Any) -> Wire:
        return Wire(tree)


WIRE: Any = _WireCodec()
"""A codec stand-in for ``Ledger.standing``: the standing it gives holds ``Wire`` values."""


def _item_tree(value: Any) -> list[Any]:
    if type(value) is Wire:
        return ["w", value.tree]
    if isinstance(value, Response):
        return ["r", _request_tree(value.request), _item_tree(value.value)]
    if isinstance(value, list):  # a fan-in group's gathered messages
        return ["l", [_item_tree(v) for v in value]]
    raise TypeError(f"a wire standing holds {type(value).__qualname__}")


def _request_tree(request: PendingRequest) -> list[Any]:
    return [
        request.request_id,
        request.executor_id,
        _item_tree(request.data),
        request.response_type,
        request.run_id,
        request.superstep_id,
    ]


def standing_tree(standing: Standing) -> dict[str, Any]:
    """A standing of ``Wire`` values (``Ledger.standing(..., codec=WIRE)``) as a JSON tree."""
    position = standing.position
    return {
        "index": position.index,
        "inbox": [[t, [_item_tree(m) for m in ms]] for t, ms in position.inbox.items()],
        "buffers": [
            [
                group.target,
                list(group.sources),
                [[s, [_item_tree(m) for m in ms]] for s, ms in got.items()],
            ]
            for group, got in position.buffers.items()
        ],
        "requests": [_request_tree(r) for r in position.requests.values()],
        "outputs": [_item_tree(v) for v in standing.outputs],
        "intermediate": [_item_tree(v) for v in standing.intermediate_outputs],
    }


def standing_from_tree(
    tree: dict[str, Any], graph: Graph, decode: Callable[[Any], Any]
) -> Standing:
    """The standing ``standing_tree`` wrote, its wire values decoded by ``decode``, its fan-in
    groups found in ``graph`` by target and sources (``ResumeError`` for one it has not)."""

    def item(node: list[Any]) -> Any:
        kind = node[0]
        if kind == "w":
            return decode(node[1])
        if kind == "l":
            return [item(v) for v in node[1]]
        if kind == "r":
            return Response(request(node[1]), item(node[2]))
        raise ResumeError(f"a snapshot's standing holds an item of unknown kind {kind!r}")

    def request(node: list[Any]) -> PendingRequest:
        rid, executor_id, data, response_type, run_id, superstep_id = node
        return PendingRequest(rid, executor_id, item(data), response_type, run_id, superstep_id)

    groups = {(g.target, tuple(g.sources)): g for g in graph.groups if isinstance(g, FanIn)}
    buffers: dict[Any, dict[str, tuple[Any, ...]]] = {}
    for target, sources, got in tree["buffers"]:
        group = groups.get((target, tuple(sources)))
        if group is None:
            raise ResumeError(f"this workflow has no fan-in group of {sources} into {target!r}")
        buffers[group] = {s: tuple(item(m) for m in ms) for s, ms in got}
    requests = {}
    for node in tree["requests"]:
        made = request(node)
        requests[made.request_id] = made
    position = Position(
        int(tree["index"]),
        {t: [item(m) for m in ms] for t, ms in tree["inbox"]},
        buffers,
        requests,
    )
    return Standing(
        position,
        [item(v) for v in tree["outputs"]],
        intermediate_outputs=[item(v) for v in tree["intermediate"]],
    )
