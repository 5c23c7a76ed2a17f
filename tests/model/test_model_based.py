"""Model-based test of the whole kernel: a hypothesis state machine drives real workflows against
the reference model of ``tests/model/reference.py`` and checks the log after every step.

Each example draws a graph of 1 to 4 nodes (single edges, fan-out groups, cycles, self-loops)
and a durability, then a sequence of actions on its instances: new runs with random plans
(writes, deletes, read-modify-writes, requests for input, await points), resumes, responses to
pending requests, forks at any superstep's marker, and ``recover``. Each run may get one fault: a
handler raises; a handler blocks and the caller is cancelled some loop turns later; the caller is
cancelled after a random number of loop turns, wherever the run is; the stream is dropped (closed,
or garbage collected) after a random number of events; or the process running the action is
SIGKILLed at a handler's operation (a forked child process, on SQLite and PostgreSQL only).

After every step, for each instance the step touched, the log must say what the model says:

* committed state (the kernel's fold, ``Workflow.committed_state()`` on the step's workflow
  object and on a new one) equals the fold of the model's committed supersteps;
* the log's supersteps are the model's, in order, with the same index and outcome (committed,
  or aborted with the reason), each closed by exactly one marker, none left open except the
  superstep of a killed run that nothing has closed yet; each run ended as the model says;
* a committed superstep staged exactly the model's writes and yielded exactly its outputs;
* time travel to every closed superstep (``AtSuperstep`` and ``AtPosition`` of its marker) gives
  the model's state after it;
* blame gives every write the verdict of its superstep (``committed``/``superseded``, or
  ``aborted`` with the reason), and each key's current write holds the model's value; the same
  from the store (``blame_keys``);
* ``pending_requests()`` and the last checkpoint's status are the model's;
* the store's chain verifies, when the store has ``verify_chain``.

Settings, read when the test runs:

``STEPLOG_MODEL_EXAMPLES``
    examples per store: one count (``2000``) or per store (``memory=1000,sqlite=300``); by
    default 20 on memory, 8 on SQLite, 4 on PostgreSQL (about 30 s in all);
``STEPLOG_MODEL_STEPS``
    the most actions in one example (default 12);
``STEPLOG_MODEL_STORES``
    comma-separated stores (default ``memory,sqlite,postgres``);
``STEPLOG_MODEL_REPORT``
    a file to write the run's figures to, as JSON (examples, steps, events, faults by kind).

The long run (about ten minutes; pytest's per-test timeout must be lifted)::

    STEPLOG_MODEL_EXAMPLES=memory=1000,sqlite=300,postgres=100 STEPLOG_MODEL_STEPS=30 \
        .venv/bin/python -m pytest tests/model -p no:cacheprovider --timeout 0 -s

(see ``docs/guarantees.md`` for its figures).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import multiprocessing
import os
import shutil
import signal
import tempfile
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from psycopg import sql

from kernel import (
    RUN_END_TYPES,
    SUPERSTEP_MARKER_TYPES,
    EventBase,
    EventStore,
    ResponseError,
    ResumeError,
    RunResult,
    Workflow,
    fold_committed,
    open_store,
    recover,
    replay,
)
from projections import AtPosition, AtSuperstep, blame_keys, fold_blame, state_at
from tests.model import workflow
from tests.model.reference import InstanceModel, Standing, Step, ops_of
from tests.model.snapshots import views_of
from tests.model.workflow import (
    RESPONSE,
    STORE_POINTS,
    Fault,
    Hooks,
    InjectedFailure,
    Spec,
    act,
    workflow_of,
)

KEYS = ("a", "b", "c")
"""The keys plans write: few, so that writes supersede each other often."""

FAULTS = ("none",) * 3 + ("fail",) * 2 + ("block",) + ("cancel", "drop") * 2 + ("race", "kill")
"""The faults a run may get, repeated to weigh them (``kill`` is a ``fail`` on the memory store,
which no other process can open)."""
PRELOAD = ["tests.model.workflow", "kernel._store._sqlite", "kernel._store._postgres"]
PG_ENV = "STEPLOG_TEST_PG"
DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
DEFAULT_EXAMPLES = {"memory": 20, "sqlite": 8, "postgres": 4}
DEFAULT_STEPS = 12
T = TypeVar("T")


# -- what is drawn ------------------------------------------------------------------------------


@st.composite
def specs(draw: st.DrawFn) -> Spec:
    """A graph of 1 to 4 nodes: each node's out-edges are single edges or one fan-out group.
    Only the nodes reachable from ``n0`` are kept (``build()`` refuses a node nothing reaches)."""
    drawn = tuple(f"n{i}" for i in range(draw(st.integers(1, 4))))
    pairs = draw(
        st.lists(st.tuples(st.sampled_from(drawn), st.sampled_from(drawn)), unique=True, max_size=6)
    )
    reached = {drawn[0]}
    while grown := {t for s, t in pairs if s in reached} - reached:
        reached |= grown
    nodes = tuple(n for n in drawn if n in reached)
    pairs = [(s, t) for s, t in pairs if s in reached]
    edges: list[tuple[str, str]] = []
    fanouts: list[tuple[str, tuple[str, ...]]] = []
    for source in nodes:
        targets = tuple(t for s, t in pairs if s == source)
        if len(targets) > 1 and draw(st.booleans()):
            fanouts.append((source, targets))
        else:
            edges.extend((source, t) for t in targets)
    return Spec(nodes, tuple(edges), tuple(fanouts))


def draw_plan(data: st.DataObject, nodes: tuple[str, ...], ask: Callable[[], str]) -> list[Any]:
    """A plan of 1 to 4 supersteps; in each, every key is written by at most one node."""
    plan: list[dict[str, list[list[Any]]]] = []
    for _ in range(data.draw(st.integers(1, 4), label="supersteps")):
        owners = data.draw(
            st.lists(st.sampled_from((None, *nodes)), min_size=len(KEYS), max_size=len(KEYS)),
            label="key owners",
        )
        step: dict[str, list[list[Any]]] = {}
        for node in nodes:
            ops: list[list[Any]] = []
            for key, owner in zip(KEYS, owners, strict=True):
                if owner != node:
                    continue
                kind = data.draw(st.sampled_from(("set", "set", "del", "inc")), label="op")
                if kind == "set":
                    ops.append(["set", key, data.draw(st.integers(0, 99), label="value")])
                else:
                    ops.append([kind, key])
            if data.draw(st.integers(0, 2), label="ask?") == 0:
                ops.append(["ask", ask()])
            if data.draw(st.booleans(), label="pause?"):
                ops.append(["pause", data.draw(st.integers(1, 3), label="turns")])
            if ops:
                step[node] = data.draw(st.permutations(ops), label="order")
        plan.append(step)
    return plan


@dataclass(frozen=True)
class Choices:
    """Everything a rule may choose, drawn up front in one fixed shape whatever the state, so
    that an example replays (and shrinks) the same way even where an interruption lands
    differently: each rule takes from it what applies, by index modulo the options at hand."""

    instance: int
    fresh: bool
    fault: str
    point: int
    turns: int
    again: bool
    how: int
    answer_mask: int
    values: tuple[int, ...]

    @staticmethod
    def among(options: Sequence[T], n: int) -> T:
        return options[n % len(options)]


def choices() -> st.SearchStrategy[Choices]:
    return st.builds(
        Choices,
        instance=st.integers(0, 7),
        fresh=st.booleans(),
        fault=st.sampled_from(FAULTS),
        point=st.integers(0, 63),
        turns=st.integers(0, 30),
        again=st.booleans(),
        how=st.integers(0, 2),
        answer_mask=st.integers(0, 15),
        values=st.tuples(*[st.integers(100, 999)] * 4),
    )


# -- stores -------------------------------------------------------------------------------------


def stores_to_run() -> list[str]:
    chosen = os.environ.get("STEPLOG_MODEL_STORES", "memory,sqlite,postgres")
    return [name.strip() for name in chosen.split(",") if name.strip()]


def examples_for(store: str) -> int:
    """``STEPLOG_MODEL_EXAMPLES``: one count for every store (``2000``), or per store
    (``memory=1000,sqlite=300,postgres=100``; a store not named keeps its default)."""
    configured = os.environ.get("STEPLOG_MODEL_EXAMPLES", "").strip()
    if not configured:
        return DEFAULT_EXAMPLES[store]
    if "=" not in configured:
        return int(configured)
    counts = dict(part.split("=", 1) for part in configured.split(",") if part.strip())
    return int(counts.get(store, DEFAULT_EXAMPLES[store]))


def steps_per_example() -> int:
    return int(os.environ.get("STEPLOG_MODEL_STEPS", str(DEFAULT_STEPS)))


class Stores:
    """A fresh store per example: memory, a SQLite file in a temporary directory, or a new
    PostgreSQL schema dropped afterwards."""

    def __init__(self, kind: str, pg_server: str | None) -> None:
        self.kind = kind
        self.pg_server = pg_server

    def url(self) -> tuple[str, Callable[[], None]]:
        if self.kind == "memory":
            return "memory://", lambda: None
        if self.kind == "sqlite":
            where = tempfile.mkdtemp(prefix="steplog-model-")
            return f"sqlite:///{where}/log.db", lambda: shutil.rmtree(where, ignore_errors=True)
        assert self.pg_server is not None
        schema = f"steplog_t_model_{uuid.uuid4().hex[:10]}"
        separator = "&" if "?" in self.pg_server else "?"

        def drop() -> None:
            with psycopg.connect(self.pg_server or "", autocommit=True) as conn:
                conn.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
                )

        return f"{self.pg_server}{separator}schema={schema}", drop


class Stats:
    """The figures of a run of the machine."""

    def __init__(self) -> None:
        self.examples = 0
        self.steps = 0
        self.events = 0  # events in the logs at the end of each example
        self.checked = 0  # events folded by the checks
        self.actions: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()

    def to_json(self) -> dict[str, Any]:
        return {
            "examples": self.examples,
            "steps": self.steps,
            "events": self.events,
            "events_checked": self.checked,
            "actions": dict(sorted(self.actions.items())),
            "faults": dict(sorted(self.faults.items())),
        }


# -- the machine --------------------------------------------------------------------------------


class KernelMachine(RuleBasedStateMachine):
    """Drives one store's instances; see the module docstring. ``stores``, ``stats`` and
    ``processes`` are set on a subclass by the test."""

    stores: Stores
    stats: Stats
    processes: Any = None

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.url, self._drop = self.stores.url()
        self.store: EventStore = open_store(self.url)
        self.durable = not self.url.startswith("memory")
        self.tag = uuid.uuid4().hex[:8]
        self.models: dict[str, InstanceModel] = {}
        self.workflows: dict[str, tuple[Workflow, Hooks]] = {}
        self.touched: set[str] = set()
        self.spec = Spec(("n0",))
        self.durability = "superstep"
        self.asks = 0
        self.runs = 0
        self.stats.examples += 1

    def teardown(self) -> None:
        try:
            for instance_id in self.models:
                self.stats.events += len(self.store.read(instance_id))
            for _, hooks in self.workflows.values():
                assert not hooks.mismatches, hooks.mismatches
        finally:
            with contextlib.suppress(Exception):
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()
            self.store.close()
            self._drop()

    # -- helpers ------------------------------------------------------------------------------

    def new_instance_id(self) -> str:
        return f"model-{self.tag}-{len(self.models)}"

    def ask(self) -> str:
        self.asks += 1
        return f"r{self.asks}"

    def workflow(self, instance_id: str, fresh: bool) -> tuple[Workflow, Hooks]:
        """The workflow object of the instance: the one used last, or a new one."""
        if fresh or instance_id not in self.workflows:
            if instance_id in self.workflows:  # what its handlers noticed is checked now
                assert not self.workflows[instance_id][1].mismatches
            hooks = Hooks()
            wf = workflow_of(self.store, instance_id, self.spec, self.durability, hooks)
            self.workflows[instance_id] = (wf, hooks)
        return self.workflows[instance_id]

    def pick(self, choice: Choices) -> str:
        return choice.among(sorted(self.models), choice.instance)

    def run(self, coroutine: Any) -> Any:
        return self.loop.run_until_complete(coroutine)

    # -- rules --------------------------------------------------------------------------------

    @initialize(spec=specs(), durability=st.sampled_from(("superstep", "write")))
    def setup(self, spec: Spec, durability: str) -> None:
        self.spec, self.durability = spec, durability
        instance_id = self.new_instance_id()
        self.models[instance_id] = InstanceModel(instance_id, spec)
        self.touched.add(instance_id)

    @rule(data=st.data(), choice=choices())
    def start_run(self, data: st.DataObject, choice: Choices) -> None:
        """A new run with a new plan."""
        instance_id = self.pick(choice)
        self.runs += 1
        plan = draw_plan(data, self.spec.nodes, self.ask)
        tag = f"t{self.runs}"
        standing = Standing(plan, tag, 1, frozenset({self.spec.nodes[0]}))
        action = {"kind": "run", "job": {"plan": plan, "step": 1, "tag": tag}}
        self.stats.actions["run"] += 1
        self.perform(choice, instance_id, action, standing)

    @rule(data=st.data(), choice=choices())
    def start_another_run(self, data: st.DataObject, choice: Choices) -> None:
        """The same as ``start_run``: new runs are what the other rules work on, so they come
        twice as often."""
        self.start_run(data, choice)

    @rule(data=st.data(), choice=choices())
    def concurrent_runs(self, data: st.DataObject, choice: Choices) -> None:
        """New runs on every instance at once, in one event loop: their commits share the
        store's group commit. One of them may fail (``choice.fault == "fail"``)."""
        started = []
        for n, instance_id in enumerate(sorted(self.models)):
            self.runs += 1
            plan = draw_plan(data, self.spec.nodes, self.ask)
            tag = f"t{self.runs}"
            standing = Standing(plan, tag, 1, frozenset({self.spec.nodes[0]}))
            wf, hooks = self.workflow(instance_id, choice.fresh)
            fault = None
            if choice.fault == "fail" and n == choice.instance % len(self.models):
                _, index, node, at = choice.among(
                    fault_points(self.models[instance_id], standing), choice.point
                )
                fault = Fault("fail", index, node, at)
            hooks.arm(fault)
            job = workflow.Job(plan, 1, tag)
            started.append((instance_id, wf, hooks, job, standing, fault))
            self.touched.add(instance_id)

        async def together() -> list[Any]:
            return await asyncio.gather(
                *(wf.run(job, supersede_requests=True) for _, wf, _, job, _, _ in started),
                return_exceptions=True,
            )

        outcomes = self.run(together())
        for (instance_id, _, hooks, _, standing, fault), outcome in zip(
            started, outcomes, strict=True
        ):
            hooks.arm(None)
            model = self.models[instance_id]
            model.begin(standing)
            if fault is None:
                assert isinstance(outcome, RunResult), outcome
                model.finish()
                assert outcome.status == model.runs[-1].end
                continue
            assert isinstance(outcome, InjectedFailure), outcome
            ordinal = next(
                o
                for o, index, node, at in fault_points(model, standing)
                if (index, node, at) == (fault.index, fault.node, fault.at)
            )
            for _ in range(ordinal):
                assert model.commit()
            model.abort("failed")
        self.stats.actions["concurrent runs"] += 1

    @rule(choice=choices())
    def resume(self, choice: Choices) -> None:
        """Continue the instance's last run; refused when it has nothing to do."""
        instance_id = self.pick(choice)
        model = self.models[instance_id]
        self.stats.actions["resume"] += 1
        if not model.resumable():
            wf, _ = self.workflow(instance_id, choice.fresh)
            before = self.store.read(instance_id)
            with pytest.raises(ResumeError):
                self.run(wf.resume())
            assert self.store.read(instance_id) == before
            self.touched.add(instance_id)
            return
        assert model.standing is not None
        self.perform(choice, instance_id, {"kind": "resume"}, model.standing.copy())

    @rule(choice=choices())
    def respond(self, choice: Choices) -> None:
        """Answer some of the last run's pending requests, and go on; or answer a request that
        was answered before, which is refused with nothing appended."""
        instance_id = self.pick(choice)
        model = self.models[instance_id]
        if choice.again and model.answered:
            request_id = choice.among(sorted(model.answered), choice.point)
            wf, _ = self.workflow(instance_id, choice.fresh)
            before = self.store.read(instance_id)
            with pytest.raises(ResponseError):
                self.run(wf.run(responses={request_id: 1}))
            assert self.store.read(instance_id) == before
            self.stats.actions["respond_again"] += 1
            return
        if model.standing is None or not model.standing.requests:
            return
        wf, _ = self.workflow(instance_id, choice.fresh)
        ids = {request.data.key: request.request_id for request in wf.pending_requests()}
        assert sorted(ids) == sorted(model.standing.requests)
        pending = sorted(ids)
        keys = [key for n, key in enumerate(pending) if choice.answer_mask >> n & 1] or pending[:1]
        standing = model.standing.copy()
        answers: dict[str, int] = {}
        delivered = list(standing.responses)
        for n, key in enumerate(keys):
            value = choice.values[n % len(choice.values)]
            answers[ids[key]] = value
            delivered.append((standing.requests.pop(key), key, value))
        standing.responses = tuple(delivered)
        self.stats.actions["respond"] += 1
        before = self.store.read(instance_id)
        self.perform(choice, instance_id, {"kind": "respond", "responses": answers}, standing)
        if any(e.type == "response_received" for e in self.store.read(instance_id)[len(before) :]):
            model.answered.update({ids[k]: k for k in keys})

    @rule(choice=choices())
    def fork(self, choice: Choices) -> None:
        """Fork an instance just after any closed superstep (or at position 0)."""
        instance_id = self.pick(choice)
        model = self.models[instance_id]
        events = self.store.read(instance_id)
        closed = [
            (step, start)
            for step, start in zip(model.steps, starts_of(events), strict=True)
            if step.outcome != "open"
        ]
        point: Any = 0
        step: Step | None = None
        if closed and choice.point % (len(closed) + 1):
            step, start = closed[choice.point % (len(closed) + 1) - 1]
            marker = markers_of(events)[start.superstep_id][0]
            point = {
                "id": start.superstep_id,
                "position": marker.position,
                "point": AtSuperstep(start.superstep_id),
            }[choice.among(("id", "position", "point"), choice.how)]
        new_id = self.new_instance_id()
        wf, _ = self.workflow(instance_id, choice.fresh)
        wf.fork(at=point, instance_id=new_id)
        assert self.store.read(instance_id) == events, "a fork changed its origin"
        self.models[new_id] = model.fork(new_id, step)
        self.touched.add(new_id)
        self.stats.actions["fork"] += 1

    @rule(choice=choices())
    def recover_instance(self, choice: Choices) -> None:
        """``recover`` closes a run whose process was killed, and nothing else."""
        instance_id = self.pick(choice)
        model = self.models[instance_id]
        closed = recover(self.store, instance_id)
        open_run = model.open_run
        assert len(closed) == (1 if open_run is not None and open_run.killed else 0), closed
        if closed:
            model.close_open("crashed")
            self.stats.faults["recovered"] += 1
        self.touched.add(instance_id)
        self.stats.actions["recover"] += 1

    # -- performing an action with a fault ----------------------------------------------------

    def perform(
        self, choice: Choices, instance_id: str, action: dict[str, Any], standing: Standing
    ) -> None:
        model = self.models[instance_id]
        self.touched.add(instance_id)
        kind = choice.fault if self.durable or choice.fault != "kill" else "fail"
        points = fault_points(model, standing)
        before = self.store.read(instance_id)
        if kind in ("fail", "block", "kill"):
            ordinal, index, node, at = choice.among(points, choice.point)
            if kind == "kill" and choice.how == 2:  # around the append of a commit marker
                at = choice.among(sorted(STORE_POINTS), choice.turns)
            fault = Fault(kind, index, node, at)
            if kind == "kill":
                self.kill(instance_id, action, fault)
            else:
                wf, hooks = self.workflow(instance_id, choice.fresh)
                hooks.arm(fault)
                outcome, value = self.run(drive(wf, hooks, action, kind, choice.turns % 6))
                hooks.arm(None)
                if kind == "fail":
                    assert outcome == "raised", (outcome, value)
                    assert isinstance(value, InjectedFailure), value
                else:
                    assert outcome == "cancelled", (outcome, value)
            model.begin(standing)
            for _ in range(ordinal):
                assert model.commit()
            if kind == "kill" and STORE_POINTS.get(at) == "after_marker_append":
                model.killed_after_marker(write_through=self.durability == "write")
            elif kind == "kill":
                model.killed()
            else:
                model.abort("failed" if kind == "fail" else "cancelled")
            self.stats.faults[
                f"kill ({STORE_POINTS.get(at, 'handler')})" if kind == "kill" else kind
            ] += 1
            return
        wf, hooks = self.workflow(instance_id, choice.fresh)
        if kind == "none":
            result = self.run(act(wf, action))
            model.begin(standing)
            model.finish()
            assert model.standing is not None
            assert isinstance(result, RunResult)
            assert result.status == model.runs[-1].end
            assert Counter(result.get_outputs()) == Counter(model.standing.outputs)
            assert result.supersteps == model.standing.index - 1
            return
        if kind == "race":
            self.race(choice, instance_id, action, standing)
            return
        # cancel, drop: where it lands is read back from the log, and must be consistent
        if kind == "cancel":
            outcome, value = self.run(drive(wf, hooks, action, "cancel", choice.turns % 8))
            reason = "cancelled"
        else:
            outcome, value = self.run(drop(wf, action, choice.turns % 12 + 1, choice.again))
            reason = "cancelled" if choice.again else "abandoned"
        assert outcome in ("result", "cancelled"), (outcome, value)
        landed = self.observed(instance_id, before, standing, reason)
        self.stats.faults[f"{kind} (landed)" if landed else f"{kind} (too late)"] += 1

    def race(
        self, choice: Choices, instance_id: str, action: dict[str, Any], standing: Standing
    ) -> None:
        """Drop the action's stream (collected, not closed) and resume the instance at once, on
        the same workflow object or a new one, without letting the dropped run finish first."""
        model = self.models[instance_id]
        before = self.store.read(instance_id)
        wf, _ = self.workflow(instance_id, fresh=False)
        again, _ = self.workflow(instance_id, choice.again)
        count = choice.turns % 12 + 1
        how, value = self.run(drop_then_resume(wf, again, action, count))
        after = self.store.read(instance_id)
        dropped = [e for e in after[len(before) :] if e.type == "run_started"][:1]
        upto = after.index(dropped[0]) + 1 if dropped else len(before)
        landed = self.observed(instance_id, before, standing, "abandoned", upto=upto)
        self.stats.faults["race (landed)" if landed else "race (too late)"] += 1
        if not model.resumable():
            assert how == "refused", (how, value)
            assert [e for e in after[upto:] if e.type == "run_started"] == []
            return
        assert how == "result", (how, value)
        assert model.standing is not None
        model.begin(model.standing.copy())
        model.finish()
        assert value.status == model.runs[-1].end
        assert Counter(value.get_outputs()) == Counter(model.standing.outputs)

    def observed(
        self,
        instance_id: str,
        before: list[EventBase],
        standing: Standing,
        reason: str,
        upto: int | None = None,
    ) -> bool:
        """Apply to the model a run whose interruption point is read from the log: the run's
        commits, then (unless it ended) its next superstep aborted for ``reason``. Returns
        whether the interruption aborted a superstep."""
        model = self.models[instance_id]
        log = self.store.read(instance_id)
        new = log[len(before) : upto]
        started = [e for e in new if e.type == "run_started"]
        if not started:
            assert new == [], new  # interrupted before it appended anything
            return False
        assert len(started) == 1, started
        run_id = started[0].run_id
        commits = sum(
            1 for e in log[len(before) :] if e.type == "superstep_committed" and e.run_id == run_id
        )
        model.begin(standing)
        for n in range(commits):
            goes_on = model.commit()
            assert goes_on or n == commits - 1, "the log shows more commits than the run has"
        if model.runs[-1].end is None:
            model.abort(reason)
            return True
        return False

    def kill(self, instance_id: str, action: dict[str, Any], fault: Fault) -> None:
        """Run ``action`` in a child process that SIGKILLs itself at ``fault``."""
        said = Path(tempfile.mkdtemp(prefix="steplog-model-kill-")) / "said"
        try:
            process = self.processes.Process(
                target=workflow.kill_child,
                args=(
                    str(said),
                    self.url,
                    instance_id,
                    self.spec.to_json(),
                    self.durability,
                    json.dumps(action),
                    json.dumps(fault.to_json()),
                ),
            )
            process.start()
            process.join(60)
            if process.exitcode is None:
                process.kill()
                process.join()
                raise AssertionError(f"the killed action did not end in 60 s: {action}, {fault}")
            words = said.read_text() if said.exists() else ""
            assert process.exitcode == -signal.SIGKILL, (process.exitcode, words)
        finally:
            shutil.rmtree(said.parent, ignore_errors=True)

    # -- the checks ---------------------------------------------------------------------------

    @invariant()
    def agrees_with_the_model(self) -> None:
        if not self.models:
            return
        self.stats.steps += 1
        for instance_id in sorted(self.touched):
            self.check(instance_id)
        self.touched.clear()

    def check(self, instance_id: str) -> None:
        model = self.models[instance_id]
        events = self.store.read(instance_id)
        self.stats.checked += len(events)
        where = f"instance {instance_id}"

        # committed state: the kernel's fold, the workflow objects
        assert fold_committed(events).values == model.state, where
        wf, _ = self.workflow(instance_id, fresh=False)
        assert wf.committed_state() == model.state, where
        fresh, _ = self.workflow(instance_id, fresh=True)
        assert fresh.committed_state() == model.state, where

        # supersteps: the model's, in order; one marker each; runs ended as the model says
        starts = starts_of(events)
        markers = markers_of(events)
        assert all(len(found) == 1 for found in markers.values()), f"{where}: second marker"
        assert [s.index for s in starts] == [s.index for s in model.steps], where
        for start, step in zip(starts, model.steps, strict=True):
            marker = markers.get(start.superstep_id, [None])[0]
            if step.outcome == "open":
                assert marker is None, f"{where}: {start.superstep_id} should be open"
                assert model.open_run is not None, where
                assert model.open_run.killed, where
                continue
            assert marker is not None, f"{where}: superstep {start.superstep_id} has no marker"
            if step.outcome == "committed":
                assert marker.type == "superstep_committed", (where, marker)
            else:
                assert marker.type == "superstep_aborted", (where, marker)
                assert marker.reason == step.reason, (where, marker.reason, step.reason)
        ends = run_ends(events)
        assert ends == [run.end for run in model.runs], (where, ends)

        # a committed superstep staged the model's writes and yielded the model's outputs
        staged: dict[str, list[tuple[str, str, Any]]] = {}
        yielded: dict[str, list[Any]] = {}
        for event in events:
            if event.type == "state_staged":
                staged.setdefault(event.superstep_id, []).append((event.key, event.op, event.value))
            elif event.type == "output_yielded":
                yielded.setdefault(event.superstep_id, []).append(event.value)
        for start, step in zip(starts, model.steps, strict=True):
            if step.outcome == "committed":
                sid = start.superstep_id
                assert sorted(staged.get(sid, []), key=repr) == sorted(step.writes, key=repr)
                assert Counter(yielded.get(sid, [])) == Counter(step.outputs), (where, sid)

        # time travel to every closed superstep
        for start, step in zip(starts, model.steps, strict=True):
            if step.outcome == "open":
                continue
            at = state_at(events, AtSuperstep(start.superstep_id))
            assert at.values == step.state_after, (where, start.index, step.outcome)
            position = markers[start.superstep_id][0].position
            assert state_at(events, AtPosition(position)).values == step.state_after, where

        # blame: every write's verdict is its superstep's; current values are the model's
        outcome_of = {
            start.superstep_id: step for start, step in zip(starts, model.steps, strict=True)
        }
        blame = fold_blame(events)
        for key in blame.written_keys():
            for write in blame.writes(key):
                if write.from_fork:
                    assert model.forked_values.get(key) == write.value, where
                    continue
                step = outcome_of[write.superstep_id]
                if step.outcome == "committed":
                    assert write.status in ("committed", "superseded"), (where, write)
                elif step.outcome == "aborted":
                    assert (write.status, write.reason) == ("aborted", step.reason), (where, write)
                else:
                    assert write.status == "pending", (where, write)
        for key in KEYS + tuple(model.state):
            current = blame.current(key)
            if key in model.state:
                assert current is not None, (where, key)
                assert current.op == "set", (where, key)
                assert current.value == model.state[key], (where, key)
            else:
                assert current is None or current.op == "delete", (where, key, current)
        from_store = blame_keys(self.store, instance_id, list(KEYS))
        for key in KEYS:
            assert from_store.writes(key) == blame.writes(key), (where, key)

        # replay: each ended run's outputs are those of its committed supersteps
        run_ids = [e.run_id for e in events if e.type == "run_started"]
        for ordinal, (run_id, run) in enumerate(zip(run_ids, model.runs, strict=True)):
            if run.end is None:
                continue
            expected = [
                output
                for step in model.steps
                if step.run == ordinal and step.outcome == "committed"
                for output in step.outputs
            ]
            assert Counter(self.run(replayed_outputs(self.store, run_id))) == Counter(expected)

        # an open with the instance's snapshot decides what an open of the whole log decides
        with_snapshot, note = views_of(fresh, snapshots=True)
        assert not note.startswith("ignored"), (where, note)
        assert with_snapshot == views_of(fresh, snapshots=False)[0], (where, note)

        # what a continuation would do
        if model.standing is not None:
            pending = sorted(r.data.key for r in fresh.pending_requests())
            assert pending == sorted(model.standing.requests), where
        checkpoints = fresh.checkpoints()
        if checkpoints:
            assert checkpoints[-1].status == model.status(), (where, checkpoints[-1])

        # the chain, once the store keeps one
        verify = getattr(self.store, "verify_chain", None)
        if verify is not None:
            report = verify(instance_id)
            assert report.ok, (where, report.problems)


async def replayed_outputs(store: EventStore, run_id: str) -> list[Any]:
    return [event.data async for event in replay(store, run_id) if event.type == "output"]


def starts_of(events: list[EventBase]) -> list[Any]:
    """The ``SuperstepStarted`` events, in log order."""
    return [e for e in events if e.type == "superstep_started"]


def markers_of(events: list[EventBase]) -> dict[str, list[Any]]:
    """superstep id -> its markers, in log order."""
    found: dict[str, list[Any]] = {}
    for event in events:
        if event.type in SUPERSTEP_MARKER_TYPES:
            found.setdefault(event.superstep_id, []).append(event)
    return found


def run_ends(events: list[EventBase]) -> list[str | None]:
    """How each run ended, in the order the runs started (None: still open)."""
    ends: dict[str, str | None] = {}
    for event in events:
        if event.type == "run_started":
            ends[event.run_id] = None
        elif event.type in RUN_END_TYPES and ends.get(event.run_id, "") is None:
            kind = event.type.removeprefix("run_")
            ends[event.run_id] = event.reason if kind == "abandoned" else kind
    return list(ends.values())


def fault_points(model: InstanceModel, standing: Standing) -> list[tuple[int, int, str, int]]:
    """Every point a fault can fire at in a run from ``standing``, if nothing fails before it:
    (supersteps committed before it, superstep index, node, operation point)."""
    sim = InstanceModel(model.instance_id, model.spec)
    sim.state = dict(model.state)
    sim.begin(standing.copy())
    points: list[tuple[int, int, str, int]] = []
    ordinal = 0
    while True:
        now = sim.standing
        assert now is not None
        for node in sorted(now.active):
            ops = ops_of(now, node)
            points.extend((ordinal, now.index, node, at) for at in range(len(ops) + 1))
        for node in sorted({node for node, _, _ in now.responses}):
            points.append((ordinal, now.index, node, RESPONSE))
        if not sim.commit():
            return points
        ordinal += 1


# -- driving a run ------------------------------------------------------------------------------


async def drive(
    wf: Workflow, hooks: Hooks, action: dict[str, Any], kind: str, turns: int
) -> tuple[str, Any]:
    """Run ``action``; for ``block``, cancel the caller ``turns`` loop turns after the handler
    blocked; for ``cancel``, ``turns`` loop turns after it started. Returns ("result", RunResult),
    ("raised", exception) or ("cancelled", None)."""
    task = asyncio.get_running_loop().create_task(act(wf, action))
    if kind == "block":
        assert hooks.blocked is not None
        waiter = asyncio.ensure_future(hooks.blocked.wait())
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if task.done():
            return outcome_of(task)
    for _ in range(turns if kind in ("block", "cancel") else 0):
        if task.done():
            break
        await asyncio.sleep(0)
    if kind in ("block", "cancel"):
        task.cancel()
    await asyncio.wait({task})
    return outcome_of(task)


def outcome_of(task: asyncio.Task[Any]) -> tuple[str, Any]:
    if task.cancelled():
        return "cancelled", None
    error = task.exception()
    if error is not None:
        return "raised", error
    return "result", task.result()


def stream_of(wf: Workflow, action: dict[str, Any]) -> Any:
    """The action's run, streamed."""
    kind = action["kind"]
    if kind == "run":
        job = workflow.job_from_json(action["job"])
        return wf.run(job, stream=True, supersede_requests=True)
    if kind == "resume":
        return wf.resume(stream=True)
    return wf.run(responses=action["responses"], stream=True)


async def drop_then_resume(
    wf: Workflow, again: Workflow, action: dict[str, Any], count: int
) -> tuple[str, Any]:
    """Consume ``count`` events of the action's stream, drop it, and at once ``again.resume()``;
    then wait for the dropped run's task. Returns the resume's outcome: ("result", RunResult),
    ("refused", ResumeError) or ("raised", another exception)."""
    stream = stream_of(wf, action)
    name = f"steplog-run:{stream.run_id}"
    seen = 0
    async for _ in stream:
        seen += 1
        if seen >= count:
            break
    task = next((t for t in asyncio.all_tasks() if t.get_name() == name), None)
    del stream
    gc.collect()
    resumed: tuple[str, Any]
    try:
        resumed = ("result", await again.resume())
    except ResumeError as refused:
        resumed = ("refused", refused)
    except Exception as error:
        resumed = ("raised", error)
    if task is not None:
        await asyncio.wait({task})
    return resumed


async def drop(wf: Workflow, action: dict[str, Any], count: int, close: bool) -> tuple[str, Any]:
    """Consume ``count`` events of the action's stream, then close it (``aclose``) or drop it
    (collected); wait until its run has recorded its end."""
    stream = stream_of(wf, action)
    run_id = stream.run_id
    seen = 0
    ended = True
    async for _ in stream:
        seen += 1
        if seen >= count:
            ended = False
            break
    name = f"steplog-run:{run_id}"
    task = next((t for t in asyncio.all_tasks() if t.get_name() == name), None)
    if close:
        await stream.aclose()
    del stream
    gc.collect()
    if task is not None:
        await asyncio.wait({task})
    return ("result" if ended else "cancelled"), None


# -- the tests ----------------------------------------------------------------------------------


def pg_server() -> str | None:
    url = os.environ.get(PG_ENV) or DEFAULT_PG_URL
    try:
        with psycopg.connect(url, connect_timeout=2) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error:
        return None
    return url


@pytest.mark.parametrize("store_kind", ["memory", "sqlite", "postgres"])
def test_the_kernel_agrees_with_the_model(store_kind: str) -> None:
    """Random workflows, actions and faults against the reference model (module docstring)."""
    if store_kind not in stores_to_run():
        pytest.skip(f"{store_kind} is not in STEPLOG_MODEL_STORES")
    server = None
    if store_kind == "postgres":
        server = pg_server()
        if server is None:
            if os.environ.get("CI", "").strip().lower() == "true":
                pytest.fail("PostgreSQL is not reachable (CI=true: the model must run on it)")
            pytest.skip("PostgreSQL is not reachable")
    processes = multiprocessing.get_context("forkserver")
    processes.set_forkserver_preload(PRELOAD)
    stats = Stats()
    machine = type(
        "Machine",
        (KernelMachine,),
        {"stores": Stores(store_kind, server), "stats": stats, "processes": processes},
    )
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=examples_for(store_kind),
            stateful_step_count=steps_per_example(),
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        ),
    )
    report = os.environ.get("STEPLOG_MODEL_REPORT")
    if report:
        path = Path(report)
        found = json.loads(path.read_text()) if path.exists() else {}
        found[store_kind] = stats.to_json()
        path.write_text(json.dumps(found, indent=2))
    print(f"model-based ({store_kind}): {json.dumps(stats.to_json())}")
