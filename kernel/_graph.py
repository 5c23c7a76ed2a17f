"""The workflow graph: executors, edge groups, and their validation at ``build()``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kernel._errors import (
    GraphConnectivityError,
    TypeCompatibilityError,
    ValidationTypeEnum,
    WorkflowValidationError,
)
from kernel._executor import Executor

__all__ = [
    "Case",
    "Condition",
    "Default",
    "EdgeGroup",
    "FanIn",
    "FanOut",
    "Graph",
    "Single",
    "SwitchCase",
    "validate",
]

Condition = Callable[[Any], bool | Awaitable[bool]]
"""An edge condition or switch-case predicate: ``condition(message)``, sync or async."""


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


EdgeGroup = Single | FanOut | FanIn | SwitchCase


@dataclass(frozen=True)
class Graph:
    """A validated graph: executors by id, the start executor, and the edge groups.

    Routing over it lives in ``kernel._algo.Router``. ``strict_routing`` fails a run whose
    handler sends a message no edge delivers (``RoutingError``); else the message is dropped,
    and the drop recorded in the log (``MessageStaged.dropped``).
    """

    executors: dict[str, Executor]
    start: str
    groups: tuple[EdgeGroup, ...]
    strict_routing: bool = False


def validate(graph: Graph) -> None:
    """Reject edges that can never deliver, executors that can never run, and handlers that can
    never receive a message (``WorkflowValidationError``s, in AF's order of checks)."""
    _check_edges(graph)
    _check_connectivity(graph)
    _check_handlers(graph)


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


def _check_handlers(graph: Graph) -> None:
    """A handler of a non-start executor must accept some type an incoming edge can carry."""
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
        if target == graph.start or target in unknown:
            continue
        for spec in graph.executors[target].handlers:
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
    for spec in executor.handlers:
        if spec.sends is None:
            return None
        kinds.extend(spec.sends)
    return tuple(kinds)


def _taken_types(executor: Executor) -> list[Any]:
    """The types the handlers of ``executor`` accept (``Any`` for one that takes anything)."""
    return [kind for spec in executor.handlers for kind in (spec.accepts or (Any,))]


def _handles(executor: Executor, kind: type) -> bool:
    return any(spec.accepts_type(kind) for spec in executor.handlers)
