"""The workflow graph: executors, edge groups, and their validation at ``build()``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from kernel._base._errors import (
    GraphConnectivityError,
    TypeCompatibilityError,
    ValidationTypeEnum,
    WorkflowValidationError,
)
from kernel._define._executor import Executor

__all__ = [
    "Case",
    "Condition",
    "Default",
    "EdgeGroup",
    "FanIn",
    "FanOut",
    "Graph",
    "MultiSelection",
    "OutputDesignation",
    "OutputKind",
    "Selection",
    "Single",
    "SwitchCase",
    "can_yield",
    "validate",
]

Condition = Callable[[Any], bool | Awaitable[bool]]
"""An edge condition or switch-case predicate: ``condition(message)``, sync or async."""

Selection = Callable[[Any, list[str]], Sequence[str] | Awaitable[Sequence[str]]]
"""A multi-selection function: ``selection(message, target_ids)`` returns the ids of the targets
that receive the message (a subset of ``target_ids``), sync or async."""

OutputKind = Literal["output", "intermediate", "hidden"]
"""What a ``yield_output`` value is to the caller: a workflow output, an intermediate output, or
hidden (recorded in the log, shown to no caller)."""


@dataclass(frozen=True)
class Case:
    """A switch-case branch: messages for which ``condition`` is true go to ``target``.

    ``condition`` may be sync or async (``async def``); an async one is awaited.
    """

    condition: Condition
    target: Executor | str


@dataclass(frozen=True)
class Default:
    """The branch of a switch-case edge group taken when no ``Case`` matches."""

    target: Executor | str


class _FromOne:
    """An edge group with one source."""

    source: str

    @property
    def sources(self) -> tuple[str, ...]:
        return (self.source,)


class _ToOne:
    """An edge group with one target."""

    target: str

    @property
    def targets(self) -> tuple[str, ...]:
        return (self.target,)


@dataclass(frozen=True)
class Single(_FromOne, _ToOne):
    source: str
    target: str
    condition: Condition | None = None


@dataclass(frozen=True)
class FanOut(_FromOne):
    source: str
    targets: tuple[str, ...]


@dataclass(frozen=True)
class FanIn(_ToOne):
    """The target runs once every source has sent; it receives the list of their messages."""

    sources: tuple[str, ...]
    target: str


@dataclass(frozen=True)
class SwitchCase(_FromOne):
    source: str
    cases: tuple[tuple[Condition, str], ...]
    default: str | None

    @property
    def targets(self) -> tuple[str, ...]:
        branch_targets = tuple(target for _, target in self.cases)
        return branch_targets + ((self.default,) if self.default is not None else ())


@dataclass(frozen=True)
class MultiSelection(_FromOne):
    """Each message goes to the targets ``selection(message, list(targets))`` names."""

    source: str
    targets: tuple[str, ...]
    selection: Selection


EdgeGroup = Single | FanOut | FanIn | SwitchCase | MultiSelection


@dataclass(frozen=True)
class OutputDesignation:
    """Which executors' ``yield_output`` values are workflow outputs, and which intermediate.

    ``outputs`` None is the default: every yield is a workflow output. Otherwise the yields of
    ``outputs`` are workflow outputs, those of ``intermediates`` intermediate outputs, and any
    other executor's are hidden from the caller (the log records them all).
    """

    outputs: frozenset[str] | None = None
    intermediates: frozenset[str] = frozenset()

    def classify(self, executor_id: str) -> OutputKind:
        if self.outputs is None or executor_id in self.outputs:
            return "output"
        return "intermediate" if executor_id in self.intermediates else "hidden"


@dataclass(frozen=True)
class Graph:
    """A validated graph: executors by id, the start executor, and the edge groups.

    Routing over it lives in ``kernel._run._algo.Router``. ``strict_routing`` fails a run whose
    handler sends a message no edge delivers (``RoutingError``); else the message is dropped,
    and the drop recorded in the log (``MessageStaged.dropped``).
    """

    executors: dict[str, Executor]
    start: str
    groups: tuple[EdgeGroup, ...]
    outputs: OutputDesignation = field(default_factory=OutputDesignation)
    description: str | None = None
    strict_routing: bool = False


def validate(graph: Graph) -> None:
    """Reject edges that can never deliver, executors that can never run, handlers that can
    never receive a message, and output designations that cannot hold
    (``WorkflowValidationError``s, in AF's order of checks)."""
    _check_edges(graph)
    _check_connectivity(graph)
    _check_handlers(graph)
    _check_outputs(graph.outputs, graph.executors)


def _check_connectivity(graph: Graph) -> None:
    """Every executor must be reachable from the start executor along edges (AF's check)."""
    following: dict[str, list[str]] = {}
    for group in graph.groups:
        for source in group.sources:
            following.setdefault(source, []).extend(group.targets)
    reached = {graph.start}
    frontier = [graph.start]
    while frontier:
        for target in following.get(frontier.pop(), ()):
            if target not in reached:
                reached.add(target)
                frontier.append(target)
    unreached = sorted(set(graph.executors) - reached)
    if not unreached:
        return
    if graph.start not in following:
        raise GraphConnectivityError(
            f"the start executor {graph.start!r} has no outgoing edge, so {unreached} can never "
            f"run: add an edge from {graph.start!r}, or make the executor the edges begin at the "
            "start executor"
        )
    raise GraphConnectivityError(
        f"executors {unreached} are unreachable from the start executor {graph.start!r}: no "
        "chain of edges leads to them, so they would never run. Add an edge to each from an "
        "executor that is reached, or leave them out of the workflow"
    )


def can_yield(executor: Executor) -> bool:
    """Whether an executor may yield workflow outputs: some handler declares an output type, or
    leaves it open (a bare ``WorkflowContext``). ``WorkflowContext[T]`` declares it yields none."""
    return any(spec.yields is None or spec.yields for spec in executor.handlers)


def _check_outputs(designation: OutputDesignation, executors: dict[str, Executor]) -> None:
    """Designated executors must be in the graph, able to yield, and designated once."""
    outputs = designation.outputs or frozenset()
    both = sorted(outputs & designation.intermediates)
    if both:
        raise WorkflowValidationError(
            f"executors {both} are designated both as output and as intermediate executors: "
            "list each in output_from= or in intermediate_output_from=, not both",
            ValidationTypeEnum.OUTPUT_VALIDATION,
        )
    for role, ids in (("output", outputs), ("intermediate", designation.intermediates)):
        for executor_id in sorted(ids):
            executor = executors.get(executor_id)
            if executor is None:
                raise WorkflowValidationError(
                    f"{role} executor {executor_id!r} is not in the workflow graph: add it with "
                    "an edge, or leave it out of the designation",
                    ValidationTypeEnum.OUTPUT_VALIDATION,
                )
            if not can_yield(executor):
                raise WorkflowValidationError(
                    f"{role} executor {executor_id!r} declares that it yields no workflow "
                    "outputs (every handler's context is WorkflowContext[T] or "
                    "WorkflowContext[T, Never]): declare its output type, "
                    "WorkflowContext[T, Output]",
                    ValidationTypeEnum.OUTPUT_VALIDATION,
                )


def _check_handlers(graph: Graph) -> None:
    """A handler of a non-start executor must accept some type an incoming edge can carry (unless
    the executor's handlers are alternatives: ``Executor.handlers_are_alternatives``)."""
    incoming: dict[str, list[type]] = {}
    unknown: set[str] = set()  # targets with a source whose sent types are not declared
    for group in graph.groups:
        for target in group.targets:
            kinds = incoming.setdefault(target, [])
            if isinstance(group, FanIn):
                kinds.append(list)
                continue
            for source in group.sources:
                sent = _sent_types(graph.executors[source])
                if sent is None:
                    unknown.add(target)
                else:
                    kinds.extend(sent)
    for target, kinds in incoming.items():
        executor = graph.executors[target]
        if target == graph.start or target in unknown or executor.handlers_are_alternatives:
            continue
        for spec in executor.handlers:
            if spec.accepts is not None and not any(spec.accepts_type(k) for k in kinds):
                accepted = ", ".join(t.__qualname__ for t in spec.accepts) or "nothing"
                raise WorkflowValidationError(
                    f"handler {target}.{spec.name} accepts {accepted}, but no edge into "
                    f"{target!r} ever carries that: it can never receive a message. Remove the "
                    "handler, or connect a source that sends that type",
                    ValidationTypeEnum.TYPE_COMPATIBILITY,
                )


def _check_edges(graph: Graph) -> None:
    """Reject edges whose source never sends a type the target handles."""
    for group in graph.groups:
        for source in group.sources:
            sent = _sent_types(graph.executors[source])
            if sent is None:
                continue
            for target in group.targets:
                taken = _taken_types(graph.executors[target])
                if isinstance(group, FanIn):
                    if not _handles(graph.executors[target], list):
                        raise TypeCompatibilityError(
                            source,
                            target,
                            [list],
                            taken,
                            f"fan-in edge {source!r} -> {target!r} delivers a list, but "
                            f"{target!r} has no handler for list: give it a handler taking "
                            "list[...]",
                        )
                    continue
                if not sent:
                    raise TypeCompatibilityError(
                        source,
                        target,
                        [],
                        taken,
                        f"edge {source!r} -> {target!r} can never deliver: {source!r} declares "
                        "that it sends nothing (WorkflowContext[Never]); declare what it sends "
                        "(WorkflowContext[T]), or remove the edge",
                    )
                if not any(_handles(graph.executors[target], kind) for kind in sent):
                    names = ", ".join(k.__qualname__ for k in sent)
                    raise TypeCompatibilityError(
                        source,
                        target,
                        list(sent),
                        taken,
                        f"edge {source!r} -> {target!r} can never deliver: {source!r} sends "
                        f"{names}, and no handler of {target!r} accepts that; add a handler "
                        f"for it to {target!r}, or connect {source!r} to an executor that takes it",
                    )


def _sent_types(executor: Executor) -> tuple[type, ...] | None:
    kinds: list[type] = []
    declared = [s.sends for s in executor.handlers]
    declared.extend(s.sends for s in executor.response_handlers)  # they send too
    for sends in declared:
        if sends is None:
            return None
        kinds.extend(sends)
    return tuple(kinds)


def _taken_types(executor: Executor) -> list[Any]:
    """The types the handlers of ``executor`` accept (``Any`` for one that takes anything)."""
    return [kind for spec in executor.handlers for kind in (spec.accepts or (Any,))]


def _handles(executor: Executor, kind: type) -> bool:
    return any(spec.accepts_type(kind) for spec in executor.handlers)
