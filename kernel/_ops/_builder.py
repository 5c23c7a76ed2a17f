"""``WorkflowBuilder``: assemble executors and edges, validate, and bind to an instance stream."""

from __future__ import annotations

import contextlib
import itertools
import typing
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, Self

from kernel._base._clock import Clock, IdFactory, system_clock, uuid_ids
from kernel._base._errors import (
    DefinitionError,
    EdgeDuplicationError,
    GraphConnectivityError,
    ValidationTypeEnum,
    WorkflowValidationError,
)
from kernel._codec._valuetypes import value_classes
from kernel._define._executor import Executor, check_storable_types, require_storable
from kernel._define._functions import FunctionExecutor
from kernel._define._graph import (
    Case,
    Condition,
    Default,
    EdgeGroup,
    FanIn,
    FanOut,
    Graph,
    MultiSelection,
    OutputDesignation,
    Selection,
    Single,
    SwitchCase,
    can_yield,
    validate,
)
from kernel._ops._settings import DEFAULT_LEASE, InstanceSettings, check_patterns
from kernel._ops._workflow import Durability, Workflow
from kernel._run._hooks import RunHooks, chain_hooks
from kernel._run._instance import LeasePolicy
from kernel._run._snapshot import DEFAULT_SNAPSHOT_EVERY
from kernel._store._eventstore import EventStore
from kernel._store._factory import open_store

__all__ = ["WorkflowBuilder"]

ExecutorRef = Executor | str
OutputSelection = Sequence[ExecutorRef] | Literal["all", "all_other"] | None
"""``output_from=`` / ``intermediate_output_from=``: executors (or ids), ``"all"``, or (for
intermediate outputs) ``"all_other"``."""

_UNSET: Any = object()


class WorkflowBuilder:
    """Builds a ``Workflow``.

    ``store`` defaults to ``open_store()`` (``$STEPLOG_STORE``, else memory; with the keys of
    ``$STEPLOG_KEYS``, as every ``open_store`` without ``keyring=``); ``instance_id`` to a
    fresh id (exposed as ``workflow.instance_id``); ``clock`` and ``id_factory`` to the system
    clock and random ids. ``durability="superstep"`` appends each superstep in one atomic batch
    with its marker; ``"write"`` appends every event as it happens. ``sensitive_keys`` are state
    keys whose values readers show redacted (see ``with_sensitive_keys``).

    ``max_iterations`` is Agent Framework's name for ``max_supersteps`` (default 100); give one
    (or both, equal). ``description`` is kept on the workflow and in ``to_dict()``.

    ``output_from`` and ``intermediate_output_from`` designate, as in Agent Framework, whose
    ``yield_output`` values the caller gets as workflow outputs (``"output"`` events,
    ``get_outputs()``) and whose as intermediate outputs (``"intermediate"`` events,
    ``get_intermediate_outputs()``): each a list of executors (or ids), or ``"all"`` (every
    executor that may yield); ``intermediate_output_from="all_other"`` is every such executor not
    in ``output_from``. Give neither and every yield is a workflow output; give either and the
    yields of executors in neither are hidden from the caller. The log records every yield,
    whichever designation applies. ``output_executors`` is the older name of ``output_from``.

    A handler may send a message that no edge delivers (no outgoing edge, a ``target_id`` it is
    not connected to, no target with a handler for its type). As in AF, the message is then
    dropped and the run goes on; unlike AF, the drop is recorded (``MessageStaged.dropped``) and
    shown by history and ``steplog log``. ``strict_routing=True`` fails the superstep (and the
    run) with ``RoutingError`` instead.
    """

    def __init__(
        self,
        start_executor: Executor | None = None,
        *,
        store: EventStore | None = None,
        instance_id: str | None = None,
        name: str | None = None,
        max_supersteps: int | None = None,
        durability: Durability = "superstep",
        clock: Clock | None = None,
        id_factory: IdFactory | None = None,
        sensitive_keys: Iterable[str] = (),
        max_iterations: int | None = None,
        description: str | None = None,
        output_from: OutputSelection = _UNSET,
        intermediate_output_from: OutputSelection = _UNSET,
        output_executors: OutputSelection = _UNSET,
        strict_routing: bool = False,
    ) -> None:
        self._strict_routing = strict_routing
        self._executors: dict[str, Executor] = {}
        self._groups: list[EdgeGroup] = []
        self._start: str | None = None
        self._store = store
        self._instance_id = instance_id
        self._name = name
        self._max_supersteps = _max_supersteps(max_supersteps, max_iterations)
        if description is not None and not isinstance(description, str):
            raise DefinitionError(f"description must be a string, got {description!r}")
        self._description = description
        self._output_from, self._intermediate_from = _selections(
            output_from, intermediate_output_from, output_executors
        )
        self._durability = durability
        self._clock = clock or system_clock
        self._ids = id_factory or uuid_ids
        self._value_types: list[type] = []
        self._lease = DEFAULT_LEASE
        self._snapshot_every = DEFAULT_SNAPSHOT_EVERY
        self._sensitive: list[str] = []
        self._hooks: list[RunHooks] = []
        self.with_sensitive_keys(*_pattern_list(sensitive_keys))
        if start_executor is not None:
            self.set_start_executor(start_executor)

    # -- executors ----------------------------------------------------------------------------

    def set_start_executor(self, executor: ExecutorRef) -> Self:
        """The executor that receives the run's input message."""
        self._start = self._register(executor)
        return self

    def add_executor(self, executor: Executor) -> Self:
        self._register(executor)
        return self

    def _register(self, executor: ExecutorRef) -> str:
        if isinstance(executor, str):
            if executor not in self._executors:
                raise GraphConnectivityError(
                    f"unknown executor {executor!r}: pass the Executor object the first time it is "
                    f"used (known: {', '.join(sorted(self._executors)) or 'none'})"
                )
            return executor
        if not isinstance(executor, Executor):
            raise DefinitionError(
                f"expected an Executor or an executor id, got {type(executor).__qualname__}"
            )
        existing = self._executors.get(executor.id)
        if existing is not None and existing is not executor:
            raise WorkflowValidationError(
                f"two different executors share the id {executor.id!r}: give each its own id, "
                "or pass the same object everywhere",
                ValidationTypeEnum.EXECUTOR_DUPLICATION,
            )
        self._executors[executor.id] = executor
        return executor.id

    # -- edges --------------------------------------------------------------------------------

    def add_edge(
        self,
        source: ExecutorRef,
        target: ExecutorRef,
        condition: Condition | None = None,
    ) -> Self:
        """Messages from ``source`` go to ``target`` (when ``condition(message)`` is true).

        ``condition`` may be sync or async (``async def``); an async one is awaited.
        """
        return self._add(Single(self._register(source), self._register(target), condition))

    def add_fan_out_edges(self, source: ExecutorRef, targets: Sequence[ExecutorRef]) -> Self:
        """Each message from ``source`` goes to every target that handles its type."""
        ids = tuple(self._register(t) for t in targets)
        source_id = self._register(source)
        self._require_distinct("fan-out targets", ids, lambda t: f"{source_id}->{t}")
        return self._add(FanOut(source_id, ids))

    def add_fan_in_edges(self, sources: Sequence[ExecutorRef], target: ExecutorRef) -> Self:
        """``target`` runs once every source has sent, receiving the list of their messages."""
        ids = tuple(self._register(s) for s in sources)
        target_id = self._register(target)
        self._require_distinct("fan-in sources", ids, lambda s: f"{s}->{target_id}")
        return self._add(FanIn(ids, target_id))

    def add_switch_case_edge_group(
        self, source: ExecutorRef, cases: Sequence[Case | Default]
    ) -> Self:
        """Each message from ``source`` goes to the first matching ``Case``, else to ``Default``."""
        branches: list[tuple[Condition, str]] = []
        default: str | None = None
        for case in cases:
            if default is not None:
                # AF would send everything after a Default to the Default, unseen.
                raise _shape(
                    "a switch-case edge group takes one Default, as its last entry: the Cases "
                    "after it would never be tried"
                )
            if isinstance(case, Default):
                default = self._register(case.target)
            elif isinstance(case, Case):
                branches.append((case.condition, self._register(case.target)))
            else:
                raise _shape(f"switch-case entries must be Case or Default, got {case!r}")
        if not branches:
            raise _shape("a switch-case edge group needs at least one Case")
        if default is None:
            raise _shape(
                "a switch-case edge group needs a Default as its last entry (as in AF), for the "
                "messages no Case matches: add Default(target=...)"
            )
        return self._add(SwitchCase(self._register(source), tuple(branches), default))

    def add_multi_selection_edge_group(
        self,
        source: ExecutorRef,
        targets: Sequence[ExecutorRef],
        selection_func: Selection,
    ) -> Self:
        """Each message from ``source`` goes to the targets ``selection_func(message, ids)``
        picks: it gets the message and the target ids in the order given here, and returns the
        ids that receive the message (several, one, or none), sync or async. A target named
        twice receives the message once; a selected target with no handler for the message's
        type is skipped. A result that is not a subset of the ids is a ``RoutingError`` of the
        sender's superstep."""
        if not callable(selection_func):
            raise DefinitionError(
                f"selection_func must be a function (message, target_ids) -> target_ids, got "
                f"{selection_func!r}"
            )
        ids = tuple(self._register(t) for t in targets)
        source_id = self._register(source)
        self._require_distinct("multi-selection targets", ids, lambda t: f"{source_id}->{t}")
        return self._add(MultiSelection(source_id, ids, selection_func))

    def add_chain(self, executors: Sequence[ExecutorRef]) -> Self:
        """Edges ``executors[0] -> executors[1] -> ...``."""
        if len(executors) < 2:
            raise _shape("a chain needs at least two executors")
        for source, target in itertools.pairwise(executors):
            self.add_edge(source, target)
        return self

    def _add(self, group: EdgeGroup) -> Self:
        new_pairs = {(s, t) for s in group.sources for t in group.targets}
        for existing in self._groups:
            clash = new_pairs & {(s, t) for s in existing.sources for t in existing.targets}
            if clash:
                source, target = sorted(clash)[0]
                raise EdgeDuplicationError(
                    f"{source}->{target}",
                    f"duplicate edge {source}->{target}: two executors are joined by one edge "
                    "at most. Remove the second one; to route by several conditions, use one "
                    "condition or a switch-case edge group",
                )
        self._groups.append(group)
        return self

    @staticmethod
    def _require_distinct(what: str, ids: tuple[str, ...], edge: Callable[[str], str]) -> None:
        if not ids:
            raise _shape(f"{what} must not be empty")
        if len(set(ids)) != len(ids):
            twice = next(i for i in ids if ids.count(i) > 1)
            raise EdgeDuplicationError(
                edge(twice), f"{what} must be distinct, got {list(ids)}: {twice!r} is there twice"
            )

    # -- leases -------------------------------------------------------------------------------

    def with_lease(
        self, *, ttl: float = DEFAULT_LEASE.ttl, wait: float = DEFAULT_LEASE.wait
    ) -> Self:
        """How a run holds its instance's lease (one writer per instance, across processes).

        A run takes the lease before it appends anything and renews it every ``ttl / 3``
        seconds; a lease not renewed for ``ttl`` seconds, or whose process is gone, is taken over
        by the next run (which aborts the open superstep as ``crashed`` first). A run that finds
        a live holder waits up to ``wait`` seconds, then raises ``RunInProgressError``.
        """
        self._lease = LeasePolicy(ttl, wait)  # checks both (DefinitionError)
        return self

    # -- snapshots ----------------------------------------------------------------------------

    def with_snapshots(self, *, every: int = DEFAULT_SNAPSHOT_EVERY) -> Self:
        """How often a run keeps a snapshot of the instance's view beside the log: every
        ``every`` committed supersteps, and at its end. An open, a new run or a resume then folds
        only the log after the latest snapshot (checked against the hash chain first; a bad one
        is ignored). ``every=0``: no snapshot is taken or read. Raises ``DefinitionError`` for a
        negative or non-int ``every``."""
        self._snapshot_every = every
        return self

    # -- sensitive keys -----------------------------------------------------------------------

    def with_sensitive_keys(self, *patterns: str) -> Self:
        """Mark state keys sensitive: each pattern is an exact key or an ``fnmatch`` glob
        (``"secret_*"``, matched case-sensitively). Every run records the patterns in its
        ``RunStarted.sensitive_keys``, and the readers of ``projections`` (the ``steplog``
        command included) show the values of the matching keys of the instance redacted, for
        every run of it, unless asked to reveal them. The values are still written to the log as
        they are (encrypt the log for secrecy at rest: ``open_store(url, keyring=...)``).

        Adds to the patterns given before. Raises ``DefinitionError`` for a pattern that is not
        a non-empty string.
        """
        for pattern in check_patterns(patterns):
            if pattern not in self._sensitive:
                self._sensitive.append(pattern)
        return self

    # -- hooks --------------------------------------------------------------------------------

    def with_hooks(self, *hooks: RunHooks) -> Self:
        """Have every run of the workflow call ``hooks`` (``RunHooks``), in this order, after any
        given before; its sub-workflows' runs call them too. Raises ``DefinitionError`` for an
        argument that is not a ``RunHooks``, or one with an ``async def`` hook method."""
        chain_hooks(hooks)  # the one check of what a hook may be
        self._hooks.extend(hooks)
        return self

    # -- value types --------------------------------------------------------------------------

    def register_types(self, *types: Any) -> Self:
        """Let values of these classes be rebuilt when the log is read (see ``ValueCodec``).

        The enums, pydantic models and dataclasses that handlers accept, send and yield are
        registered by ``build()`` already; name here the others kept in state. Each argument is a
        class or an annotation (``list[Order] | None``). Raises ``DefinitionError`` for one that
        holds no such class.
        """
        for annotation in types:
            found = value_classes(annotation)
            if not found:
                raise DefinitionError(
                    f"cannot register {annotation!r}: it holds no enum, pydantic model or dataclass"
                )
            self._value_types.extend(found)
        return self

    # -- build --------------------------------------------------------------------------------

    def build(self) -> Workflow:
        """Validate the graph and bind it to its instance stream. Raises ``DefinitionError``."""
        if self._start is None:
            raise DefinitionError(
                "no start executor: pass start_executor= or call set_start_executor()"
            )
        settings = InstanceSettings(  # checks every setting (DefinitionError)
            instance_id=self._ids() if self._instance_id is None else self._instance_id,
            name=self._name or self._start,
            max_supersteps=self._max_supersteps,
            durability=self._durability,
            clock=self._clock,
            id_factory=self._ids,
            lease=self._lease,
            snapshot_every=self._snapshot_every,
            sensitive_keys=tuple(self._sensitive),
            hooks=tuple(self._hooks),
        )
        for executor in self._executors.values():
            executor.handlers  # noqa: B018 - resolves annotations, raising DefinitionError early
            check_storable_types(executor)  # a declared type the log can never hold
        if self._description is not None:
            require_storable(self._description, "a workflow description")
        graph = Graph(
            dict(self._executors),
            self._start,
            tuple(self._groups),
            self._designation(),
            self._description,
            bool(self._strict_routing),
        )
        validate(graph)
        store = self._store if self._store is not None else open_store()
        store.codec.register(
            *self._value_types, *value_classes(*_handler_annotations(self._executors.values()))
        )
        return Workflow(graph, store=store, settings=settings)

    def _designation(self) -> OutputDesignation:
        """``output_from`` and ``intermediate_output_from``, resolved over the executors."""
        outputs = self._designated(self._output_from, "output_from", ())
        intermediates = self._designated(
            self._intermediate_from, "intermediate_output_from", outputs or ()
        )
        if outputs is None and intermediates is None:
            return OutputDesignation()
        outputs, intermediates = outputs or [], intermediates or []
        if not outputs and not intermediates:
            raise WorkflowValidationError(
                "the output designation names no executor: list at least one in output_from= "
                "or intermediate_output_from=, or give neither (every yield is then an output)",
                ValidationTypeEnum.OUTPUT_VALIDATION,
            )
        for what, ids in (("output_from", outputs), ("intermediate_output_from", intermediates)):
            twice = sorted({i for i in ids if ids.count(i) > 1})
            if twice:
                raise WorkflowValidationError(
                    f"{what} names {twice} more than once: list each executor once",
                    ValidationTypeEnum.OUTPUT_VALIDATION,
                )
        return OutputDesignation(frozenset(outputs), frozenset(intermediates))

    def _designated(
        self, selection: OutputSelection, what: str, others: Sequence[str]
    ) -> list[str] | None:
        if selection is None:
            return None
        if isinstance(selection, str):
            capable = [i for i, e in self._executors.items() if can_yield(e)]
            if selection == "all":
                return capable
            if selection == "all_other" and what == "intermediate_output_from":
                return [i for i in capable if i not in others]
            allowed = "'all', 'all_other'" if what == "intermediate_output_from" else "'all'"
            raise DefinitionError(
                f"{what}={selection!r} is not a designation: give a list of executors, or {allowed}"
            )
        ids: list[str] = []
        for item in selection:
            if isinstance(item, Executor):
                ids.append(item.id)
            elif isinstance(item, str):
                ids.append(item)
            else:
                raise DefinitionError(f"{what} lists {item!r}: give executors or executor ids")
        return ids


def _max_supersteps(max_supersteps: int | None, max_iterations: int | None) -> int:
    """``max_supersteps=``, or Agent Framework's ``max_iterations=``; both only if equal."""
    if max_supersteps is None:
        return 100 if max_iterations is None else max_iterations
    if max_iterations is not None and max_iterations != max_supersteps:
        raise DefinitionError(
            f"max_supersteps={max_supersteps!r} and max_iterations={max_iterations!r} disagree: "
            "they are one setting (max_iterations is Agent Framework's name); give one"
        )
    return max_supersteps


def _selections(
    output_from: OutputSelection,
    intermediate_from: OutputSelection,
    output_executors: OutputSelection,
) -> tuple[OutputSelection, OutputSelection]:
    """The output and intermediate selections, ``output_executors`` read as ``output_from``."""
    if output_executors is not _UNSET:
        if output_from is not _UNSET:
            raise DefinitionError(
                "output_executors is the older name of output_from: give only output_from"
            )
        warnings.warn(
            "output_executors= is the older name of output_from=; use output_from=",
            DeprecationWarning,
            stacklevel=3,
        )
        output_from = output_executors
    return (
        None if output_from is _UNSET else output_from,
        None if intermediate_from is _UNSET else intermediate_from,
    )


def _shape(message: str) -> WorkflowValidationError:
    """The error for an edge group of the wrong shape."""
    return WorkflowValidationError(message, ValidationTypeEnum.EDGE_GROUP)


def _pattern_list(patterns: Iterable[str]) -> list[str]:
    """``sensitive_keys=`` as a list; a lone string is refused (it would be read letter by
    letter)."""
    if isinstance(patterns, str | bytes):
        raise DefinitionError(
            f"sensitive_keys must be a list of patterns, not one string: use [{patterns!r}]"
        )
    try:
        return list(patterns)
    except TypeError:
        raise DefinitionError(
            f"sensitive_keys must be a list of patterns, got {patterns!r}"
        ) from None


def _handler_annotations(executors: Iterable[Executor]) -> list[Any]:
    """Every type the handlers name: what they accept, send and yield, generics included."""
    found: list[Any] = []
    from kernel._ops._subworkflow import WorkflowExecutor  # it imports the workflow, as this does

    for executor in executors:
        if isinstance(executor, WorkflowExecutor):
            found.extend(executor.value_types())
        for spec in executor.handlers:
            found.extend((spec.accepts or ()) + (spec.sends or ()) + (spec.yields or ()))
            found.extend((spec.input_type, *spec.output_types, *spec.workflow_output_types))
            method = (
                executor.func
                if isinstance(executor, FunctionExecutor)
                else getattr(executor, spec.name, None)
            )
            with contextlib.suppress(NameError, TypeError):  # named with @handler(input=...)
                found.extend(typing.get_type_hints(method).values())
        for rspec in executor.response_handlers:
            found.extend((rspec.requests or ()) + (rspec.responses or ()))
    return found
