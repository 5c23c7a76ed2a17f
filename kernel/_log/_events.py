"""The facts in the log.

Every event is a frozen pydantic model with a stable ``type`` string, a ``schema_version`` for
upcasting, the workflow instance it belongs to, its ``position`` in that instance's stream
(1, 2, ...) and a ``timestamp`` from the injected clock. Values and messages are JSON trees
(see ``_codec``).

The event names are past tense: each records something that happened. The state rule in one line:
a ``StateStaged`` write counts if and only if its superstep has a ``SuperstepCommitted`` marker, and
a superstep gets exactly one marker, ``SuperstepCommitted`` or ``SuperstepAborted``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from kernel._base._errors import LogIntegrityError

__all__ = [
    "EVENT_TYPES",
    "RUN_END_TYPES",
    "SUPERSTEP_MARKER_TYPES",
    "AbortReason",
    "CustomEventAdded",
    "DropReason",
    "ErrorInfo",
    "Event",
    "EventBase",
    "ExecutorCompleted",
    "ExecutorFailed",
    "ExecutorInvoked",
    "InfoRequested",
    "InstanceForked",
    "MessageStaged",
    "OutputYielded",
    "ResponseReceived",
    "RunAbandoned",
    "RunAwaitingInput",
    "RunCancelled",
    "RunCompleted",
    "RunEvent",
    "RunFailed",
    "RunStarted",
    "StateStaged",
    "StepRecorded",
    "SubworkflowRan",
    "SubworkflowStarted",
    "SuperstepAborted",
    "SuperstepCommitted",
    "SuperstepEvent",
    "SuperstepStarted",
    "complete_event",
    "trusted_event",
]

AbortReason = Literal["failed", "cancelled", "abandoned", "crashed"]
DropReason = Literal["no_edges", "target_mismatch", "type_mismatch"]
"""Why a sent message was dropped (``MessageStaged.dropped``): its sender has no outgoing edge;
the ``target_id`` it named is not connected to it; or no target connected to it has a handler for
the message's type. (A message that edge conditions route nowhere is not a drop: it has no
``targets`` and no ``dropped``.)"""
Json = Any  # a JSON tree as written by ValueCodec
E = TypeVar("E", bound="EventBase")


class ErrorInfo(BaseModel):
    """An exception as the log keeps it: its type's qualified name and its message."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: str
    message: str

    @classmethod
    def of(cls, error: BaseException) -> ErrorInfo:
        """The record of ``error``: always storable, whatever the exception holds.

        Text that is not valid Unicode (a lone surrogate) is kept with it escaped (``\\ud800``);
        an exception whose ``str()`` raises is recorded as ``<unprintable ...>``.
        """
        kind = type(error)
        name = (
            kind.__qualname__
            if kind.__module__ == "builtins"
            else f"{kind.__module__}.{kind.__qualname__}"
        )
        try:
            message = str(error)
        except Exception as unprintable:
            failure = type(unprintable).__name__
            message = f"<unprintable {kind.__qualname__}: str() raised {failure}>"
        return cls(type=_storable_text(name), message=_storable_text(message))


def _storable_text(text: str) -> str:
    """``text``, with what UTF-8 cannot encode (lone surrogates) escaped as ``\\udXXX``."""
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class EventBase(BaseModel):
    """Fields every event carries."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    SCHEMA_VERSION: ClassVar[int] = 1

    type: str
    """The event's stable type name (``"state_staged"``); each event class fixes it."""
    schema_version: int = 1
    instance_id: str
    position: int = Field(ge=1)
    timestamp: AwareDatetime


class RunEvent(EventBase):
    """An event that belongs to one run of its instance."""

    run_id: str


class SuperstepEvent(RunEvent):
    """An event that belongs to one superstep; ``superstep_id`` is unique across all runs."""

    superstep_id: str


class RunStarted(RunEvent):
    """A run began. ``owner`` names the process that ran it (``host:pid``).

    A run that continues another (resumed after a crash or failure, or given responses to its
    requests) names it in ``continues``, and the committed superstep it goes on from in
    ``checkpoint`` (None when the continued run committed none: it goes on from that run's own
    beginning). Its first superstep's index follows the checkpoint's; ``input`` is then None.

    ``sensitive_keys`` are the state keys (exact names, or ``fnmatch`` patterns such as
    ``"secret_*"``) the workflow declared sensitive: readers show their values redacted unless
    asked (schema version 2; runs of version 1 declared none).
    """

    SCHEMA_VERSION: ClassVar[int] = 2

    type: Literal["run_started"] = "run_started"
    schema_version: int = 2
    workflow_name: str
    input: Json = None
    kwargs: dict[str, Json] = Field(default_factory=dict)
    owner: str = ""
    durability: Literal["superstep", "write"] = "superstep"
    continues: str | None = None
    checkpoint: str | None = None
    sensitive_keys: list[str] = Field(default_factory=list)


class RunCompleted(RunEvent):
    """A run ended normally: no message was left to deliver."""

    type: Literal["run_completed"] = "run_completed"
    supersteps: int


class RunFailed(RunEvent):
    """A run ended with an error (an executor's, or the convergence limit)."""

    type: Literal["run_failed"] = "run_failed"
    error: ErrorInfo
    executor_id: str | None = None
    superstep_id: str | None = None


class RunCancelled(RunEvent):
    """The task consuming the run was cancelled."""

    type: Literal["run_cancelled"] = "run_cancelled"
    superstep_id: str | None = None


class RunAwaitingInput(RunEvent):
    """A run stopped with no message left to deliver and requests still unanswered.

    ``requests`` are their ids. ``run(responses=...)`` continues it (a new run that ``continues``
    this one), in this process or any later one.
    """

    type: Literal["run_awaiting_input"] = "run_awaiting_input"
    supersteps: int
    requests: list[str] = Field(default_factory=list)


class ResponseReceived(RunEvent):
    """A response to a request, recorded by the run that delivers it, right after its start.

    The value is delivered to the requesting executor's response handler in the run's first
    superstep; a run that continues this one after a crash delivers it again.
    """

    type: Literal["response_received"] = "response_received"
    request_id: str
    value: Json = None


class RunAbandoned(RunEvent):
    """A run was found unfinished and closed: its stream was dropped, or its process died.

    ``closed_by`` is who closed it: the later run that did, or ``recover@`` followed by the
    lease holder ``recover`` closed it as (None in logs written before ``recover`` said so: only
    ``recover`` left it empty).
    """

    type: Literal["run_abandoned"] = "run_abandoned"
    reason: Literal["abandoned", "crashed"]
    superstep_id: str | None = None
    closed_by: str | None = None


class SuperstepStarted(SuperstepEvent):
    """A superstep opened: ``index`` counts from 1 in its run; ``superstep_id`` is unique."""

    type: Literal["superstep_started"] = "superstep_started"
    index: int = Field(ge=1)


class ExecutorInvoked(SuperstepEvent):
    type: Literal["executor_invoked"] = "executor_invoked"
    executor_id: str


class ExecutorCompleted(SuperstepEvent):
    type: Literal["executor_completed"] = "executor_completed"
    executor_id: str


class ExecutorFailed(SuperstepEvent):
    type: Literal["executor_failed"] = "executor_failed"
    executor_id: str
    error: ErrorInfo


class StateStaged(SuperstepEvent):
    """A write to state, staged in a superstep. It counts only if that superstep commits."""

    type: Literal["state_staged"] = "state_staged"
    executor_id: str
    key: str
    op: Literal["set", "delete"]
    value: Json = None


class MessageStaged(SuperstepEvent):
    """A message sent in a superstep, for delivery in the next one (only if this one commits).

    ``target`` is the target the sender named, if any; ``targets`` the executors it is routed to.
    ``gathered`` names, for each of those targets that is a fan-in group's (it receives the list
    of its sources' messages once all have sent), the group's sources in order: what a reader
    without the graph needs to tell what each executor received (``replay``).
    ``dropped`` says why a message with no ``targets`` goes nowhere although its conditions did
    not decide so (a ``DropReason``): no edge delivers it, and it is dropped (as AF drops it),
    recorded here. Like the rest of its superstep, a drop counts only if the superstep commits.
    """

    type: Literal["message_staged"] = "message_staged"
    source: str
    target: str | None = None
    targets: list[str] = Field(default_factory=list)
    message: Json = None
    gathered: dict[str, list[str]] = Field(default_factory=dict)
    dropped: DropReason | None = None


class OutputYielded(SuperstepEvent):
    """A value an executor yielded. It is delivered to the caller only if its superstep commits:
    as a workflow output (``designation`` ``"output"``), an intermediate output
    (``"intermediate"``), or not at all (``"hidden"``: the workflow's output designation names
    the executor as neither). Every yield is recorded, whatever its designation."""

    type: Literal["output_yielded"] = "output_yielded"
    executor_id: str
    value: Json = None
    designation: Literal["output", "intermediate", "hidden"] = "output"


class CustomEventAdded(SuperstepEvent):
    """A custom event an executor added (``ctx.add_event``). Like an output, it reaches the
    caller only if its superstep commits. ``event_type`` is the event's ``type``; ``data`` its
    payload as a JSON tree, or ``error`` when the payload was an exception (kept as its type and
    message, as every error in the log is).
    """

    type: Literal["custom_event_added"] = "custom_event_added"
    executor_id: str
    event_type: str
    data: Json = None
    error: ErrorInfo | None = None


class InfoRequested(SuperstepEvent):
    """An executor asked for input from outside the workflow (``ctx.request_info``).

    Like a message, it counts only if its superstep commits; then it is pending until a
    ``ResponseReceived`` answers it. ``response_type`` names the type asked for (for people and
    tools: the check is made against the executor's response handlers).
    """

    type: Literal["info_requested"] = "info_requested"
    request_id: str
    executor_id: str
    data: Json = None
    response_type: str = ""


class StepRecorded(SuperstepEvent):
    """A recorded step (``@step``) finished inside a handler of this superstep: durable at once,
    not staged, so that it outlives the superstep's abort.

    It is provenance, never state: recording a step makes none of its superstep's writes count.
    A later attempt at the same work (the superstep retried after a crash, a cancellation, a lost
    lease or a dropped stream; a functional workflow re-executed after an answer) is served
    ``result`` instead of calling the step again.

    ``executor_id`` is the executor whose handler called it; ``name`` the step's name; ``key``
    its identity in the attempt (the step's name, its arguments' identity or its ``replay_key``,
    and the occurrence of that identity); ``call`` its call index in the handler's invocation
    (from 0); ``lineage`` the run that began the line of runs it belongs to (a continuation keeps
    its lineage); ``step_key`` the idempotency key the step saw (the same on every attempt);
    ``digest`` the SHA-256 of its canonical arguments (None when they have none). ``result`` is
    what it returned (a JSON tree, through the codec) or ``error`` what it raised (then nothing is
    served: the call runs again). ``duration`` is in seconds; ``usage`` token counts when the
    step reported them (``input_tokens``, ``output_tokens``, ...). ``reused`` is set instead of a
    result when this call was served from the log: the stream position of the record it reused.
    ``auto_request_ids`` counts the automatic request ids (a functional workflow's ``auto::N``)
    the call used: a served call moves the count on by as many, as running it would (0 in graph
    handlers). ``arguments`` is what the call was called with, only for a step that opted in
    (``@step(record_arguments=True)``): its bound arguments, defaults applied, without its
    ``RunContext`` parameter, as a JSON object through the codec (None otherwise, and for a
    served call: its arguments are the record's it reused). The digest stays its identity.
    """

    type: Literal["step_recorded"] = "step_recorded"
    executor_id: str
    name: str
    key: str
    call: int = Field(ge=0)
    lineage: str
    step_key: str
    digest: str | None = None
    result: Json = None
    error: ErrorInfo | None = None
    duration: float = Field(default=0.0, ge=0.0)
    usage: dict[str, int] | None = None
    reused: int | None = Field(default=None, ge=1)

    def origin_in(self, records: Mapping[int, StepRecorded]) -> StepRecorded:
        """The record this served call reused (at position ``reused``), among ``records`` (its
        instance's step records by stream position): the one rule every reader applies.

        Raises ``LogIntegrityError`` (kind ``"reused"``, naming this record's position) when this
        call was not served, or that position holds no recorded result of the same call (same
        executor and identity, a call that returned): the runner serves nothing else."""
        found = None if self.reused is None else records.get(self.reused)
        if (
            found is None
            or found.error is not None
            or found.reused is not None
            or (found.executor_id, found.key) != (self.executor_id, self.key)
        ):
            raise LogIntegrityError(
                f"the call of step {self.name!r} at position {self.position} of "
                f"{self.instance_id!r} was served the record at position {self.reused}, which "
                "holds no recorded result of that call",
                instance_id=self.instance_id,
                position=self.position,
                kind="reused",
            )
        return found

    auto_request_ids: int = Field(default=0, ge=0)
    arguments: Json = None


class SuperstepCommitted(SuperstepEvent):
    """The superstep's staged writes, messages and outputs now count."""

    type: Literal["superstep_committed"] = "superstep_committed"


class SuperstepAborted(SuperstepEvent):
    """The superstep's staged writes, messages and outputs are inert, forever."""

    type: Literal["superstep_aborted"] = "superstep_aborted"
    reason: AbortReason
    error: ErrorInfo | None = None


class InstanceForked(EventBase):
    """The first event of an instance forked from another: its committed state starts as
    ``values``, the committed state of ``origin_instance`` as of stream position
    ``origin_position``. ``origin_run`` is the origin's last run at that point, and
    ``checkpoint`` that run's last committed superstep there (None if it had committed none):
    resuming the fork continues that run from there, with the requests it left unanswered,
    ``requests`` (each ``request_id``, ``executor_id``, ``response_type``, ``data``, ``run_id``
    and ``superstep_id``, as ``InfoRequested`` recorded them). The origin is never modified.
    """

    type: Literal["instance_forked"] = "instance_forked"
    origin_instance: str
    origin_position: int = Field(ge=0)
    checkpoint: str | None = None
    origin_run: str | None = None
    values: dict[str, Json] = Field(default_factory=dict)
    requests: list[dict[str, Json]] = Field(default_factory=list)


class SubworkflowRan(SuperstepEvent):
    """In a parent's log: executor ``executor_id`` (a ``WorkflowExecutor``) ran run
    ``child_run`` of the sub-workflow instance ``child_instance`` in this superstep.

    Like a message, it counts only if its superstep commits: then ``requests`` (the child's
    requests still unanswered when its run ended) are answered through this child, and
    ``continues`` (the child instance this one was forked from to take a response, if any) is
    replaced by it. In an aborted superstep it only records that the run happened.
    """

    type: Literal["subworkflow_ran"] = "subworkflow_ran"
    executor_id: str
    child_instance: str
    child_run: str
    requests: list[str] = Field(default_factory=list)
    continues: str | None = None


class SubworkflowStarted(RunEvent):
    """In a sub-workflow's log, right after its run's ``RunStarted``: the run was started by
    executor ``executor_id`` in superstep ``parent_superstep`` of run ``parent_run`` of instance
    ``parent_instance``. Its outputs and requests reach the parent only if that superstep commits.
    """

    type: Literal["subworkflow_started"] = "subworkflow_started"
    parent_instance: str
    parent_run: str
    parent_superstep: str
    executor_id: str


Event = Annotated[
    RunStarted
    | RunCompleted
    | RunFailed
    | RunCancelled
    | RunAbandoned
    | RunAwaitingInput
    | ResponseReceived
    | SuperstepStarted
    | ExecutorInvoked
    | ExecutorCompleted
    | ExecutorFailed
    | StateStaged
    | MessageStaged
    | OutputYielded
    | InfoRequested
    | SuperstepCommitted
    | SuperstepAborted
    | InstanceForked
    | CustomEventAdded
    | SubworkflowRan
    | SubworkflowStarted
    | StepRecorded,
    Field(discriminator="type"),
]

EVENT_TYPES: dict[str, type[EventBase]] = {
    cls.model_fields["type"].default: cls
    for cls in (
        RunStarted,
        RunCompleted,
        RunFailed,
        RunCancelled,
        RunAbandoned,
        RunAwaitingInput,
        ResponseReceived,
        SuperstepStarted,
        ExecutorInvoked,
        ExecutorCompleted,
        ExecutorFailed,
        StateStaged,
        MessageStaged,
        OutputYielded,
        InfoRequested,
        SuperstepCommitted,
        SuperstepAborted,
        InstanceForked,
        CustomEventAdded,
        SubworkflowRan,
        SubworkflowStarted,
        StepRecorded,
    )
}


RUN_END_TYPES: frozenset[str] = frozenset(
    {"run_completed", "run_failed", "run_cancelled", "run_abandoned", "run_awaiting_input"}
)
"""The event types that end a run: after one of them, nothing of that run counts any more."""

SUPERSTEP_MARKER_TYPES: frozenset[str] = frozenset({"superstep_committed", "superstep_aborted"})
"""The event types that decide a superstep: the first one for a superstep id is final."""

# The public event classes report the package that exports them, so that logs, reprs of errors and
# ``ErrorInfo.of`` never record a private module path.
for _cls in (EventBase, RunEvent, SuperstepEvent, ErrorInfo, *EVENT_TYPES.values()):
    _cls.__module__ = "kernel"
del _cls


@functools.cache
def _defaults(
    cls: type[EventBase],
) -> tuple[dict[str, Any], dict[str, Any], frozenset[str], frozenset[str]]:
    """Per event class: plain defaults, default factories, required and allowed field names."""
    plain: dict[str, Any] = {}
    factories: dict[str, Any] = {}
    required = set()
    for name, info in cls.model_fields.items():
        if info.default_factory is not None:
            factories[name] = info.default_factory
        elif info.is_required():
            required.add(name)
        else:
            plain[name] = info.default
    return plain, factories, frozenset(required), frozenset(cls.model_fields)


def trusted_event(cls: type[E], fields: dict[str, Any]) -> E | None:
    """Build an event from fields steplog itself produced, without re-validating each one.

    Returns None when a required field is missing or an unknown one is present; callers then
    validate in full (``cls.model_validate``), which says what is wrong. Types are not checked:
    use this only for fields made by the runner or read back from what the mapper wrote.
    The event takes ownership of ``fields`` (it may become the event's ``__dict__``).
    """
    plain, factories, required, allowed = _defaults(cls)
    keys = fields.keys()
    if keys == allowed:
        data = fields  # every field given (the mapper's case): nothing to fill in
    elif not (required <= keys <= allowed):
        return None
    else:
        data = {**plain, **fields}
        for name, factory in factories.items():
            if name not in data:
                data[name] = factory()
    return complete_event(cls, data, set(fields))


def complete_event(cls: type[E], data: dict[str, Any], given: set[str] | None = None) -> E:
    """The event whose ``__dict__`` is ``data``, which holds every field, already checked (no
    validation, no copy); ``given`` are the fields set explicitly (all, by default)."""
    event = object.__new__(cls)
    object.__setattr__(event, "__dict__", data)
    object.__setattr__(event, "__pydantic_fields_set__", set(data) if given is None else given)
    object.__setattr__(event, "__pydantic_extra__", None)
    object.__setattr__(event, "__pydantic_private__", None)
    return event
