"""Agent Framework's output designation: ``output_from=`` and ``intermediate_output_from=`` decide
which yields the caller gets as workflow outputs, which as intermediate outputs, and which not at
all. The log records every yield with its designation; nothing reaches a consumer before its
superstep commits."""

from __future__ import annotations

import asyncio
from typing import Any, Never

import pytest

from kernel import (
    DefinitionError,
    Executor,
    OutputYielded,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowEvent,
    handler,
    open_store,
    replay,
)
from kernel.testing import LogBuilder
from tests.kernel.helpers import FailsAfter, of_type


class Plan(Executor):
    """Yields a progress note, then sends the number on."""

    @handler
    async def run(self, n: int, ctx: WorkflowContext[int, str]) -> None:
        await ctx.yield_output(f"plan:{n}")
        await ctx.send_message(n)


class Answer(Executor):
    @handler
    async def run(self, n: int, ctx: WorkflowContext[Never, str]) -> None:
        await ctx.yield_output(f"{self.id}:{n}")


class Relay(Executor):
    """Sends on, and declares that it yields nothing."""

    @handler
    async def run(self, n: int, ctx: WorkflowContext[int]) -> None:
        await ctx.send_message(n)


def workflow(store_url: str, **designation: Any) -> Any:
    """plan -> (answer, note): plan yields a note, answer and note yield their own."""
    plan, answer, note = Plan("plan"), Answer("answer"), Answer("note")
    designation = {
        k: [{"plan": plan, "answer": answer, "note": note}.get(i, i) for i in v]
        if isinstance(v, list)
        else v
        for k, v in designation.items()
    }
    return (
        WorkflowBuilder(start_executor=plan, store=open_store(store_url), **designation)
        .add_fan_out_edges(plan, [answer, note])
        .build()
    )


async def streamed(wf: Any, message: Any) -> list[WorkflowEvent]:
    return [e async for e in wf.run(message, stream=True)]


def yields(events: list[WorkflowEvent]) -> list[tuple[str, Any]]:
    return [(e.type, e.data) for e in events if e.type in ("output", "intermediate")]


def logged(wf: Any) -> list[tuple[str, str]]:
    return [(e.executor_id, e.designation) for e in of_type(wf.events(), "output_yielded")]


@pytest.mark.parametrize(
    ("designation", "outputs", "intermediates", "recorded"),
    [
        pytest.param(
            {},
            ["plan:1", "answer:1", "note:1"],
            [],
            ["output", "output", "output"],
            id="default: every yield is an output",
        ),
        pytest.param(
            {"output_from": ["answer"]},
            ["answer:1"],
            [],
            ["hidden", "output", "hidden"],
            id="output_from only: the others are hidden",
        ),
        pytest.param(
            {"output_from": ["answer"], "intermediate_output_from": "all_other"},
            ["answer:1"],
            ["plan:1", "note:1"],
            ["intermediate", "output", "intermediate"],
            id="all_other",
        ),
        pytest.param(
            {"intermediate_output_from": "all_other"},
            [],
            ["plan:1", "answer:1", "note:1"],
            ["intermediate", "intermediate", "intermediate"],
            id="all_other without output_from: progress only",
        ),
        pytest.param(
            {"output_from": ["answer"], "intermediate_output_from": ["plan"]},
            ["answer:1"],
            ["plan:1"],
            ["intermediate", "output", "hidden"],
            id="both listed",
        ),
        pytest.param(
            {"output_from": "all"},
            ["plan:1", "answer:1", "note:1"],
            [],
            ["output", "output", "output"],
            id="output_from=all",
        ),
        pytest.param(
            {"intermediate_output_from": "all"},
            [],
            ["plan:1", "answer:1", "note:1"],
            ["intermediate", "intermediate", "intermediate"],
            id="intermediate_output_from=all",
        ),
    ],
)
async def test_the_designation_decides_what_the_caller_gets_and_the_log_keeps_every_yield(
    store_url: str,
    designation: dict[str, Any],
    outputs: list[str],
    intermediates: list[str],
    recorded: list[str],
) -> None:
    wf = workflow(store_url, **designation)
    result = await wf.run(1)
    assert result.get_outputs() == outputs
    assert result.get_intermediate_outputs() == intermediates
    assert logged(wf) == list(zip(["plan", "answer", "note"], recorded, strict=True))
    shown = yields(await streamed(wf, 2))
    assert sorted(shown) == sorted(
        [("output", o.replace("1", "2")) for o in outputs]
        + [("intermediate", i.replace("1", "2")) for i in intermediates]
    )
    second = of_type(wf.events(), "run_started")[-1].run_id
    in_log = [
        (e.designation, e.value)
        for e in of_type(wf.events(), "output_yielded")
        if e.run_id == second and e.designation != "hidden"
    ]
    assert shown == in_log  # in log order: superstep 1's yields before superstep 2's
    # The stream a consumer got is what the log says it got.
    assert yields([e async for e in replay(wf.store, second)]) == shown


async def test_the_accessors_report_the_designation(store_url: str) -> None:
    wf = workflow(store_url, output_from=["answer"], intermediate_output_from=["plan"])
    assert [e.id for e in wf.get_output_executors()] == ["answer"]
    assert [e.id for e in wf.get_intermediate_executors()] == ["plan"]
    assert wf.is_terminal_executor("answer")
    assert not wf.is_terminal_executor("note")
    assert wf.is_intermediate_executor("plan")
    assert not wf.is_intermediate_executor("answer")
    default = workflow(store_url)
    assert [e.id for e in default.get_output_executors()] == ["plan", "answer", "note"]
    assert default.get_intermediate_executors() == []
    assert default.is_terminal_executor("anything")


async def test_an_aborted_superstep_streams_no_intermediate_output(store_url: str) -> None:
    go = asyncio.Event()

    class Notes(Executor):
        @handler
        async def run(self, n: int, ctx: WorkflowContext[Never, str]) -> None:
            await ctx.yield_output(f"note:{n}")
            go.set()

    start = Relay("start")
    wf = (
        WorkflowBuilder(
            start_executor=start,
            store=open_store(store_url),
            intermediate_output_from="all",
        )
        .add_fan_out_edges(start, [Notes("notes"), FailsAfter("boom", go, "boom")])
        .build()
    )
    seen: list[WorkflowEvent] = []

    async def consume() -> None:
        async for event in wf.run(1, stream=True):
            seen.append(event)

    with pytest.raises(ValueError, match="boom"):
        await consume()
    assert yields(seen) == []
    events = wf.events()
    (yielded,) = of_type(events, "output_yielded")
    assert (yielded.executor_id, yielded.value, yielded.designation) == (
        "notes",
        "note:1",
        "intermediate",
    )
    aborted = of_type(events, "superstep_aborted")
    assert [a.superstep_id for a in aborted] == [yielded.superstep_id]


async def test_a_resumed_run_counts_its_lineage_intermediate_outputs(store_url: str) -> None:
    failures = {"left": 1}

    class Flaky(Executor):
        @handler
        async def run(self, n: int, ctx: WorkflowContext[Never, str]) -> None:
            if failures["left"]:
                failures["left"] -= 1
                raise ValueError("flaky")
            await ctx.yield_output(f"answer:{n}")

    plan, answer = Plan("plan"), Flaky("answer")
    wf = (
        WorkflowBuilder(
            start_executor=plan,
            store=open_store(store_url),
            output_from=[answer],
            intermediate_output_from="all_other",
        )
        .add_edge(plan, answer)
        .build()
    )
    with pytest.raises(ValueError, match="flaky"):
        await wf.run(5)
    result = await wf.resume()
    assert result.get_outputs() == ["answer:5"]
    assert result.get_intermediate_outputs() == ["plan:5"]  # from the run it continues


def test_output_executors_is_the_older_name_of_output_from() -> None:
    with pytest.warns(DeprecationWarning, match="output_from"):
        wf = workflow("memory://", output_executors=["answer"])
    assert [e.id for e in wf.get_output_executors()] == ["answer"]
    with pytest.raises(DefinitionError, match="give only output_from"):
        workflow("memory://", output_executors=["answer"], output_from=["answer"])


@pytest.mark.parametrize(
    ("designation", "says"),
    [
        ({"output_from": []}, "names no executor"),
        ({"output_from": [], "intermediate_output_from": []}, "names no executor"),
        ({"output_from": ["answer", "answer"]}, r"output_from names \['answer'\] more than once"),
        (
            {"output_from": ["answer"], "intermediate_output_from": ["answer"]},
            r"\['answer'\] are designated both as output and as intermediate",
        ),
        (
            {"output_from": ["answer"], "intermediate_output_from": "all"},
            r"\['answer'\] are designated both",
        ),
        ({"output_from": ["ghost"]}, "output executor 'ghost' is not in the workflow graph"),
        ({"output_from": "everything"}, r"output_from='everything' is not a designation"),
        ({"output_from": "all_other"}, r"give a list of executors, or 'all'$"),
        ({"intermediate_output_from": "some"}, "'all', 'all_other'"),
        ({"output_from": [3]}, "output_from lists 3: give executors or executor ids"),
    ],
)
def test_a_designation_that_cannot_hold_is_refused_at_build(
    designation: dict[str, Any], says: str
) -> None:
    with pytest.raises(DefinitionError, match=says):
        workflow("memory://", **designation)


def test_an_executor_that_declares_it_yields_nothing_cannot_be_designated() -> None:
    relay, answer = Relay("relay"), Answer("answer")
    builder = WorkflowBuilder(start_executor=relay, output_from=[relay]).add_edge(relay, answer)
    with pytest.raises(DefinitionError, match="output executor 'relay' declares that it yields"):
        builder.build()
    # ``"all"`` leaves it out rather than failing.
    wf = WorkflowBuilder(start_executor=relay, output_from="all").add_edge(relay, answer).build()
    assert [e.id for e in wf.get_output_executors()] == ["answer"]


async def test_an_old_log_without_designations_reads_as_outputs(store_url: str) -> None:
    wf = workflow(store_url)
    await wf.run(1)
    yielded = of_type(wf.events(), "output_yielded")
    # The default is a trailing default: an OutputYielded written before the field existed is
    # the same event, and decodes as an output.
    old = OutputYielded.model_validate(yielded[0].model_dump(exclude={"designation"}))
    assert old == yielded[0]
    assert old.designation == "output"


async def test_replay_of_a_hand_built_log_follows_the_recorded_designations() -> None:
    store = open_store("memory://")
    log = LogBuilder("by-hand")
    run_id = log.start_run(1, workflow_name="plan").run_id
    log.start_superstep()
    log.invoke("plan")
    log.output("progress", designation="intermediate")
    log.output("secret", designation="hidden")
    log.output("answer")
    log.complete()
    log.commit()
    log.complete_run()
    log.append_to(store)
    yielded = [(e.value, e.designation) for e in of_type(store.read("by-hand"), "output_yielded")]
    assert yielded == [("progress", "intermediate"), ("secret", "hidden"), ("answer", "output")]
    shown = yields([e async for e in replay(store, run_id)])
    assert shown == [("intermediate", "progress"), ("output", "answer")]
