"""The workflow graph: edge groups, routing of sent messages, and validation at ``build()``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kernel._errors import DefinitionError, RoutingError
from kernel._executor import Executor

__all__ = ["Case", "Default", "EdgeGroup", "FanIn", "FanOut", "Graph", "Single", "SwitchCase"]

Condition = Callable[[Any], bool]


@dataclass(frozen=True)
class Case:
    """A switch-case branch: messages for which ``condition`` is true go to ``target``."""

    condition: Condition
    target: Executor | str


@dataclass(frozen=True)
class Default:
    """The branch of a switch-case edge group taken when no ``Case`` matches."""

    target: Executor | str


@dataclass(frozen=True)
class Single:
    source: str
    target: str
    condition: Condition | None = None

    @property
    def sources(self) -> tuple[str, ...]:
        return (self.source,)

    @property
    def targets(self) -> tuple[str, ...]:
        return (self.target,)


@dataclass(frozen=True)
class FanOut:
    source: str
    targets: tuple[str, ...]

    @property
    def sources(self) -> tuple[str, ...]:
        return (self.source,)


@dataclass(frozen=True)
class FanIn:
    """The target runs once every source has sent; it receives the list of their messages."""

    sources: tuple[str, ...]
    target: str

    @property
    def targets(self) -> tuple[str, ...]:
        return (self.target,)


@dataclass(frozen=True)
class SwitchCase:
    source: str
    cases: tuple[tuple[Condition, str], ...]
    default: str | None

    @property
    def sources(self) -> tuple[str, ...]:
        return (self.source,)

    @property
    def targets(self) -> tuple[str, ...]:
        branch_targets = tuple(target for _, target in self.cases)
        return branch_targets + ((self.default,) if self.default is not None else ())


EdgeGroup = Single | FanOut | FanIn | SwitchCase


@dataclass
class Delivery:
    """Where one sent message goes: direct targets now, and fan-in groups that buffer it."""

    targets: list[str] = field(default_factory=list)
    fan_ins: list[FanIn] = field(default_factory=list)


@dataclass(frozen=True)
class Graph:
    """A validated graph: executors by id, the start executor, and edge groups by source."""

    executors: dict[str, Executor]
    start: str
    groups: tuple[EdgeGroup, ...]
    # Deliveries that depend only on the message's type (no conditions on the source's edges).
    _by_type: dict[tuple[str, type, str | None], Delivery] = field(
        default_factory=dict, compare=False, repr=False
    )

    def outgoing(self, source: str) -> list[EdgeGroup]:
        return [g for g in self.groups if source in g.sources]

    def route(self, source: str, message: object, target_id: str | None) -> Delivery:
        """Decide where a message sent by ``source`` goes. Raises ``RoutingError`` if it cannot.

        The returned ``Delivery`` is shared between calls: treat it as read-only.
        """
        key = (source, type(message), target_id)
        cached = self._by_type.get(key)
        if cached is not None:
            return cached
        delivery = self._route(source, message, target_id)
        if all(_type_only(g) for g in self.outgoing(source)):
            self._by_type[key] = delivery
        return delivery

    def _route(self, source: str, message: object, target_id: str | None) -> Delivery:
        groups = self.outgoing(source)
        if not groups:
            raise RoutingError(f"executor {source!r} sent a message but has no outgoing edges")
        if target_id is not None and all(target_id not in g.targets for g in groups):
            raise RoutingError(
                f"executor {source!r} sent a message to {target_id!r}, but no edge connects them"
            )
        delivery = Delivery()
        typed = False  # some edge could carry this message's type
        for group in groups:
            for target in self._candidates(group, message):
                if target_id is not None and target != target_id:
                    continue
                if isinstance(group, FanIn):
                    typed = True
                    delivery.fan_ins.append(group)
                elif self.executors[target].can_handle(message):
                    typed = True
                    if target not in delivery.targets:
                        delivery.targets.append(target)
            if not typed and self._type_reachable(group, message, target_id):
                typed = True
        if not typed:
            raise RoutingError(
                f"executor {source!r} sent a {type(message).__qualname__}, which no target "
                f"connected to it handles ({', '.join(sorted(_all_targets(groups)))})"
            )
        return delivery

    def _candidates(self, group: EdgeGroup, message: object) -> list[str]:
        if isinstance(group, Single):
            if group.condition is not None and not group.condition(message):
                return []
            return [group.target]
        if isinstance(group, FanOut):
            return list(group.targets)
        if isinstance(group, FanIn):
            return [group.target]
        for condition, target in group.cases:
            if condition(message):
                return [target]
        return [group.default] if group.default is not None else []

    def _type_reachable(self, group: EdgeGroup, message: object, target_id: str | None) -> bool:
        """True when a condition (not the message's type) kept the message from every target."""
        return any(
            self.executors[t].can_handle(message)
            for t in group.targets
            if target_id is None or t == target_id
        )


def _type_only(group: EdgeGroup) -> bool:
    """Whether the group routes by the message's type alone (no condition to evaluate)."""
    return isinstance(group, FanOut | FanIn) or (
        isinstance(group, Single) and group.condition is None
    )


def _all_targets(groups: list[EdgeGroup]) -> set[str]:
    return {target for group in groups for target in group.targets}


def validate(graph: Graph) -> None:
    """Reject edges that can never deliver, and handlers that can never receive a message."""
    _check_edges(graph)
    _check_handlers(graph)


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
                raise DefinitionError(
                    f"handler {target}.{spec.name} accepts {accepted}, but no edge into "
                    f"{target!r} ever carries that: it can never receive a message"
                )


def _check_edges(graph: Graph) -> None:
    """Reject edges whose source never sends a type the target handles."""
    for group in graph.groups:
        for source in group.sources:
            sent = _sent_types(graph.executors[source])
            if sent is None:
                continue
            for target in group.targets:
                if isinstance(group, FanIn):
                    if not _handles(graph.executors[target], list):
                        raise DefinitionError(
                            f"fan-in edge {source!r} -> {target!r} delivers a list, but "
                            f"{target!r} has no handler for list"
                        )
                    continue
                if not sent:
                    raise DefinitionError(
                        f"edge {source!r} -> {target!r} can never deliver: {source!r} declares "
                        "that it sends nothing (WorkflowContext[Never])"
                    )
                if not any(_handles(graph.executors[target], kind) for kind in sent):
                    names = ", ".join(k.__qualname__ for k in sent)
                    raise DefinitionError(
                        f"edge {source!r} -> {target!r} can never deliver: {source!r} sends "
                        f"{names}, and no handler of {target!r} accepts that"
                    )


def _sent_types(executor: Executor) -> tuple[type, ...] | None:
    kinds: list[type] = []
    for spec in executor.handlers:
        if spec.sends is None:
            return None
        kinds.extend(spec.sends)
    return tuple(kinds)


def _handles(executor: Executor, kind: type) -> bool:
    return any(spec.accepts_type(kind) for spec in executor.handlers)


def ids_of(items: Sequence[Executor | str]) -> tuple[str, ...]:
    return tuple(item if isinstance(item, str) else item.id for item in items)
