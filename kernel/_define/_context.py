"""``WorkflowContext``: what a handler may do in its superstep, and ``SuperstepPort``, the seam
it talks through.

A context hands every call to its superstep through ``SuperstepPort``: the definition layer says
what it needs, and the runner (``kernel._run._superstep.Superstep``) implements it, so nothing
here knows the runner.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, Literal, Never, Protocol

from typing_extensions import TypeVar

from kernel._base._errors import EncodingError
from kernel._base._ids import MAX_KEY_BYTES, check_id

if TYPE_CHECKING:
    from kernel._define._stream import WorkflowEvent

__all__ = ["SuperstepPort", "WorkflowContext", "port_of"]

OutT = TypeVar("OutT", default=Never)
WorkflowOutT = TypeVar("WorkflowOutT", default=Never)


class SuperstepPort(Protocol):
    """What a ``WorkflowContext`` asks of the superstep it belongs to.

    Every method refuses a call once the superstep is closed (committed, or aborted because a
    sibling failed or the run was cancelled) with ``StateWriteRejectedError``, and encodes what
    it accepts (``EncodingError`` for a value the log cannot store).
    """

    run_id: str
    instance_id: str
    index: int
    """The superstep's index within the run, from 1."""
    superstep_id: str

    @property
    def run_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of the run."""
        ...

    @property
    def streaming(self) -> bool:
        """Whether the run's caller streams its events (``run(..., stream=True)``)."""
        ...

    def send_routed(self, source: str, message: Any, target_id: str | None) -> bool:
        """Stage ``message`` from ``source`` if its route is known without evaluating anything
        (a route that depends on its type only, taken before); False, staging nothing, if not."""
        ...

    async def route_and_send(self, source: str, message: Any, target_id: str | None) -> None:
        """Route ``message`` (conditions evaluated, async ones awaited), then stage it. Raises
        ``RoutingError`` if no edge can take it."""
        ...

    def output(self, executor_id: str, value: Any) -> None:
        """Stage a workflow output of ``executor_id``."""
        ...

    def add_event(self, executor_id: str, event: WorkflowEvent[Any]) -> None:
        """Stage a custom event. Raises ``DefinitionError`` for what is not a ``WorkflowEvent``
        with a type of its own."""
        ...

    def request(
        self, executor_id: str, data: Any, response_type: Any, request_id: str | None = None
    ) -> str:
        """Stage a request for input; return its id. Raises ``DefinitionError`` unless the
        executor has a response handler for it."""
        ...

    def stage(self, executor_id: str, key: str, op: Literal["set", "delete"], value: Any) -> None:
        """Stage a write of state ``key`` (``value`` is ignored for ``"delete"``)."""
        ...

    def read(self, key: str, default: Any) -> Any:
        """Committed state overlaid with the superstep's staged writes."""
        ...


def port_of(ctx: WorkflowContext[Any, Any]) -> SuperstepPort:
    """The superstep ``ctx`` talks to: for the kernel's own executors that extend what a handler
    may do (a ``WorkflowExecutor`` runs its sub-workflow inside it), never for handlers."""
    return ctx._step


class WorkflowContext(Generic[OutT, WorkflowOutT]):
    """The handle a handler gets for one invocation.

    ``WorkflowContext[Out, WorkflowOut]``: ``Out`` is the type of messages it sends,
    ``WorkflowOut`` the type of outputs it yields. State writes are staged in the current superstep
    and count only if the superstep commits; once the superstep is closed (committed, or aborted
    because a sibling failed or the run was cancelled) every further write is refused with
    ``StateWriteRejectedError``.
    """

    __slots__ = ("_executor_id", "_step")

    def __init__(self, step: SuperstepPort, executor_id: str) -> None:
        self._step = step
        self._executor_id = executor_id

    @property
    def executor_id(self) -> str:
        return self._executor_id

    @property
    def run_id(self) -> str:
        return self._step.run_id

    @property
    def instance_id(self) -> str:
        return self._step.instance_id

    @property
    def superstep(self) -> int:
        """The index of the current superstep within the run, from 1."""
        return self._step.index

    @property
    def superstep_id(self) -> str:
        return self._step.superstep_id

    @property
    def run_kwargs(self) -> dict[str, Any]:
        """The keyword arguments given to ``workflow.run``."""
        return self._step.run_kwargs

    def is_streaming(self) -> bool:
        """Whether the run's caller streams its events (``workflow.run(..., stream=True)``, or
        ``resume(stream=True)``), as Agent Framework's ``is_streaming`` says. Outputs reach the
        caller when their superstep commits either way."""
        return self._step.streaming

    async def send_message(self, message: OutT, target_id: str | None = None) -> None:
        """Send ``message`` along this executor's edges (or to ``target_id`` only).

        It is delivered in the next superstep, and only if this one commits. Edge conditions are
        evaluated here (an async one is awaited); raises ``RoutingError`` if no edge can take it.
        """
        step, source = self._step, self._executor_id
        if not step.send_routed(source, message, target_id):
            await step.route_and_send(source, message, target_id)

    async def yield_output(self, output: WorkflowOutT) -> None:
        """Yield a workflow output; the caller receives it once this superstep commits."""
        self._step.output(self._executor_id, output)

    async def add_event(self, event: WorkflowEvent[Any]) -> None:
        """Add a custom event (``WorkflowEvent("progress", data)``) to the run's stream.

        It is recorded in the log (``CustomEventAdded``) and reaches the caller, like an output,
        once this superstep commits, with ``executor_id`` set to this executor; ``replay`` gives
        it back. Its ``type`` and ``data`` are what is kept: ``data`` must be storable (an
        exception is kept as its type and message). The runner's own types (``output``,
        ``status``, ...) are refused with ``DefinitionError``."""
        self._step.add_event(self._executor_id, event)

    async def request_info(
        self, request_data: Any, response_type: Any = None, *, request_id: str | None = None
    ) -> str:
        """Ask for input from outside the workflow; return the request's id.

        The request counts once this superstep commits: the caller then sees a ``request_info``
        event, and a run with nothing else to do ends waiting for input. ``run(responses=
        {request_id: value})``, in this process or a later one, delivers the response to this
        executor's ``@response_handler`` for the request's type and ``response_type``.
        ``request_id`` names the request instead of a fresh id (a ``WorkflowExecutor`` passes its
        sub-workflow's request on under the sub-workflow's id); it must be unique in the instance.
        """
        return self._step.request(self._executor_id, request_data, response_type, request_id)

    def set_state(self, key: str, value: Any) -> None:
        """Stage ``key = value``. Committed only if this superstep commits.

        A key is a non-empty ``str`` of valid Unicode, without NUL, of at most ``MAX_KEY_BYTES``
        UTF-8 bytes; another raises ``EncodingError`` (and the write is not staged)."""
        check_id(key, "state key", EncodingError, limit=MAX_KEY_BYTES)
        self._step.stage(self._executor_id, key, "set", value)

    def delete_state(self, key: str) -> None:
        """Stage the deletion of ``key`` (a key as ``set_state`` takes). Committed only if this
        superstep commits."""
        check_id(key, "state key", EncodingError, limit=MAX_KEY_BYTES)
        self._step.stage(self._executor_id, key, "delete", None)

    def get_state(self, key: str, default: Any = None) -> Any:
        """Committed state overlaid with this superstep's staged writes."""
        return self._step.read(key, default)

    def __repr__(self) -> str:
        return f"WorkflowContext(executor={self._executor_id!r}, superstep={self._step.index})"
