"""Build a workflow instance's log by hand: for tests of projections, for tests and benchmarks.

``LogBuilder`` makes the events of one instance, numbered 1, 2, ... in its stream, stamped by an
injectable clock, with run and superstep ids from an injectable id factory, in append batches
ready for ``EventStore.append``. Every call appends exactly one event. Called in the order the
runner works (start a run, start a superstep, invoke, write, complete, commit, ..., end the run),
it makes the log the runner would make: the same events, ids and fields (``test_testing.py``
checks this against real runs). Called in any other order it makes the disorderly logs tests
need, and never refuses one:

* a write after its superstep's marker: ``write(key, value, superstep=sid)`` after ``commit()``;
* a second marker: ``commit(superstep=sid)`` or ``abort(superstep=sid)`` again;
* a marker or a write after the run ended: name the superstep after ``complete_run()``;
* interleaved runs: ``start_run()`` while another is open, then name ``run=`` / ``superstep=``;
* a superstep that never started (a damaged log): name it with ``superstep=`` and ``run=``.

Example::

    from kernel import MemoryStore, fold_committed
    from kernel.testing import LogBuilder, ticking_clock

    log = LogBuilder("orders-42", clock=ticking_clock())
    log.start_run("A-1")
    log.start_superstep()
    log.invoke("checkout")
    log.write("token", "tok-A-1")
    log.complete()
    log.commit()
    log.complete_run()
    store = MemoryStore()
    log.append_to(store)
    assert fold_committed(store.read("orders-42")).values == {"token": "tok-A-1"}

Values (state values, messages, outputs, run input) are stored JSON trees, as ``ValueCodec``
writes them; give ``codec=ValueCodec()`` to pass Python values and have them encoded.
``validate=False`` skips pydantic validation of each event (the runner's fast path), for logs of
millions of events built from trusted fields.

Why one module of ~600 lines: it is one public class whose methods map one to one onto the
event types, each a few lines around the shared bookkeeping of open runs and supersteps;
split, a reader would follow that bookkeeping across files for no gain.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypeVar

import orjson
from pydantic import ValidationError

from kernel._base._clock import Clock, IdFactory, system_clock, uuid_ids
from kernel._base._errors import StepLogError
from kernel._codec._values import ValueCodec
from kernel._log import _events as ev
from kernel._log._events import AbortReason, ErrorInfo, EventBase, trusted_event
from kernel._run._steps import step_key_of
from kernel._store._eventstore import EventStore

__all__ = ["LogBuilder", "LogBuilderError", "ticking_clock"]

E = TypeVar("E", bound=EventBase)


class LogBuilderError(StepLogError, ValueError):
    """A ``LogBuilder`` call that does not say which run, superstep or executor it belongs to,
    or whose fields do not make a valid event."""


class _Unset(enum.Enum):
    UNSET = enum.auto()


_UNSET = _Unset.UNSET


def ticking_clock(start: datetime | None = None, step: float = 1.0) -> Clock:
    """A clock that advances ``step`` seconds on every reading, from ``start`` (2025-01-01 UTC).

    The first reading is ``start + step``.
    """
    moment = start or datetime(2025, 1, 1, tzinfo=UTC)
    tick = timedelta(seconds=step)

    def now() -> datetime:
        nonlocal moment
        moment += tick
        return moment

    return now


class LogBuilder:
    """The events of one workflow instance, built call by call (see the module docstring).

    ``clock`` stamps each event (read once per event, as the runner does); ``ids`` names each run
    and superstep not named explicitly (one id per run, then one per superstep, as the runner
    does). ``version`` is the stream's version before the first event: positions continue from
    it (``LogBuilder(i, version=store.version(i))`` extends a stored stream).

    Methods that append a superstep's event take ``superstep=`` (default: the open superstep,
    the last one started and not yet marked); methods that end a run take ``run=`` (default: the
    open run, the last one started and not yet ended). Executor ids default to the executor last
    invoked in the superstep. Each method returns the event it appended.

    Raises ``LogBuilderError`` when a call names nothing and nothing is open to default to.
    """

    __slots__ = (
        "_batch",
        "_batches",
        "_clock",
        "_codec",
        "_executor_of",
        "_ids",
        "_instance_id",
        "_pending_of",
        "_position",
        "_run",
        "_run_of",
        "_sent",
        "_step",
        "_steps_in",
        "_validate",
    )

    def __init__(
        self,
        instance_id: str,
        *,
        clock: Clock = system_clock,
        ids: IdFactory = uuid_ids,
        version: int = 0,
        validate: bool = True,
        codec: ValueCodec | None = None,
    ) -> None:
        self._instance_id = instance_id
        self._clock = clock
        self._ids = ids
        self._position = version
        self._validate = validate
        self._codec = codec
        self._batches: list[list[EventBase]] = []
        self._batch: list[EventBase] = []
        self._sent = 0  # leading batches of _batches already appended by append_to
        self._run: str | None = None
        self._step: str | None = None
        self._run_of: dict[str, str] = {}  # superstep id -> run id
        self._steps_in: dict[str, int] = {}  # run id -> supersteps started in it
        self._pending_of: dict[str, str | None] = {}  # run id -> last superstep not committed
        self._executor_of: dict[str, str] = {}  # superstep id -> executor last invoked

    # -- what has been built ---------------------------------------------------------------

    @property
    def instance_id(self) -> str:
        return self._instance_id

    @property
    def version(self) -> int:
        """The position of the last event built (the stream's version once all are appended)."""
        return self._position

    @property
    def run_id(self) -> str | None:
        """The open run: the last one started and not yet ended."""
        return self._run

    @property
    def superstep_id(self) -> str | None:
        """The open superstep: the last one started and not yet marked."""
        return self._step

    def flush(self) -> None:
        """End the current batch: the next event starts a new one. Does nothing if it is empty."""
        if self._batch:
            self._batches.append(self._batch)
            self._batch = []

    def batches(self) -> list[list[EventBase]]:
        """Every batch built (and not drained), the current one included, in stream order."""
        current = [self._batch] if self._batch else []
        return [list(batch) for batch in self._batches + current]

    def events(self) -> list[EventBase]:
        """Every event built (and not drained), in stream order."""
        return [event for batch in self.batches() for event in batch]

    def drain(self) -> list[list[EventBase]]:
        """End the current batch; return every batch not drained yet, and forget them.

        For logs too long to keep in memory: positions, ids and open runs carry on.
        """
        self.flush()
        drained, self._batches, self._sent = self._batches, [], 0
        return drained

    def append_to(self, store: EventStore) -> list[int]:
        """Append every batch not appended yet, one ``store.append`` each; return the global
        positions. The current batch is ended first. Raises what ``store.append`` raises."""
        self.flush()
        positions: list[int] = []
        while self._sent < len(self._batches):
            batch = self._batches[self._sent]
            positions += store.append(
                self._instance_id, batch, expected_version=batch[0].position - 1
            )
            self._sent += 1
        return positions

    # -- runs ------------------------------------------------------------------------------

    def start_run(
        self,
        input: Any = None,
        *,
        workflow_name: str = "workflow",
        kwargs: dict[str, Any] | None = None,
        owner: str = "",
        durability: Literal["superstep", "write"] = "superstep",
        run_id: str | None = None,
        continues: str | None = None,
        checkpoint: str | None = None,
    ) -> ev.RunStarted:
        """``RunStarted``: the new run is the open one (a run still open stays unended).
        ``continues`` and ``checkpoint`` make it a continuation of another run."""
        run_id = run_id if run_id is not None else self._ids()
        encode = self._encode
        event = self._emit(
            ev.RunStarted,
            {
                "run_id": run_id,
                "workflow_name": workflow_name,
                "input": encode(input, "the run's input"),
                "kwargs": {k: encode(v, f"run argument {k!r}") for k, v in (kwargs or {}).items()},
                "owner": owner,
                "durability": durability,
                "continues": continues,
                "checkpoint": checkpoint,
            },
        )
        self._run = run_id
        self._steps_in.setdefault(run_id, 0)
        self._pending_of[run_id] = None
        return event

    def complete_run(
        self, *, supersteps: int | None = None, run: str | None = None
    ) -> ev.RunCompleted:
        """``RunCompleted``; ``supersteps`` defaults to the number started in the run."""
        run_id = self._ending(run)
        if supersteps is None:
            supersteps = self._steps_in.get(run_id, 0)
        return self._end(ev.RunCompleted, run_id, {"supersteps": supersteps})

    def await_input(
        self, requests: Sequence[str], *, supersteps: int | None = None, run: str | None = None
    ) -> ev.RunAwaitingInput:
        """``RunAwaitingInput``: the run ends waiting for responses to ``requests``."""
        run_id = self._ending(run)
        if supersteps is None:
            supersteps = self._steps_in.get(run_id, 0)
        fields = {"supersteps": supersteps, "requests": list(requests)}
        return self._end(ev.RunAwaitingInput, run_id, fields)

    def respond(
        self, request_id: str, value: Any, *, run: str | None = None
    ) -> ev.ResponseReceived:
        """``ResponseReceived`` for ``request_id``, in the open run (or ``run``)."""
        fields = {
            "run_id": self._ending(run),
            "request_id": request_id,
            "value": self._encode(value, "a response"),
        }
        return self._emit(ev.ResponseReceived, fields)

    def forked_from(
        self,
        origin_instance: str,
        values: dict[str, Any],
        *,
        origin_position: int = 0,
        checkpoint: str | None = None,
        origin_run: str | None = None,
        requests: Sequence[dict[str, Any]] = (),
    ) -> ev.InstanceForked:
        """``InstanceForked``: the instance starts from ``values`` (JSON trees, as stored), with
        the origin run's unanswered ``requests`` (as stored)."""
        fields = {
            "origin_instance": origin_instance,
            "origin_position": origin_position,
            "checkpoint": checkpoint,
            "origin_run": origin_run,
            "values": dict(values),
            "requests": [dict(request) for request in requests],
        }
        return self._emit(ev.InstanceForked, fields)

    def fail_run(
        self,
        error: ErrorInfo | BaseException,
        *,
        executor_id: str | None = None,
        superstep_id: str | _Unset | None = _UNSET,
        run: str | None = None,
    ) -> ev.RunFailed:
        """``RunFailed``; ``superstep_id`` defaults to the run's last superstep if it did not
        commit (the failed one), else None (a run that failed between supersteps)."""
        run_id = self._ending(run)
        fields = {
            "error": _error_info(error),
            "executor_id": executor_id,
            "superstep_id": self._failed_step(run_id, superstep_id),
        }
        return self._end(ev.RunFailed, run_id, fields)

    def cancel_run(
        self, *, superstep_id: str | _Unset | None = _UNSET, run: str | None = None
    ) -> ev.RunCancelled:
        """``RunCancelled``; ``superstep_id`` defaults as for ``fail_run``."""
        run_id = self._ending(run)
        fields = {"superstep_id": self._failed_step(run_id, superstep_id)}
        return self._end(ev.RunCancelled, run_id, fields)

    def abandon_run(
        self,
        reason: Literal["abandoned", "crashed"] = "crashed",
        *,
        closed_by: str | None = None,
        superstep_id: str | _Unset | None = _UNSET,
        run: str | None = None,
    ) -> ev.RunAbandoned:
        """``RunAbandoned``; ``superstep_id`` defaults as for ``fail_run``. When a later run
        closes it, the runner appends this (after ``abort(reason)``) before that run starts."""
        run_id = self._ending(run)
        fields = {
            "reason": reason,
            "closed_by": closed_by,
            "superstep_id": self._failed_step(run_id, superstep_id),
        }
        return self._end(ev.RunAbandoned, run_id, fields)

    # -- supersteps ------------------------------------------------------------------------

    def start_superstep(
        self, *, index: int | None = None, superstep_id: str | None = None, run: str | None = None
    ) -> ev.SuperstepStarted:
        """``SuperstepStarted`` in the open run (or ``run``); it becomes the open superstep.
        ``index`` defaults to the number of supersteps started in the run so far, plus one."""
        run_id = run if run is not None else self._run
        if run_id is None:
            raise LogBuilderError("start_superstep: no run is open; start_run() or name run=")
        superstep_id = superstep_id if superstep_id is not None else self._ids()
        count = self._steps_in.get(run_id, 0) + 1
        self._steps_in[run_id] = count
        event = self._emit(
            ev.SuperstepStarted,
            {
                "run_id": run_id,
                "superstep_id": superstep_id,
                "index": count if index is None else index,
            },
        )
        self._run_of[superstep_id] = run_id
        self._pending_of[run_id] = superstep_id
        self._step = superstep_id
        return event

    def invoke(
        self, executor_id: str, *, superstep: str | None = None, run: str | None = None
    ) -> ev.ExecutorInvoked:
        """``ExecutorInvoked``: later calls in the superstep default to this executor."""
        fields = self._in(superstep, run)
        self._executor_of[fields["superstep_id"]] = executor_id
        fields["executor_id"] = executor_id
        return self._emit(ev.ExecutorInvoked, fields)

    def write(
        self,
        key: str,
        value: Any,
        *,
        executor_id: str | None = None,
        superstep: str | None = None,
        run: str | None = None,
    ) -> ev.StateStaged:
        """``StateStaged`` setting ``key`` to ``value``."""
        fields = self._by(executor_id, superstep, run)
        fields.update(key=key, op="set", value=self._encode(value, f"state key {key!r}"))
        return self._emit(ev.StateStaged, fields)

    def delete(
        self,
        key: str,
        *,
        executor_id: str | None = None,
        superstep: str | None = None,
        run: str | None = None,
    ) -> ev.StateStaged:
        """``StateStaged`` deleting ``key``."""
        fields = self._by(executor_id, superstep, run)
        fields.update(key=key, op="delete", value=None)
        return self._emit(ev.StateStaged, fields)

    def send(
        self,
        message: Any,
        *,
        targets: Sequence[str] = (),
        target: str | None = None,
        source: str | None = None,
        superstep: str | None = None,
        run: str | None = None,
        gathered: dict[str, list[str]] | None = None,
        dropped: ev.DropReason | None = None,
    ) -> ev.MessageStaged:
        """``MessageStaged`` from ``source`` (default: the executor last invoked), routed to
        ``targets`` (default: ``[target]`` when a target is named, none when ``dropped``, the
        reason no edge delivered it); ``gathered`` names the fan-in targets among them, with
        their groups' sources."""
        fields = self._in(superstep, run)
        fields.update(
            source=source if source is not None else self._executor(fields["superstep_id"]),
            target=target,
            targets=list(targets) if targets or target is None or dropped else [target],
            message=self._encode(message, "a message"),
            gathered=dict(gathered or {}),
        )
        if dropped is not None:
            fields["dropped"] = dropped
        return self._emit(ev.MessageStaged, fields)

    def output(
        self,
        value: Any,
        *,
        executor_id: str | None = None,
        superstep: str | None = None,
        run: str | None = None,
        designation: Literal["output", "intermediate", "hidden"] = "output",
    ) -> ev.OutputYielded:
        """``OutputYielded`` (``designation``: what the caller got it as; see the event)."""
        fields = self._by(executor_id, superstep, run)
        fields["value"] = self._encode(value, "an output")
        if designation != "output":
            fields["designation"] = designation
        return self._emit(ev.OutputYielded, fields)

    def custom_event(
        self,
        event_type: str,
        data: Any = None,
        *,
        error: ev.ErrorInfo | None = None,
        executor_id: str | None = None,
        superstep: str | None = None,
        run: str | None = None,
    ) -> ev.CustomEventAdded:
        """``CustomEventAdded``."""
        fields = self._by(executor_id, superstep, run)
        fields["event_type"] = event_type
        fields["data"] = self._encode(data, "a custom event")
        fields["error"] = error
        return self._emit(ev.CustomEventAdded, fields)

    def request(
        self,
        data: Any,
        *,
        request_id: str | None = None,
        response_type: str = "",
        executor_id: str | None = None,
        superstep: str | None = None,
        run: str | None = None,
    ) -> ev.InfoRequested:
        """``InfoRequested`` (``ctx.request_info``) by the executor last invoked."""
        fields = self._by(executor_id, superstep, run)
        fields.update(
            request_id=request_id if request_id is not None else self._ids(),
            data=self._encode(data, "a request"),
            response_type=response_type,
        )
        return self._emit(ev.InfoRequested, fields)

    def subworkflow_ran(
        self,
        child_instance: str,
        child_run: str,
        *,
        requests: Sequence[str] = (),
        continues: str | None = None,
        executor_id: str | None = None,
        superstep: str | None = None,
        run: str | None = None,
    ) -> ev.SubworkflowRan:
        """``SubworkflowRan``: the executor last invoked ran ``child_run`` of ``child_instance``."""
        fields = self._by(executor_id, superstep, run)
        fields.update(
            child_instance=child_instance,
            child_run=child_run,
            requests=list(requests),
            continues=continues,
        )
        return self._emit(ev.SubworkflowRan, fields)

    def subworkflow_started(
        self,
        parent_instance: str,
        parent_run: str,
        parent_superstep: str,
        executor_id: str,
        *,
        run: str | None = None,
    ) -> ev.SubworkflowStarted:
        """``SubworkflowStarted`` in the open run (or ``run``): who started it, and where."""
        fields = {
            "run_id": self._ending(run),
            "parent_instance": parent_instance,
            "parent_run": parent_run,
            "parent_superstep": parent_superstep,
            "executor_id": executor_id,
        }
        return self._emit(ev.SubworkflowStarted, fields)

    def record_step(
        self,
        name: str,
        result: Any = None,
        *,
        key: str | None = None,
        call: int = 0,
        lineage: str | None = None,
        digest: str | None = None,
        error: ErrorInfo | BaseException | None = None,
        duration: float = 0.0,
        usage: dict[str, int] | None = None,
        reused: int | None = None,
        executor_id: str | None = None,
        superstep: str | None = None,
        run: str | None = None,
        arguments: dict[str, Any] | None = None,
    ) -> ev.StepRecorded:
        """``StepRecorded``: a call of step ``name`` by the executor last invoked returned
        ``result`` (or raised ``error``; or was served the record at position ``reused``).
        ``key`` defaults to the key of the ``call``-th call of a step without arguments'
        identity, ``lineage`` to the superstep's run, and the idempotency key is derived from
        them as the runner derives it for a lineage-wide call. ``arguments`` are encoded, as a
        step that records its arguments (``record_arguments``) records them."""
        fields = self._by(executor_id, superstep, run)
        key = key if key is not None else orjson.dumps(["order", name, "", call]).decode()
        lineage = lineage if lineage is not None else fields["run_id"]
        fields.update(
            name=name,
            key=key,
            call=call,
            lineage=lineage,
            step_key=step_key_of(self._instance_id, lineage, None, fields["executor_id"], key),
            digest=digest,
            result=None if result is None else self._encode(result, f"the result of {name!r}"),
            error=None if error is None else _error_info(error),
            duration=duration,
            usage=usage,
            reused=reused,
            arguments=None if arguments is None else self._encode(arguments, "a step's arguments"),
        )
        return self._emit(ev.StepRecorded, fields)

    def complete(
        self,
        executor_id: str | None = None,
        *,
        superstep: str | None = None,
        run: str | None = None,
    ) -> ev.ExecutorCompleted:
        """``ExecutorCompleted``."""
        return self._emit(ev.ExecutorCompleted, self._by(executor_id, superstep, run))

    def fail(
        self,
        executor_id: str | None = None,
        error: ErrorInfo | BaseException | None = None,
        *,
        superstep: str | None = None,
        run: str | None = None,
    ) -> ev.ExecutorFailed:
        """``ExecutorFailed`` (``error`` defaults to ``RuntimeError: boom``)."""
        fields = self._by(executor_id, superstep, run)
        fields["error"] = _error_info(error if error is not None else RuntimeError("boom"))
        return self._emit(ev.ExecutorFailed, fields)

    def commit(
        self, *, superstep: str | None = None, run: str | None = None
    ) -> ev.SuperstepCommitted:
        """``SuperstepCommitted``; the superstep is no longer open."""
        fields = self._in(superstep, run)
        event = self._emit(ev.SuperstepCommitted, fields)
        sid = fields["superstep_id"]
        if self._pending_of.get(fields["run_id"]) == sid:
            self._pending_of[fields["run_id"]] = None
        self._close(sid)
        return event

    def abort(
        self,
        reason: AbortReason = "failed",
        *,
        error: ErrorInfo | BaseException | None = None,
        superstep: str | None = None,
        run: str | None = None,
    ) -> ev.SuperstepAborted:
        """``SuperstepAborted``; the superstep is no longer open."""
        fields = self._in(superstep, run)
        fields.update(reason=reason, error=_error_info(error) if error is not None else None)
        event = self._emit(ev.SuperstepAborted, fields)
        self._close(fields["superstep_id"])
        return event

    # -- internals -------------------------------------------------------------------------

    def _emit(self, cls: type[E], fields: dict[str, Any]) -> E:
        timestamp = self._clock()
        if timestamp.tzinfo is None:
            raise LogBuilderError(f"the builder's clock returned a naive datetime: {timestamp!r}")
        fields["instance_id"] = self._instance_id
        fields["position"] = self._position + 1
        fields["timestamp"] = timestamp
        event = trusted_event(cls, fields) if not self._validate else None
        if event is None:
            try:
                event = cls.model_validate(fields)
            except ValidationError as error:
                raise LogBuilderError(f"not a valid {cls.__name__}: {error}") from error
        self._position += 1  # only once the event exists: a refused call leaves no gap
        self._batch.append(event)
        return event

    def _in(self, superstep: str | None, run: str | None = None) -> dict[str, Any]:
        """The run and superstep fields of a superstep's event."""
        sid = superstep if superstep is not None else self._step
        if sid is None:
            raise LogBuilderError("no superstep is open: start_superstep() or name superstep=")
        run_id = self._run_of.get(sid)
        if run_id is None:
            if run is None:
                raise LogBuilderError(
                    f"superstep {sid!r} was never started: start it, or name its run= too"
                )
            run_id = run
        elif run is not None and run != run_id:
            raise LogBuilderError(f"superstep {sid!r} belongs to run {run_id!r}, not {run!r}")
        return {"run_id": run_id, "superstep_id": sid}

    def _by(
        self, executor_id: str | None, superstep: str | None, run: str | None
    ) -> dict[str, Any]:
        fields = self._in(superstep, run)
        fields["executor_id"] = (
            executor_id if executor_id is not None else self._executor(fields["superstep_id"])
        )
        return fields

    def _executor(self, superstep_id: str) -> str:
        try:
            return self._executor_of[superstep_id]
        except KeyError:
            raise LogBuilderError(
                f"no executor was invoked in superstep {superstep_id!r}: name executor_id="
            ) from None

    def _close(self, superstep_id: str) -> None:
        if self._step == superstep_id:
            self._step = None

    def _ending(self, run: str | None) -> str:
        run_id = run if run is not None else self._run
        if run_id is None:
            raise LogBuilderError("no run is open: start_run() or name run=")
        return run_id

    def _failed_step(self, run_id: str, superstep_id: str | _Unset | None) -> str | None:
        if superstep_id is _UNSET:
            return self._pending_of.get(run_id)
        return superstep_id

    def _end(self, cls: type[E], run_id: str, fields: dict[str, Any]) -> E:
        fields["run_id"] = run_id
        event = self._emit(cls, fields)
        if self._run == run_id:
            self._run = None
        if self._step is not None and self._run_of.get(self._step) == run_id:
            self._step = None
        return event

    @property
    def _encode(self) -> Callable[[Any, str], Any]:
        codec = self._codec
        if codec is None:
            return _as_is
        return lambda value, what: codec.encode(value, what=what)


def _as_is(value: Any, what: str) -> Any:
    return value


def _error_info(error: ErrorInfo | BaseException) -> ErrorInfo:
    return error if isinstance(error, ErrorInfo) else ErrorInfo.of(error)
