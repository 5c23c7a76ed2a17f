"""Recorded steps in a run: the book of what the lineage recorded, and the host a handler's steps
talk to (``StepHost``, set for each executor's invocations in a superstep).

Where a call is looked up. A run belongs to a *lineage*: the run started with a message, and the
runs that continue it (``resume()``, ``run(responses=...)``, ``run(checkpoint_id=...)``). A graph
executor's steps are keyed by the superstep's index in the lineage: a superstep retried after a
crash, a cancellation, a lost lease, a dropped stream or a failure has the index of the attempt it
retries (a continuation goes on after the latest checkpoint), and a committed superstep is never
attempted again, so a hit is always the same work. An executor whose ``step_scope`` is
``"lineage"`` (a functional workflow's, which re-executes its function from the top in every
segment) is keyed across the whole lineage. The verdict of the superstep that recorded a call
does not matter: a step's record is durable at once, and provenance, not state.

What a retry after a *failed* handler does is the step's ``after_failure`` (``"reuse"`` by
default): ``"rerun"`` calls it again when any attempt that had its result (the one that recorded
it, or one that was served it) failed. After any other abort a recorded call is always served.

A call the book has no record of runs; unless the instance names the steps that may
(``RunnerContext.live_steps``: a rerun's scratch instance, see ``kernel._ops._rerun``): any other
call without a record is then refused, recorded as the call's error, never executed.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import orjson

from kernel._base._errors import (
    EncodingError,
    ExecutionError,
    StateWriteRejectedError,
)
from kernel._define._step import AfterFailure, Identity, StepCall
from kernel._log._events import ErrorInfo, StepRecorded
from kernel._run._hooks import HookChain, StepInfo, SuperstepInfo

if TYPE_CHECKING:
    from kernel._codec._values import ValueCodec
    from kernel._run._emit import Emit

__all__ = [
    "RecordedCall",
    "StepBook",
    "StepScope",
    "StepSite",
    "StepsHost",
    "returned",
    "step_key_of",
]

StepScope = Literal["superstep", "lineage"]


class StepSite(Protocol):
    """What a ``StepsHost`` asks of the superstep its calls are made in. ``Superstep``
    implements it; it makes the hosts, so this module does not import it."""

    @property
    def index(self) -> int: ...
    @property
    def instance_id(self) -> str: ...
    @property
    def run_id(self) -> str: ...
    @property
    def superstep_id(self) -> str: ...
    @property
    def hooks(self) -> HookChain | None: ...
    @property
    def info(self) -> SuperstepInfo: ...
    @property
    def hook_failures(self) -> dict[str, BaseException]:
        """What hooks raised, by executor: its handler fails with it when it returns."""
        ...

    def refuse_if_closed(self, executor_id: str, what: str) -> None:
        """Raise ``StateWriteRejectedError`` if the superstep is closed."""
        ...

    def closed_error(self, executor_id: str, what: str) -> StateWriteRejectedError:
        """The refusal of ``what`` once the superstep closed."""
        ...

    def step_head(self) -> dict[str, Any]:
        """What every ``StepRecorded`` of the superstep has alike."""
        ...

    def record_served(self, data: dict[str, Any]) -> None:
        """Stage the record of a call that was served."""
        ...


@dataclass(frozen=True, slots=True)
class RecordedCall:
    """A call a lineage recorded: where (``position``, ``run_id``, ``superstep_id``), its
    result as stored (a JSON tree), and the automatic request ids it used."""

    position: int
    run_id: str
    superstep_id: str
    result: Any
    auto_request_ids: int = 0


class StepBook:
    """The step calls one lineage recorded that may be served, and why their supersteps aborted.

    ``add`` takes ``StepRecorded`` events in log order (records of other lineages and of calls
    that raised are skipped; a record of a served call notes where the result it names was used
    again); ``abort`` notes a superstep's abort reason. A later record of the same call replaces
    an earlier one.
    """

    __slots__ = ("_by_lineage", "_by_superstep", "_served_in", "aborted", "lineage")

    def __init__(self, lineage: str) -> None:
        self.lineage = lineage
        self._by_superstep: dict[tuple[int, str, str], RecordedCall] = {}
        self._by_lineage: dict[tuple[str, str], RecordedCall] = {}
        # the position of a record -> the supersteps a later attempt was served it in
        self._served_in: dict[int, list[str]] = {}
        self.aborted: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._by_lineage)

    def add(self, event: StepRecorded, index: int | None) -> None:
        """Take ``event``, recorded in the superstep of lineage index ``index``."""
        if event.lineage != self.lineage or event.error is not None:
            return
        if event.reused is not None:
            self._served_in.setdefault(event.reused, []).append(event.superstep_id)
            return
        found = RecordedCall(
            event.position,
            event.run_id,
            event.superstep_id,
            event.result,
            event.auto_request_ids,
        )
        self.put(index, event.executor_id, event.key, found)

    def put(self, index: int | None, executor_id: str, key: str, found: RecordedCall) -> None:
        self._by_lineage[(executor_id, key)] = found
        if index is not None:
            self._by_superstep[(index, executor_id, key)] = found

    def add_all(self, events: Iterable[tuple[StepRecorded, int | None]]) -> StepBook:
        for event, index in events:
            self.add(event, index)
        return self

    def abort(self, superstep_id: str, reason: str) -> None:
        self.aborted[superstep_id] = reason

    def find(self, scope: StepScope, index: int, executor_id: str, key: str) -> RecordedCall | None:
        if scope == "lineage":
            return self._by_lineage.get((executor_id, key))
        return self._by_superstep.get((index, executor_id, key))

    def failed_with(self, found: RecordedCall) -> bool:
        """Whether a superstep that had ``found``'s result (it recorded it, or was served it)
        aborted because it failed: its result may be what failed it."""
        aborted = self.aborted
        return aborted.get(found.superstep_id) == "failed" or any(
            aborted.get(superstep_id) == "failed"
            for superstep_id in self._served_in.get(found.position, ())
        )


def returned(event: StepRecorded) -> bool:
    """Whether ``event`` records a call that returned (it neither raised nor was itself served):
    the only records a call is ever served."""
    return event.error is None and event.reused is None


def step_key_of(
    instance_id: str, lineage: str, index: int | None, executor_id: str, key: str
) -> str:
    """The idempotency key of a call: the same for every attempt at it, in any process."""
    where = "*" if index is None else str(index)
    text = "\x00".join((instance_id, lineage, where, executor_id, key))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


class StepsHost:
    """The ``StepHost`` of one executor's invocations in one superstep.

    ``append_now(data)`` appends a ``StepRecorded`` (``data``: its fields but position and time)
    at once, with what the superstep buffered before it, and gives its position once it is
    durable (awaited: through the store's group commit where it has one; None once the
    superstep's commit batch is sealed or its closing is in the log: nothing more of it may be
    appended). ``live`` is the instance's ``live_steps``: None, or the only steps a call without a
    record may run.
    """

    __slots__ = (
        "_append_now",
        "_book",
        "_calls",
        "_codec",
        "_emit",
        "_explicit",
        "_head",
        "_index",
        "_invocation",
        "_live",
        "_loop",
        "_occurrences",
        "_root",
        "_scope",
        "_step",
        "executor_id",
        "lineage",
        "run_context",
    )

    def __init__(
        self,
        step: StepSite,
        executor_id: str,
        scope: StepScope,
        book: StepBook,
        append_now: Callable[[dict[str, Any]], Awaitable[int | None]],
        emit: Emit,
        codec: ValueCodec,
        live: frozenset[str] | None = None,
    ) -> None:
        self._step = step
        self.executor_id = executor_id
        self._scope = scope
        self._book = book
        self.lineage = book.lineage
        self._append_now = append_now
        self._emit = emit
        self._codec = codec
        self._live = live
        self._index = step.index
        self._calls = 0
        self._invocation = 0
        self._occurrences: dict[tuple[str, str, str], int] = {}
        self._explicit: set[str] = set()
        self._root = asyncio.current_task()
        self._loop = asyncio.get_running_loop()
        self._head: dict[str, Any] | None = None
        self.run_context: Any = None  # what a step's ``RunContext`` parameter receives

    def reset(self) -> None:
        """A new execution of the handler begins (a functional workflow's function runs again
        from the top): count occurrences afresh."""
        self._occurrences.clear()
        self._explicit.clear()
        self._calls = 0

    def begin(self, invocation: int) -> None:
        """The handler is invoked for the executor's ``invocation``-th message of the superstep
        (from 0, in the order the log delivers them): its calls are identified, counted and
        numbered within this invocation, and their keys name it (after the first), so that two
        invocations' calls with the same identity are different calls."""
        self.reset()
        self._invocation = invocation

    def open(
        self, name: str, identity: Identity, digest: str | None, concurrent_ok: bool
    ) -> StepCall:
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not self._loop:  # a thread that took the handler's context along
            raise ExecutionError(
                f"step {name!r} was called by executor {self.executor_id!r} from another thread "
                "or event loop: a recorded step runs on its run's event loop (await it in the "
                "handler, or in a task of the handler's loop); in a thread it is not recorded"
            )
        self._step.refuse_if_closed(self.executor_id, f"call of step {name!r}")
        kind, ident = identity
        where = [self._invocation] if self._invocation else []
        if kind == "explicit":
            key = orjson.dumps(["explicit", name, ident, *where]).decode()
            if key in self._explicit:
                raise ValueError(
                    f"@step '{name}' produced duplicate replay_key values in one workflow run. "
                    "Each explicit replay key must identify exactly one logical invocation."
                )
            self._explicit.add(key)
        else:
            if not concurrent_ok and self._root is not asyncio.current_task():
                raise ValueError(
                    f"Cannot derive a stable replay identity for concurrent @step '{name}'. "
                    "Use @step(replay_key=...) to identify each logical invocation."
                )
            counted = (kind, name, ident)
            occurrence = self._occurrences.get(counted, 0)
            self._occurrences[counted] = occurrence + 1
            key = orjson.dumps([kind, name, ident, occurrence, *where]).decode()
        call = self._calls
        self._calls += 1
        index = None if self._scope == "lineage" else self._index
        step_key = step_key_of(self._step.instance_id, self.lineage, index, self.executor_id, key)
        return StepCall(name, key, step_key, call, digest)

    def lookup(self, call: StepCall, after_failure: AfterFailure) -> tuple[bool, Any]:
        found = self._book.find(self._scope, self._index, self.executor_id, call.key)
        if found is None:
            return False, None
        if after_failure == "rerun" and self._book.failed_with(found):
            return False, None
        if call.result_types:  # the classes the step declares it returns come back as such
            self._codec.register(*call.result_types)
        value = self._codec.decode(found.result, what=f"the recorded result of step {call.name!r}")
        call.reused = found.position
        call.auto_request_ids = found.auto_request_ids
        return True, value

    def _fields(self, call: StepCall) -> dict[str, Any]:
        head = self._head
        if head is None:
            head = self._head = self._step.step_head()
        return {
            **head,
            "executor_id": self.executor_id,
            "name": call.name,
            "key": call.key,
            "call": call.call,
            "lineage": self.lineage,
            "step_key": call.step_key,
            "digest": call.digest,
        }

    async def served(self, call: StepCall, result: Any) -> None:
        position = call.reused
        data = {
            **self._fields(call),
            "result": None,
            "error": None,
            "duration": 0.0,
            "usage": None,
            "reused": position,
        }
        self._step.record_served(data)
        self._report(call, 0.0, True, position, None)
        await self._tell("executor_bypassed", call.name, result)

    async def started(self, call: StepCall) -> None:
        """Tell the stream the call runs; or, when the instance does not let a call without a
        record run (``live_steps``: a rerun's), record the refusal as its error and raise it.
        Then refuse the call if its superstep closed while the stream's consumer took its time
        (the step has not run: ``StateWriteRejectedError``, told to the stream as the call's
        failure). A call's ``arguments`` (a step that records them) are encoded here, before it
        runs: ``EncodingError`` when the codec cannot store them, recorded as its error, and
        raised."""
        live = self._live
        if live is not None and call.name not in live:
            refused = ExecutionError(
                f"step {call.name!r} of executor {self.executor_id!r} was not called: lineage "
                f"{self.lineage} recorded no such call (with this identity: its arguments or "
                "replay key) here, and this instance runs only the steps named live "
                f"({', '.join(map(repr, sorted(live))) or 'none'}), as a rerun does"
            )
            call.started = time.perf_counter()
            await self.finished(call, None, refused)
            raise refused
        if call.arguments is not None:
            try:
                call.arguments = self._codec.encode(
                    call.arguments, what=f"the arguments of step {call.name!r}"
                )
            except EncodingError as unstorable:  # it does not run: recorded, never silently
                call.arguments = None
                call.started = time.perf_counter()
                await self.finished(call, None, unstorable)
                raise
        if call.args or call.kwargs:
            await self._tell(
                "executor_invoked", call.name, {"args": call.args, "kwargs": call.kwargs}
            )
        else:
            await self._tell("executor_invoked", call.name, None)
        try:
            self._step.refuse_if_closed(self.executor_id, f"call of step {call.name!r}")
        except StateWriteRejectedError as refused:
            await self._tell("executor_failed", call.name, None, refused)
            raise

    async def finished(self, call: StepCall, result: Any, error: BaseException | None) -> None:
        """Record the call; raises ``EncodingError`` (recorded as the call's error, so that it
        runs again next time) when its result cannot be stored, and ``StateWriteRejectedError``
        when it returned after its superstep closed (its commit sealed, or its closing in the
        log): nothing of the call is recorded then, and no hook or stream hears of it."""
        duration = max(0.0, time.perf_counter() - call.started)
        unstorable: EncodingError | None = None
        wire = None
        if error is None:
            try:
                wire = self._codec.encode(result, what=f"the result of step {call.name!r}")
            except EncodingError as refused:
                error = unstorable = refused
        data = {
            **self._fields(call),
            "result": wire,
            "error": None if error is None else ErrorInfo.of(error),
            "duration": duration,
            "usage": dict(call.usage) or None,
            "reused": None,
            "auto_request_ids": call.auto_request_ids,
            "arguments": call.arguments,
        }
        position = await self._append_now(data)
        step = self._step
        if position is None:
            if unstorable is not None:
                raise unstorable
            if error is None:
                raise step.closed_error(self.executor_id, f"the record of step {call.name!r}")
            return  # the caller raises what the step raised
        if error is None:
            found = RecordedCall(
                position, step.run_id, step.superstep_id, wire, call.auto_request_ids
            )
            self._book.put(self._index, self.executor_id, call.key, found)
        self._report(call, duration, False, position, error)
        if error is None:
            await self._tell("executor_completed", call.name, result)
        else:
            await self._tell("executor_failed", call.name, None, error)
        if unstorable is not None:
            raise unstorable

    def _report(
        self,
        call: StepCall,
        duration: float,
        reused: bool,
        position: int | None,
        error: BaseException | None,
    ) -> None:
        step = self._step
        hooks = step.hooks
        if hooks is None:
            return
        info = StepInfo(
            self.executor_id,
            call.name,
            call.key,
            call.step_key,
            call.call,
            duration,
            reused,
            position,
            error,
            dict(call.usage) or None,
        )
        try:
            hooks.step_finished(step.info, info)
        except Exception as failed:
            step.hook_failures.setdefault(self.executor_id, failed)

    async def _tell(
        self, kind: Any, name: str, data: Any, error: BaseException | None = None
    ) -> None:
        step = self._step
        await self._emit(kind, step.index, step.superstep_id, name, data, error)
