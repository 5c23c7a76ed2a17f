"""The reference model: what the kernel must do to a ``workflow.Spec`` running ``Job`` plans,
worked out from the rules alone (no kernel code, no log).

For each instance the model keeps the list of its supersteps in the order they are started, each
with its outcome (committed, aborted with a reason, or open) and the committed state just after
its marker; the committed state, which is the fold of the committed supersteps' writes in order;
and the *standing* of the instance's last run: the next superstep's index, which nodes get the
``Job``, which responses are delivered there, the pending requests and the outputs of the run's
lineage so far. That standing is what ``resume()`` continues, what a fork at that point inherits,
and what ``pending_requests()`` and the last checkpoint's status report.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from tests.model.workflow import Spec


@dataclass
class Standing:
    """Where a run stands between supersteps (see the module docstring)."""

    plan: list[dict[str, list[list[Any]]]] | None
    tag: str
    index: int
    active: frozenset[str]
    responses: tuple[tuple[str, str, int], ...] = ()  # (node, key, value) delivered at index
    requests: dict[str, str] = field(default_factory=dict)  # key -> node, pending
    outputs: list[str] = field(default_factory=list)  # of the lineage's committed supersteps

    @property
    def inbox(self) -> bool:
        return bool(self.active or self.responses)

    def copy(self) -> Standing:
        return copy.deepcopy(self)


@dataclass
class Step:
    """One superstep of an instance, in log order."""

    run: int  # the instance's run ordinal (0, 1, ...)
    index: int
    outcome: str = "open"  # "committed", "aborted", "open"
    reason: str | None = None
    state_after: dict[str, Any] | None = None  # committed state just after its marker
    standing_after: Standing | None = None  # the last run's standing just after its marker
    writes: list[tuple[str, str, Any]] = field(default_factory=list)  # if committed
    outputs: list[str] = field(default_factory=list)  # if committed


@dataclass
class Run:
    """One run of an instance: how it ended (None while open)."""

    end: str | None = None  # completed, awaiting_input, failed, cancelled, abandoned, crashed
    killed: bool = False  # its process was SIGKILLed: open until a run or recover closes it


@dataclass
class Outcome:
    """What one superstep does if it runs to its end."""

    writes: list[tuple[str, str, Any]]  # (key, "set" | "delete", value), per node in order
    outputs: list[str]
    requests: dict[str, str]
    active: frozenset[str]


def superstep(spec: Spec, state: dict[str, Any], standing: Standing) -> Outcome:
    """What superstep ``standing.index`` stages, yields, asks and sends if nothing fails.

    Each key is written by at most one node in a superstep (the plans are drawn so), so a node's
    reads see the committed state overlaid with its own writes only.
    """
    index, plan = standing.index, standing.plan
    writes: list[tuple[str, str, Any]] = []
    outputs: list[str] = []
    requests: dict[str, str] = {}
    active: set[str] = set()
    for node in sorted(standing.active):
        assert plan is not None
        ops = plan[index - 1].get(node, []) if index <= len(plan) else []
        local = dict(state)
        for op in ops:
            kind = op[0]
            if kind == "set":
                local[op[1]] = op[2]
                writes.append((op[1], "set", op[2]))
            elif kind == "del":
                local.pop(op[1], None)
                writes.append((op[1], "delete", None))
            elif kind == "inc":
                local[op[1]] = local.get(op[1], 0) + 1
                writes.append((op[1], "set", local[op[1]]))
            elif kind == "ask":
                requests[op[1]] = node
        outputs.append(f"{standing.tag}:{node}@{index}")
        if index < len(plan):
            active.update(spec.targets(node))
    for _, key, value in standing.responses:
        writes.append((key, "set", value))
        outputs.append(f"{key}={value}")
    return Outcome(writes, outputs, requests, frozenset(active))


def ops_of(standing: Standing, node: str) -> list[list[Any]]:
    """The operations ``node`` runs in the standing's superstep (empty if it gets no ``Job``)."""
    plan = standing.plan
    if node not in standing.active or plan is None or standing.index > len(plan):
        return []
    return plan[standing.index - 1].get(node, [])


class InstanceModel:
    """What one instance's log must say (see the module docstring)."""

    def __init__(self, instance_id: str, spec: Spec) -> None:
        self.instance_id = instance_id
        self.spec = spec
        self.state: dict[str, Any] = {}
        self.steps: list[Step] = []
        self.runs: list[Run] = []
        self.standing: Standing | None = None
        self.forked_values: dict[str, Any] = {}  # what a fork started with
        self.answered: dict[str, str] = {}  # request id -> key, of the responses recorded

    # -- questions ----------------------------------------------------------------------------

    @property
    def open_run(self) -> Run | None:
        """The last run if it is still open (only a killed run stays open between actions)."""
        if self.runs and self.runs[-1].end is None:
            return self.runs[-1]
        return None

    def resumable(self) -> bool:
        return self.standing is not None and self.standing.inbox

    def status(self) -> str:
        """The status the last checkpoint reports."""
        standing = self.standing
        if standing is None:
            return "foreign"
        if standing.inbox:
            return "resumable"
        return "awaiting_input" if standing.requests else "completed"

    # -- what happens -------------------------------------------------------------------------

    def close_open(self, reason: str) -> None:
        """A run left open by a killed process is closed (by the next run, or ``recover``)."""
        run = self.open_run
        if run is None:
            return
        run.end = "crashed" if reason == "crashed" else "abandoned"
        if self.steps and self.steps[-1].outcome == "open":
            self._mark(self.steps[-1], "aborted", reason)

    def begin(self, standing: Standing) -> None:
        """A run starts (fresh, or continuing the last run) at ``standing``; its first superstep
        is open."""
        self.close_open("crashed")
        self.runs.append(Run())
        self.standing = standing
        self.steps.append(Step(len(self.runs) - 1, standing.index))

    def commit(self) -> bool:
        """The open superstep commits; returns whether the run goes on (its next one is open)."""
        standing = self.standing
        assert standing is not None
        done = superstep(self.spec, self.state, standing)
        for key, op, value in done.writes:
            if op == "set":
                self.state[key] = value
            else:
                self.state.pop(key, None)
        requests = {**standing.requests, **done.requests}
        self.standing = Standing(
            standing.plan,
            standing.tag,
            standing.index + 1,
            done.active,
            (),
            requests,
            [*standing.outputs, *done.outputs],
        )
        step = self.steps[-1]
        step.writes, step.outputs = done.writes, done.outputs
        self._mark(step, "committed", None)
        run = self.runs[-1]
        if self.standing.inbox:
            self.steps.append(Step(len(self.runs) - 1, self.standing.index))
            return True
        run.end = "awaiting_input" if requests else "completed"
        return False

    def abort(self, reason: str) -> None:
        """The open superstep is aborted and the run ends (``failed`` / ``cancelled`` /
        ``abandoned``)."""
        self._mark(self.steps[-1], "aborted", reason)
        self.runs[-1].end = reason

    def killed(self) -> None:
        """The run's process died: its open superstep stays open."""
        self.runs[-1].killed = True

    def killed_after_marker(self, *, write_through: bool) -> None:
        """The run's process died right after the batch with the open superstep's commit marker
        landed. In "superstep" durability that batch also opened the next superstep or ended the
        run; in "write" durability the marker went alone, so the run is left open between
        supersteps (or with its end unwritten)."""
        goes_on = self.commit()
        if write_through:
            if goes_on:
                self.steps.pop()  # its SuperstepStarted was never appended
            else:
                self.runs[-1].end = None
            self.killed()
        elif goes_on:
            self.killed()

    def finish(self) -> None:
        """Commit supersteps until the run ends."""
        while self.commit():
            pass

    def _mark(self, step: Step, outcome: str, reason: str | None) -> None:
        step.outcome, step.reason = outcome, reason
        step.state_after = dict(self.state)
        step.standing_after = None if self.standing is None else self.standing.copy()

    # -- forks --------------------------------------------------------------------------------

    def fork(self, instance_id: str, step: Step | None) -> InstanceModel:
        """A new instance from the state and standing just after ``step``'s marker (None: the
        empty log)."""
        forked = InstanceModel(instance_id, self.spec)
        if step is not None:
            assert step.state_after is not None
            forked.state = dict(step.state_after)
            forked.standing = None if step.standing_after is None else step.standing_after.copy()
        forked.forked_values = dict(forked.state)
        return forked
