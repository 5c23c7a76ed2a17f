"""The step algebra: where a sent message goes, and what the next superstep receives. No I/O.

Between two supersteps a run stands at a ``Position``: the index of the next superstep, its inbox
(messages by target executor, in send order) and the fan-in buffers (what each fan-in group has
gathered from its sources so far). A superstep that commits moves the run on::

    position.after(sent)  ==  Position(index + 1, *deliver(sent, position.buffers))

``Router`` decides, when a handler sends, where the message goes (``Delivery``); ``deliver``
turns a committed superstep's ``Sent`` messages into the next inbox. Both are pure: the only code
they run that is not here is the graph's edge conditions and selection functions, which may be
sync or async. The runner's
loop (``_run._runner``) drives them and writes the log; this module can be tested, and a run's
position rebuilt, without a store.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kernel._base._errors import RoutingError
from kernel._define._graph import Condition, EdgeGroup, FanIn, FanOut, Graph, MultiSelection, Single
from kernel._log._events import DropReason
from kernel._log._requests import PendingRequest

__all__ = ["Delivery", "FanInBuffers", "Inbox", "Position", "Router", "Sent", "deliver"]

Inbox = dict[str, list[Any]]
"""Messages for the next superstep: target executor id -> messages, in send order."""

FanInBuffers = Mapping[FanIn, Mapping[str, tuple[Any, ...]]]
"""What each fan-in group has gathered: group -> source id -> messages, until all sources sent."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """Where one sent message goes: direct ``targets`` next superstep, and ``fan_ins`` that buffer
    it. ``logged`` is what ``MessageStaged.targets`` records: the direct targets, then the fan-in
    targets. An edge joins a source to a target at most once, so ``(source, logged)`` determines
    the delivery again from the graph. ``dropped`` says why a message that no edge delivers goes
    nowhere (then it has no targets; ``MessageStaged.dropped`` records it)."""

    targets: tuple[str, ...] = ()
    fan_ins: tuple[FanIn, ...] = ()
    dropped: DropReason | None = None
    logged: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        logged = self.targets + tuple(group.target for group in self.fan_ins)
        object.__setattr__(self, "logged", logged)


@dataclass(slots=True)
class Sent:
    """A message staged in a superstep: who sent it, the message, and where it goes.

    Read-only by convention (not frozen: one is made for every message sent, on the hot path).
    """

    source: str
    message: Any
    delivery: Delivery


@dataclass(slots=True)
class Position:
    """Where a run stands between supersteps: everything the next superstep needs.

    ``index`` is the next superstep's index (from 1), ``inbox`` its messages, ``buffers`` the
    fan-in groups' gathered messages, ``requests`` the requests made and not yet answered (by
    request id, in the order made). An empty inbox means the run has nothing left to do now; with
    requests pending, it waits for their responses. Read-only by convention: ``after`` makes a new
    position.
    """

    index: int
    inbox: Inbox
    buffers: FanInBuffers = field(default_factory=dict)
    requests: Mapping[str, PendingRequest] = field(default_factory=dict)

    @classmethod
    def start(cls, executor_id: str, message: Any) -> Position:
        """The position of a new run: superstep 1 delivers ``message`` to ``executor_id``."""
        return cls(1, {executor_id: [message]})

    def after(self, sent: Iterable[Sent], requested: Iterable[PendingRequest] = ()) -> Position:
        """The position once the superstep at this one commits, having sent ``sent`` and made the
        requests ``requested``."""
        inbox, buffers = deliver(sent, self.buffers)
        requests = self.requests
        made = {request.request_id: request for request in requested}
        if made:
            requests = {**requests, **made}
        return Position(self.index + 1, inbox, buffers, requests)


def deliver(sent: Iterable[Sent], buffers: FanInBuffers) -> tuple[Inbox, FanInBuffers]:
    """The next inbox and fan-in buffers, once a superstep that sent ``sent`` commits.

    Direct targets receive each message; a fan-in group buffers it under its source, and once
    every source of the group has sent, its target receives one list: the messages in the order
    of the group's sources (each source's in send order), and the group's buffer empties.
    ``buffers`` is not changed: the result shares what did not change.
    """
    inbox: Inbox = {}
    grown: dict[FanIn, dict[str, list[Any]]] = {}
    for item in sent:
        delivery = item.delivery
        for target in delivery.targets:
            inbox.setdefault(target, []).append(item.message)
        for group in delivery.fan_ins:
            gathered = grown.get(group)
            if gathered is None:
                old = buffers.get(group, {})
                gathered = grown[group] = {source: list(got) for source, got in old.items()}
            gathered.setdefault(item.source, []).append(item.message)
    if not grown:
        return inbox, buffers
    after = dict(buffers)
    for group, gathered in grown.items():
        if all(gathered.get(source) for source in group.sources):
            merged = [message for source in group.sources for message in gathered[source]]
            inbox.setdefault(group.target, []).append(merged)
            after.pop(group, None)
        else:
            after[group] = {source: tuple(got) for source, got in gathered.items()}
    return inbox, after


class Router:
    """Decides where the messages an executor sends go, over one validated graph.

    A message goes along each of the sender's edge groups whose condition holds, to the targets
    with a handler for its type (``target_id`` narrows it to one target). Conditions and
    switch-case predicates may be sync or async; an async one is awaited. When no group of the
    sender has a condition, the delivery depends on the message's type only and is cached:
    ``cached`` answers those without evaluating anything.

    A message no edge can deliver (no outgoing edge, ``target_id`` not connected, no target
    handles its type) is refused with ``RoutingError`` when the graph has ``strict_routing``;
    otherwise its delivery has no targets and says why it is ``dropped``.
    """

    __slots__ = ("_by_type", "_outgoing", "_type_only", "graph")

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self._outgoing: dict[str, tuple[EdgeGroup, ...]] = {}
        for group in graph.groups:
            for source in group.sources:
                self._outgoing[source] = (*self._outgoing.get(source, ()), group)
        self._type_only = frozenset(
            source
            for source in graph.executors
            if all(_type_only(group) for group in self._outgoing.get(source, ()))
        )
        self._by_type: dict[tuple[str, type, str | None], Delivery] = {}

    def cached(self, source: str, message: object, target_id: str | None) -> Delivery | None:
        """The delivery of a message whose route depends on its type only, once routed before."""
        return self._by_type.get((source, type(message), target_id))

    async def route(self, source: str, message: object, target_id: str | None) -> Delivery:
        """Decide where a message sent by ``source`` goes. Raises ``RoutingError`` if it cannot
        and the graph has ``strict_routing``.

        Awaits async conditions; raises what a condition raises.
        """
        key = (source, type(message), target_id)
        cached = self._by_type.get(key)
        if cached is not None:
            return cached
        delivery = await self._route(source, message, target_id)
        if source in self._type_only:
            self._by_type[key] = delivery
        return delivery

    async def _route(self, source: str, message: object, target_id: str | None) -> Delivery:
        groups = self._outgoing.get(source, ())
        if not groups:
            return self._drop(
                "no_edges",
                f"executor {source!r} sent a message but has no outgoing edges: add an edge "
                "from it, or do not send",
            )
        if target_id is not None and all(target_id not in g.targets for g in groups):
            return self._drop(
                "target_mismatch",
                f"executor {source!r} sent a message to {target_id!r}, but no edge connects "
                f"them: add the edge {source}->{target_id}, or name a connected target",
            )
        executors = self.graph.executors
        targets: list[str] = []
        fan_ins: list[FanIn] = []
        typed = False  # some edge could carry this message's type
        for group in groups:
            if isinstance(group, MultiSelection) and not _selectable(
                group, message, target_id, executors
            ):
                continue  # the selection is asked only about a message the group could carry
            for target in await _candidates(group, message):
                if target_id is not None and target != target_id:
                    continue
                if isinstance(group, FanIn):
                    typed = True
                    fan_ins.append(group)
                elif executors[target].can_handle(message):
                    typed = True
                    if target not in targets:
                        targets.append(target)
            if not typed and self._type_reachable(group, message, target_id):
                typed = True
        if not typed:
            names = ", ".join(sorted({t for g in groups for t in g.targets}))
            return self._drop(
                "type_mismatch",
                f"executor {source!r} sent a {type(message).__qualname__}, which no target "
                f"connected to it handles ({names}): add a handler for it to a target, or "
                "connect one that has",
            )
        return Delivery(tuple(targets), tuple(fan_ins))

    def _drop(self, reason: DropReason, explanation: str) -> Delivery:
        """The delivery of an undeliverable message, or ``RoutingError`` if routing is strict."""
        if self.graph.strict_routing:
            raise RoutingError(explanation)
        return _DROPPED[reason]

    def delivery_of(self, source: str, logged: Iterable[str]) -> Delivery:
        """The delivery a ``MessageStaged`` recorded as ``targets`` (``Delivery.logged``), rebuilt
        from the graph: a target that a fan-in group of ``source`` gathers for is a fan-in.
        Raises ``KeyError`` naming a target that is no executor of the graph."""
        targets: list[str] = []
        fan_ins: list[FanIn] = []
        for target in logged:
            if target not in self.graph.executors:
                raise KeyError(target)
            group = next(
                (
                    g
                    for g in self._outgoing.get(source, ())
                    if isinstance(g, FanIn) and g.target == target
                ),
                None,
            )
            if group is None:
                targets.append(target)
            else:
                fan_ins.append(group)
        return Delivery(tuple(targets), tuple(fan_ins))

    def _type_reachable(self, group: EdgeGroup, message: object, target_id: str | None) -> bool:
        """True when a condition (not the message's type) kept the message from every target."""
        return any(
            self.graph.executors[t].can_handle(message)
            for t in group.targets
            if target_id is None or t == target_id
        )


_DROPPED: dict[DropReason, Delivery] = {
    reason: Delivery(dropped=reason) for reason in ("no_edges", "target_mismatch", "type_mismatch")
}


async def _candidates(group: EdgeGroup, message: object) -> tuple[str, ...]:
    """The targets of ``group`` that ``message`` may go to, by the group's conditions."""
    if isinstance(group, Single):
        if group.condition is not None and not await _holds(group.condition, message):
            return ()
        return (group.target,)
    if isinstance(group, FanOut | FanIn):
        return group.targets
    if isinstance(group, MultiSelection):
        return await _selected(group, message)
    for condition, target in group.cases:
        if await _holds(condition, message):
            return (target,)
    return (group.default,) if group.default is not None else ()


async def _holds(condition: Condition, message: object) -> bool:
    """Evaluate a condition, sync or async."""
    verdict = condition(message)
    if inspect.isawaitable(verdict):
        verdict = await verdict
    return bool(verdict)


def _selectable(
    group: MultiSelection, message: object, target_id: str | None, executors: Mapping[str, Any]
) -> bool:
    """Whether a multi-selection group could carry ``message`` at all (sent to ``target_id``)."""
    if target_id is not None and target_id not in group.targets:
        return False
    return any(executors[target].can_handle(message) for target in group.targets)


async def _selected(group: MultiSelection, message: object) -> tuple[str, ...]:
    """The targets a multi-selection group's function picks for ``message``, each once, in the
    order it names them. Raises ``RoutingError`` for a result that is not a list of the group's
    target ids; raises what the function raises."""
    func = group.selection
    picked = func(message, list(group.targets))
    if inspect.isawaitable(picked):
        picked = await picked
    name = getattr(func, "__qualname__", None) or repr(func)
    if isinstance(picked, str | bytes) or not isinstance(picked, Iterable):
        raise RoutingError(
            f"the selection function {name} of the multi-selection edge group from "
            f"{group.source!r} returned {picked!r}: it must return a list of target ids, a "
            f"subset of {list(group.targets)}"
        )
    chosen = list(picked)
    unknown = [t for t in chosen if not isinstance(t, str) or t not in group.targets]
    if unknown:
        raise RoutingError(
            f"the selection function {name} of the multi-selection edge group from "
            f"{group.source!r} selected {unknown!r}, which are not its targets: it must return "
            f"a subset of {list(group.targets)}"
        )
    return tuple(dict.fromkeys(chosen))


def _type_only(group: EdgeGroup) -> bool:
    """Whether the group routes by the message's type alone (no condition to evaluate)."""
    return isinstance(group, FanOut | FanIn) or (
        isinstance(group, Single) and group.condition is None
    )
