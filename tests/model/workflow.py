"""The workflow the model-based test drives: any graph of ``Node`` executors running a ``Job``.

A ``Job`` carries its whole program: ``plan[k - 1][node]`` is what ``node`` does in superstep
``k``, a list of operations::

    ["set", key, value]   stage key = value
    ["del", key]          stage the deletion of key
    ["inc", key]          stage key = get_state(key, 0) + 1 (reads committed state + own overlay)
    ["ask", key]          request an int from outside; the response handler stages key = answer
    ["pause", n]          await asyncio.sleep(0) n times (an await point for the siblings)

Each node runs its operations once per superstep (a second message in the same superstep only
forwards nothing), yields ``"<tag>:<node>@<k>"``, and, if the plan goes on and it has edges,
sends ``Job(plan, k + 1)`` along them. Because the program travels in the message, a run
continued from the log (in this process or another) does exactly what the model says.

Faults come from outside, through ``Hooks``: the executor calls ``hooks.point(k, node, i)`` before
operation ``i`` (and ``i == len(ops)`` after the last one), and ``hooks.point(k, node, RESPONSE)``
in the response handler. An armed ``Fault`` fires there once: raise, block until cancelled, or
SIGKILL the process. A kill can also come around the append of a superstep's commit batch
(``STORE_POINTS``).

``kill_child`` is the ``multiprocessing`` target that runs one action with a kill armed; the test
forks it from a fork server that imported this module once (as ``tests/durable``'s crash test
does), so that the log names ``tests.model.workflow.Job`` in every process.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel import (
    EventStore,
    Executor,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    handler,
    open_store,
    response_handler,
)
from tests.durable.crash_worker import MarkerTrap

RESPONSE = -1
"""The fault point of a response handler (operation points are 0, 1, ...)."""

STORE_POINTS = {
    -2: "before_marker_append",
    -3: "inside_marker_transaction",
    -4: "after_marker_append",
}
"""Kill points around the append of the batch holding a superstep's commit marker, as fault
points (``tests/durable/crash_worker.MarkerTrap`` kills the process there)."""

EXIT_NOT_REACHED = 3
"""A ``kill_child`` whose kill point never came exits with this (a broken model, not a pass)."""

WORKFLOW_NAME = "model"


@dataclass
class Job:
    """The message every node handles: the program, the superstep it is for, and a run tag."""

    plan: list[dict[str, list[list[Any]]]]
    step: int
    tag: str


@dataclass
class Ask:
    """A request for an int; the answer is staged under ``key``."""

    key: str


class InjectedFailure(RuntimeError):
    """What a ``fail`` fault raises in a handler."""


@dataclass(frozen=True)
class Fault:
    """Fire ``kind`` (``fail``, ``block``, ``kill``) at operation point ``at`` of ``node`` in
    superstep ``index`` (``RESPONSE``: in its response handler)."""

    kind: str
    index: int
    node: str
    at: int

    def to_json(self) -> list[Any]:
        return [self.kind, self.index, self.node, self.at]

    @classmethod
    def from_json(cls, raw: list[Any]) -> Fault:
        kind, index, node, at = raw
        return cls(str(kind), int(index), str(node), int(at))


@dataclass
class Hooks:
    """The fault armed for the next action, and what the handlers noticed."""

    fault: Fault | None = None
    fired: bool = False
    blocked: asyncio.Event | None = None
    mismatches: list[str] = field(default_factory=list)

    def arm(self, fault: Fault | None) -> None:
        self.fault, self.fired = fault, False
        self.blocked = asyncio.Event() if fault is not None and fault.kind == "block" else None

    async def point(self, index: int, node: str, at: int) -> None:
        fault = self.fault
        if fault is None or self.fired or (fault.index, fault.node, fault.at) != (index, node, at):
            return
        self.fired = True
        if fault.kind == "fail":
            raise InjectedFailure(f"injected failure at {node}@{index} point {at}")
        if fault.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if fault.kind == "block":
            assert self.blocked is not None
            self.blocked.set()
            await asyncio.Event().wait()  # until the caller's cancellation reaches it
        raise AssertionError(f"unknown fault kind {fault.kind!r}")


class Node(Executor):
    """Runs its part of a ``Job``'s plan (see the module docstring)."""

    def __init__(self, id: str, *, sends: bool, hooks: Hooks) -> None:
        super().__init__(id)
        self.sends = sends
        self.hooks = hooks
        self._ran: set[str] = set()

    @handler
    async def job(self, job: Job, ctx: WorkflowContext[Job, str]) -> None:
        if ctx.superstep_id in self._ran:
            return
        self._ran.add(ctx.superstep_id)
        index = ctx.superstep
        if job.step != index:
            self.hooks.mismatches.append(f"{self.id} got step {job.step} in superstep {index}")
        ops = job.plan[index - 1].get(self.id, []) if index <= len(job.plan) else []
        for at, op in enumerate(ops):
            await self.hooks.point(index, self.id, at)
            kind = op[0]
            if kind == "set":
                ctx.set_state(op[1], op[2])
            elif kind == "del":
                ctx.delete_state(op[1])
            elif kind == "inc":
                ctx.set_state(op[1], ctx.get_state(op[1], 0) + 1)
            elif kind == "ask":
                await ctx.request_info(Ask(op[1]), int)
            elif kind == "pause":
                for _ in range(op[1]):
                    await asyncio.sleep(0)
            else:
                raise AssertionError(f"unknown operation {op!r}")
        await self.hooks.point(index, self.id, len(ops))
        await ctx.yield_output(f"{job.tag}:{self.id}@{index}")
        if self.sends and index < len(job.plan):
            await ctx.send_message(Job(job.plan, index + 1, job.tag))

    @response_handler
    async def answered(self, request: Ask, value: int, ctx: WorkflowContext[Job, str]) -> None:
        await self.hooks.point(ctx.superstep, self.id, RESPONSE)
        ctx.set_state(request.key, value)
        await ctx.yield_output(f"{request.key}={value}")


@dataclass(frozen=True)
class Spec:
    """A graph of nodes: ``edges`` are single edges, ``fanouts`` fan-out groups; ``nodes[0]``
    starts. No pair appears twice."""

    nodes: tuple[str, ...]
    edges: tuple[tuple[str, str], ...] = ()
    fanouts: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def targets(self, node: str) -> set[str]:
        found = {t for s, t in self.edges if s == node}
        for source, group in self.fanouts:
            if source == node:
                found.update(group)
        return found

    def to_json(self) -> str:
        return json.dumps(
            {"nodes": self.nodes, "edges": self.edges, "fanouts": self.fanouts}, sort_keys=True
        )

    @classmethod
    def from_json(cls, text: str) -> Spec:
        raw = json.loads(text)
        return cls(
            tuple(raw["nodes"]),
            tuple((s, t) for s, t in raw["edges"]),
            tuple((s, tuple(group)) for s, group in raw["fanouts"]),
        )


def workflow_of(
    store: EventStore, instance_id: str, spec: Spec, durability: Any, hooks: Hooks
) -> Workflow:
    """The workflow of ``spec`` on ``store``'s instance ``instance_id``."""
    nodes = {n: Node(n, sends=bool(spec.targets(n)), hooks=hooks) for n in spec.nodes}
    builder = WorkflowBuilder(
        start_executor=nodes[spec.nodes[0]],
        store=store,
        instance_id=instance_id,
        name=WORKFLOW_NAME,
        durability=durability,
    )
    for node in spec.nodes[1:]:
        builder.add_executor(nodes[node])
    for source, target in spec.edges:
        builder.add_edge(nodes[source], nodes[target])
    for source, group in spec.fanouts:
        builder.add_fan_out_edges(nodes[source], [nodes[t] for t in group])
    # a snapshot at every committed superstep: every open, resume and kill point meets one
    return builder.with_snapshots(every=1).build()


# -- an action in a process that kills itself ---------------------------------------------------


def job_from_json(raw: dict[str, Any]) -> Job:
    return Job(raw["plan"], raw["step"], raw["tag"])


async def act(wf: Workflow, action: dict[str, Any]) -> Any:
    """Run one action on ``wf``: ``{"kind": "run", "job": ...}``, ``{"kind": "resume"}`` or
    ``{"kind": "respond", "responses": {request_id: value}}``."""
    kind = action["kind"]
    if kind == "run":
        # a new line gives up the requests still waiting, as the model's new run does
        return await wf.run(job_from_json(action["job"]), supersede_requests=True)
    if kind == "resume":
        return await wf.resume()
    if kind == "respond":
        return await wf.run(responses=action["responses"])
    raise AssertionError(f"unknown action {kind!r}")


async def _killed(
    url: str, instance_id: str, spec: str, durability: str, action: str, fault: str
) -> None:
    store = open_store(url)
    hooks = Hooks()
    armed = Fault.from_json(json.loads(fault))
    if armed.at in STORE_POINTS:
        MarkerTrap(store, STORE_POINTS[armed.at], armed.index)
    else:
        hooks.arm(armed)
    wf = workflow_of(store, instance_id, Spec.from_json(spec), durability, hooks)
    await act(wf, json.loads(action))


def kill_child(said: str, *args: str) -> None:
    """Run ``_killed(*args)``, which SIGKILLs this process at the armed fault. If it returns or
    raises instead, say so in the file ``said`` and exit with ``EXIT_NOT_REACHED``."""
    try:
        asyncio.run(_killed(*args))
    except BaseException:
        Path(said).write_text(traceback.format_exc())
        sys.exit(EXIT_NOT_REACHED)
    Path(said).write_text("the kill point was never reached")
    sys.exit(EXIT_NOT_REACHED)
