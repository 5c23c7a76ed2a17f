"""A built workflow's definition, as Agent Framework exposes it: ``max_iterations``,
``description``, the executor accessors, and ``to_dict()``/``to_json()`` in AF's shape."""

from __future__ import annotations

import json
from typing import Any, Never

import pytest

from kernel import (
    Case,
    ConvergenceError,
    Default,
    DefinitionError,
    Executor,
    FunctionExecutor,
    WorkflowBuilder,
    WorkflowContext,
    executor,
    handler,
    open_store,
)
from tests.kernel.helpers import of_type


class Relay(Executor):
    @handler
    async def run(self, n: int, ctx: WorkflowContext[int]) -> None:
        await ctx.send_message(n)


class Answer(Executor):
    @handler
    async def run(self, n: int, ctx: WorkflowContext[Never, int]) -> None:
        await ctx.yield_output(n)


class Gather(Executor):
    @handler
    async def run(self, ns: list[int], ctx: WorkflowContext[Never, int]) -> None:
        await ctx.yield_output(sum(ns))


class Loop(Executor):
    @handler
    async def run(self, n: int, ctx: WorkflowContext[int]) -> None:
        await ctx.send_message(n + 1)


@executor(id="fn")
async def fn(n: int, ctx: WorkflowContext[Never, int]) -> None:
    await ctx.yield_output(n)


def is_small(n: int) -> bool:
    return n < 10


def pick_all(n: int, targets: list[str]) -> list[str]:
    return targets


async def test_max_iterations_is_max_supersteps(store_url: str) -> None:
    loop = Loop("loop")
    wf = (
        WorkflowBuilder(start_executor=loop, store=open_store(store_url), max_iterations=3)
        .add_edge(loop, loop)
        .build()
    )
    assert (wf.max_iterations, wf.max_supersteps) == (3, 3)
    with pytest.raises(ConvergenceError, match="max_supersteps=3"):
        await wf.run(0)
    assert len(of_type(wf.events(), "superstep_committed")) == 3
    same = WorkflowBuilder(start_executor=Answer("a"), max_iterations=7, max_supersteps=7).build()
    assert same.max_iterations == 7
    assert WorkflowBuilder(start_executor=Answer("a")).build().max_iterations == 100


def test_max_iterations_and_max_supersteps_that_disagree_are_refused() -> None:
    with pytest.raises(DefinitionError, match="max_supersteps=5 and max_iterations=6 disagree"):
        WorkflowBuilder(start_executor=Answer("a"), max_supersteps=5, max_iterations=6)
    with pytest.raises(DefinitionError, match="max_supersteps must be a positive int"):
        WorkflowBuilder(start_executor=Answer("a"), max_iterations=0).build()


async def test_name_and_description_are_kept(store_url: str) -> None:
    wf = WorkflowBuilder(
        start_executor=Answer("a"),
        store=open_store(store_url),
        name="pricing",
        description="prices an order",
    ).build()
    assert (wf.name, wf.description) == ("pricing", "prices an order")
    await wf.run(1)
    assert of_type(wf.events(), "run_started")[0].workflow_name == "pricing"
    assert WorkflowBuilder(start_executor=Answer("a")).build().description is None
    with pytest.raises(DefinitionError, match="description must be a string"):
        WorkflowBuilder(start_executor=Answer("a"), description=3)  # type: ignore[arg-type]
    with pytest.raises(DefinitionError, match="a workflow description must be valid Unicode"):
        WorkflowBuilder(start_executor=Answer("a"), description="\ud800").build()


def test_the_executor_accessors() -> None:
    start, answer = Relay("start"), Answer("answer")
    wf = WorkflowBuilder(start_executor=start).add_edge(start, answer).build()
    assert wf.get_start_executor() is start
    assert wf.start_executor_id == "start"
    assert wf.get_executors_list() == [start, answer]
    assert wf.executors == {"start": start, "answer": answer}
    wf.executors.clear()  # a copy: the workflow's graph is unchanged
    assert list(wf.executors) == ["start", "answer"]


class Narrate(Executor):
    @handler
    async def run(self, text: str, ctx: WorkflowContext[int, str]) -> None:
        await ctx.yield_output(f"counting {text!r}")
        await ctx.send_message(len(text))


def test_input_and_output_types_are_the_start_executors_and_the_output_executors() -> None:
    def graph(**kwargs: Any) -> Any:
        narrate, answer = Narrate("narrate"), Answer("answer")
        return WorkflowBuilder(start_executor=narrate, **kwargs).add_edge(narrate, answer).build()

    assert graph().input_types == [str]
    assert graph().output_types == [str, int]  # every executor's yields are outputs
    # With a designation, a hidden executor's yields are no output of the workflow.
    assert graph(output_from=["answer"]).output_types == [int]
    assert graph(output_from=["narrate"]).output_types == [str]


def graph_of_every_kind(**kwargs: Any) -> Any:
    start, left, right, small = Relay("start"), Relay("left"), Relay("right"), Answer("small")
    big, gather, other = Answer("big"), Gather("gather"), Answer("other")
    return (
        WorkflowBuilder(start_executor=start, name="kinds", instance_id="inst-1", **kwargs)
        .add_fan_out_edges(start, [left, right])
        .add_fan_in_edges([left, right], gather)
        .add_switch_case_edge_group(start, [Case(is_small, small), Default(big)])
        .add_multi_selection_edge_group(start, [other, fn], pick_all)
        .add_edge(left, small, condition=lambda n: n > 0)
        .build()
    )


def test_to_dict_has_agent_frameworks_shape() -> None:
    wf = graph_of_every_kind(max_iterations=9, description="all kinds", output_from=[fn])
    assert wf.to_dict() == {
        "name": "kinds",
        "id": "inst-1",
        "start_executor_id": "start",
        "max_iterations": 9,
        "edge_groups": [
            {
                "id": "FanOutEdgeGroup/0",
                "type": "FanOutEdgeGroup",
                "edges": [
                    {"source_id": "start", "target_id": "left"},
                    {"source_id": "start", "target_id": "right"},
                ],
                "selection_func_name": None,
            },
            {
                "id": "FanInEdgeGroup/1",
                "type": "FanInEdgeGroup",
                "edges": [
                    {"source_id": "left", "target_id": "gather"},
                    {"source_id": "right", "target_id": "gather"},
                ],
            },
            {
                "id": "SwitchCaseEdgeGroup/2",
                "type": "SwitchCaseEdgeGroup",
                "edges": [
                    {"source_id": "start", "target_id": "small"},
                    {"source_id": "start", "target_id": "big"},
                ],
                "selection_func_name": None,
                "cases": [
                    {"target_id": "small", "type": "Case", "condition_name": "is_small"},
                    {"target_id": "big", "type": "Default"},
                ],
            },
            {
                "id": "FanOutEdgeGroup/3",
                "type": "FanOutEdgeGroup",
                "edges": [
                    {"source_id": "start", "target_id": "other"},
                    {"source_id": "start", "target_id": "fn"},
                ],
                "selection_func_name": "pick_all",
            },
            {
                "id": "SingleEdgeGroup/4",
                "type": "SingleEdgeGroup",
                "edges": [
                    {"source_id": "left", "target_id": "small", "condition_name": "<lambda>"}
                ],
            },
        ],
        "executors": {
            "start": {"id": "start", "type": "Relay"},
            "left": {"id": "left", "type": "Relay"},
            "right": {"id": "right", "type": "Relay"},
            "gather": {"id": "gather", "type": "Gather"},
            "small": {"id": "small", "type": "Answer"},
            "big": {"id": "big", "type": "Answer"},
            "other": {"id": "other", "type": "Answer"},
            "fn": {"id": "fn", "type": "FunctionExecutor"},
        },
        "output_executors": ["fn"],
        "intermediate_executors": [],
        "description": "all kinds",
    }


def test_to_json_is_to_dict_and_stable_across_builds() -> None:
    first = graph_of_every_kind()
    data = json.loads(first.to_json())
    assert data == first.to_dict()
    assert (data["output_executors"], data["intermediate_executors"]) == (None, None)
    assert "description" not in data
    assert graph_of_every_kind().to_json() == first.to_json()


def test_a_nested_workflow_appears_under_its_executor() -> None:
    inner = WorkflowBuilder(start_executor=Answer("leaf"), name="inner").build()

    class Runs(Executor):
        """Stands for an executor that runs a workflow (``WorkflowExecutor``)."""

        def __init__(self, id: str, workflow: Any) -> None:
            super().__init__(id)
            self.workflow = workflow

        @handler
        async def run(self, n: int, ctx: WorkflowContext[Never, int]) -> None:
            await ctx.yield_output(n)

    start = Relay("start")
    outer = WorkflowBuilder(start_executor=start).add_edge(start, Runs("sub", inner)).build()
    nested = outer.to_dict()["executors"]["sub"]
    assert nested["type"] == "Runs"
    assert nested["workflow"] == inner.to_dict()


def test_a_function_executor_is_named_by_its_class() -> None:
    assert isinstance(fn, FunctionExecutor)
    wf = WorkflowBuilder(start_executor=fn).build()
    assert wf.to_dict()["executors"] == {"fn": {"id": "fn", "type": "FunctionExecutor"}}
