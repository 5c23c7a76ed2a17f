"""Agent Framework's pure-workflow samples (no model calls), ported to steplog.

Each test re-tells one AF 1.23 sample from ``python/samples/.../workflows/`` in its own words.
The sample's imports become ``from kernel import ...``, inside the test, as the sample's module
would import them (so a name that steplog lacks fails that test alone). Every other line that had
to change is marked ``# port:`` with the reason.

The samples build their workflows without ``store=``, as AF's do: ``default_store`` points
``$STEPLOG_STORE`` at memory, then at a SQLite file, so each test runs on both backends with the
sample's code unchanged. The assertions are what each sample prints or promises.

The list of samples, and which ran before this file was written, is in docs/porting.md
("Pure-workflow samples").
"""

import asyncio
import random
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Never, cast

import pytest

from kernel import Workflow


def run_types(workflow: Workflow) -> list[str]:
    """The run-level events of the workflow's instance, as the log holds them."""
    return [e.type for e in workflow.events() if e.type.startswith("run_")]


def executor_events(workflow: Workflow) -> list[tuple[str, str]]:
    """``(type, executor_id)`` of every executor event in the instance's log, in order."""
    return [
        (e.type, cast(Any, e).executor_id)
        for e in workflow.events()
        if e.type in ("executor_invoked", "executor_completed")
    ]


# -- _start-here/step1_executors_and_edges.py (in 1.x: 01-get-started/05_first_workflow.py) -----


async def test_step1_executors_and_edges(default_store: str) -> None:
    from kernel import (
        Executor,
        WorkflowBuilder,
        WorkflowContext,
        WorkflowRunState,
        executor,
        handler,
    )

    class UpperCase(Executor):
        def __init__(self, id: str):
            super().__init__(id=id)

        @handler
        async def to_upper_case(self, text: str, ctx: WorkflowContext[str]) -> None:
            await ctx.send_message(text.upper())

    @executor(id="reverse_text")
    async def reverse_text(text: str, ctx: WorkflowContext[Never, str]) -> None:
        await ctx.yield_output(text[::-1])

    upper = UpperCase(id="upper_case")
    workflow = WorkflowBuilder(start_executor=upper).add_edge(upper, reverse_text).build()
    events = await workflow.run("hello world")

    assert events.get_outputs() == ["DLROW OLLEH"]
    assert events.get_final_state() == WorkflowRunState.IDLE
    assert run_types(workflow) == ["run_started", "run_completed"]


# -- sequential/sequential.py: two chains, one with explicit @handler types --------------------


async def test_sequential_chains_with_explicit_handler_types(default_store: str) -> None:
    from kernel import Executor, WorkflowBuilder, WorkflowContext, executor, handler

    class UpperCase(Executor):
        def __init__(self, id: str):
            super().__init__(id=id)

        @handler
        async def to_upper_case(self, text: str, ctx: WorkflowContext[str]) -> None:
            await ctx.send_message(text.upper())

    @executor(id="reverse_text_executor")
    async def reverse_text(text: str, ctx: WorkflowContext[Never, str]) -> None:
        await ctx.yield_output(text[::-1])

    class ExclamationAdder(Executor):
        """Its handler has no annotations: the decorator says what it takes and sends."""

        def __init__(self, id: str):
            super().__init__(id=id)

        @handler(input=str, output=str)
        async def add_exclamation(self, message, ctx) -> None:
            await ctx.send_message(f"{message}!!!")

    upper_case = UpperCase(id="upper_case_executor")
    two_steps = (
        WorkflowBuilder(start_executor=upper_case).add_edge(upper_case, reverse_text).build()
    )
    first = await two_steps.run("hello world")
    assert first.get_outputs() == ["DLROW OLLEH"]

    shouting = ExclamationAdder(id="exclamation_adder")
    three_steps = (
        WorkflowBuilder(start_executor=upper_case)
        .add_edge(upper_case, shouting)
        .add_edge(shouting, reverse_text)
        .build()
    )
    second = await three_steps.run("hello world")
    assert second.get_outputs() == ["!!!DLROW OLLEH"]
    assert run_types(three_steps) == ["run_started", "run_completed"]


# -- control-flow/sequential_executors.py: class executors, a streamed run ---------------------


async def test_sequential_executors_streamed(default_store: str) -> None:
    from kernel import Executor, WorkflowBuilder, WorkflowContext, handler

    class UpperCaseExecutor(Executor):
        @handler
        async def to_upper_case(self, text: str, ctx: WorkflowContext[str]) -> None:
            await ctx.send_message(text.upper())

    class ReverseTextExecutor(Executor):
        @handler
        async def reverse_text(self, text: str, ctx: WorkflowContext[Never, str]) -> None:
            await ctx.yield_output(text[::-1])

    upper_case_executor = UpperCaseExecutor(id="upper_case_executor")
    reverse_text_executor = ReverseTextExecutor(id="reverse_text_executor")
    workflow = (
        WorkflowBuilder(start_executor=upper_case_executor)
        .add_edge(upper_case_executor, reverse_text_executor)
        .build()
    )

    printed: list[str] = []
    outputs: list[str] = []
    async for event in workflow.run("hello world", stream=True):
        printed.append(f"Event: {event}")  # the sample prints every event
        if event.type == "output":
            outputs.append(cast(str, event.data))

    assert outputs == ["DLROW OLLEH"]
    assert any("executor_invoked" in line for line in printed)
    assert executor_events(workflow) == [
        ("executor_invoked", "upper_case_executor"),
        ("executor_completed", "upper_case_executor"),
        ("executor_invoked", "reverse_text_executor"),
        ("executor_completed", "reverse_text_executor"),
    ]


# -- control-flow/sequential_streaming.py: function executors, the events of a stream ----------


async def test_sequential_streaming_shows_executor_events(default_store: str) -> None:
    from kernel import WorkflowBuilder, WorkflowContext, executor

    @executor(id="upper_case_executor")
    async def to_upper_case(text: str, ctx: WorkflowContext[str]) -> None:
        await ctx.send_message(text.upper())

    @executor(id="reverse_text_executor")
    async def reverse_text(text: str, ctx: WorkflowContext[Never, str]) -> None:
        await ctx.yield_output(text[::-1])

    workflow = (
        WorkflowBuilder(start_executor=to_upper_case).add_edge(to_upper_case, reverse_text).build()
    )

    seen: list[tuple[str, str | None]] = []
    result: str | None = None
    async for event in workflow.run("hello world", stream=True):
        if event.type in ("executor_invoked", "executor_completed", "output"):
            seen.append((event.type, event.executor_id))
        if event.type == "output":
            result = event.data

    assert result == "DLROW OLLEH"
    # what the sample's comment lists: each executor's invoke and completion, and the output
    # (steplog hands the output over once its superstep commits: after the completion)
    assert seen == [
        ("executor_invoked", "upper_case_executor"),
        ("executor_completed", "upper_case_executor"),
        ("executor_invoked", "reverse_text_executor"),
        ("executor_completed", "reverse_text_executor"),
        ("output", "reverse_text_executor"),
    ]


# -- control-flow/workflow_cancellation.py: cancel a run's task mid-superstep ------------------


async def test_workflow_cancellation(default_store: str) -> None:
    from kernel import WorkflowBuilder, WorkflowContext, executor

    # port: the sample's steps sleep 2 s each and it cancels after 3 s, during step2; here step2
    # says when it has started and then waits until it is let go, so nothing depends on timing
    step2_started = asyncio.Event()
    step2_may_finish = asyncio.Event()
    trace: list[str] = []

    @executor(id="step1")
    async def step1(text: str, ctx: WorkflowContext[str]) -> None:
        trace.append("step1")
        await ctx.send_message(text.upper())

    @executor(id="step2")
    async def step2(text: str, ctx: WorkflowContext[str]) -> None:
        trace.append("step2")
        step2_started.set()  # port: see above
        await step2_may_finish.wait()  # port: was asyncio.sleep(2)
        await ctx.send_message(text + "!")

    @executor(id="step3")
    async def step3(text: str, ctx: WorkflowContext[Never, str]) -> None:
        trace.append("step3")
        await ctx.yield_output(f"Result: {text}")

    def build_workflow() -> Workflow:
        return (
            WorkflowBuilder(start_executor=step1)
            .add_edge(step1, step2)
            .add_edge(step2, step3)
            .build()
        )

    workflow = build_workflow()
    task = asyncio.create_task(workflow.run("hello world"))
    await step2_started.wait()  # port: was asyncio.sleep(3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert trace == ["step1", "step2"]  # step3 never ran
    # steplog records the cancellation: the open superstep aborted, the run ended
    assert run_types(workflow) == ["run_started", "run_cancelled"]

    trace.clear()
    step2_may_finish.set()
    workflow = build_workflow()
    result = await workflow.run("hello world")
    assert result.get_outputs() == ["Result: HELLO WORLD!"]
    assert trace == ["step1", "step2", "step3"]


# -- control-flow/intermediate_vs_terminal_outputs.py ------------------------------------------


@dataclass
class Message:
    """port: stands in for AF's chat ``Message`` (the agent layer, which steplog does not have):
    the sample reads only ``.text`` of the first message."""

    role: str
    contents: list[str]

    @property
    def text(self) -> str:
        return " ".join(self.contents)


QUESTION = "life, the universe, and everything"


def planning_executors() -> tuple[Any, Any, Any]:
    """The sample's three steps: two yield progress notes, the last the answer."""
    from kernel import WorkflowContext, executor

    @executor(id="planner")
    async def planner(messages: list[Message], ctx: WorkflowContext[list[Message], str]) -> None:
        await ctx.yield_output(f"plan: starting work on '{messages[0].text}'")
        await ctx.send_message(messages)

    @executor(id="researcher")
    async def researcher(messages: list[Message], ctx: WorkflowContext[list[Message], str]) -> None:
        await ctx.yield_output(f"research: gathering data for '{messages[0].text}'")
        await ctx.send_message(messages)

    @executor(id="answerer")
    async def answerer(messages: list[Message], ctx: WorkflowContext[Never, str]) -> None:
        await ctx.yield_output(f"final answer to '{messages[0].text}': 42")

    return planner, researcher, answerer


async def test_intermediate_vs_terminal_outputs(default_store: str) -> None:
    from kernel import WorkflowBuilder

    planner, researcher, answerer = planning_executors()
    workflow = (
        WorkflowBuilder(
            start_executor=planner,
            output_from=[answerer],
            intermediate_output_from=[planner, researcher],
        )
        .add_edge(planner, researcher)
        .add_edge(researcher, answerer)
        .build()
    )
    initial = [Message(role="user", contents=[QUESTION])]

    labelled = [
        (event.type, event.executor_id, event.data)
        async for event in workflow.run(initial, stream=True)
        if event.type in ("intermediate", "output")
    ]
    assert labelled == [
        ("intermediate", "planner", f"plan: starting work on '{QUESTION}'"),
        ("intermediate", "researcher", f"research: gathering data for '{QUESTION}'"),
        ("output", "answerer", f"final answer to '{QUESTION}': 42"),
    ]
    result = await workflow.run(initial)
    assert result.get_outputs() == [f"final answer to '{QUESTION}': 42"]
    # port: the sample's workflow.as_agent() part is left out: it is AF's agent layer


async def test_intermediate_outputs_bubble_up_from_a_sub_workflow(default_store: str) -> None:
    from kernel import WorkflowBuilder, WorkflowContext, WorkflowExecutor, executor

    planner, researcher, answerer = planning_executors()
    inner = (
        WorkflowBuilder(
            start_executor=planner,
            output_from=[answerer],
            intermediate_output_from=[planner, researcher],
        )
        .add_edge(planner, researcher)
        .add_edge(researcher, answerer)
        .build()
    )
    sub = WorkflowExecutor(inner, id="sub")

    @executor(id="parent_sink")
    async def parent_sink(message: str, ctx: WorkflowContext[Never, str]) -> None:
        await ctx.yield_output(message)

    parent = (
        WorkflowBuilder(start_executor=sub, output_from=[parent_sink])
        .add_edge(sub, parent_sink)
        .build()
    )
    labelled = [
        (event.type, event.executor_id, event.data)
        async for event in parent.run([Message(role="user", contents=[QUESTION])], stream=True)
        if event.type in ("intermediate", "output")
    ]
    assert labelled == [
        ("intermediate", "sub", f"plan: starting work on '{QUESTION}'"),
        ("intermediate", "sub", f"research: gathering data for '{QUESTION}'"),
        ("output", "parent_sink", f"final answer to '{QUESTION}': 42"),
    ]


# -- parallelism/aggregate_results_of_different_types.py: fan-out, fan-in of mixed types -------


async def test_aggregate_results_of_different_types(default_store: str) -> None:
    from kernel import Executor, WorkflowBuilder, WorkflowContext, handler

    class Dispatcher(Executor):
        @handler
        async def handle(self, numbers: list[int], ctx: WorkflowContext[list[int]]):
            if not numbers:
                raise RuntimeError("Input must be a valid list of integers.")
            await ctx.send_message(numbers)

    class Average(Executor):
        @handler
        async def handle(self, numbers: list[int], ctx: WorkflowContext[float]):
            await ctx.send_message(sum(numbers) / len(numbers))

    class Sum(Executor):
        @handler
        async def handle(self, numbers: list[int], ctx: WorkflowContext[int]):
            await ctx.send_message(sum(numbers))

    class Aggregator(Executor):
        @handler
        async def handle(
            self, results: list[int | float], ctx: WorkflowContext[Never, list[int | float]]
        ):
            await ctx.yield_output(results)

    dispatcher = Dispatcher(id="dispatcher")
    average = Average(id="average")
    summation = Sum(id="summation")
    aggregator = Aggregator(id="aggregator")
    workflow = (
        WorkflowBuilder(start_executor=dispatcher)
        .add_fan_out_edges(dispatcher, [average, summation])
        .add_fan_in_edges([average, summation], aggregator)
        .build()
    )

    numbers = [random.randint(1, 100) for _ in range(10)]
    output: list[int | float] | None = None
    async for event in workflow.run(numbers, stream=True):
        if event.type == "output":
            output = event.data

    assert output is not None
    assert sorted(output) == sorted([sum(numbers) / 10, sum(numbers)])
    assert any(isinstance(v, float) for v in output)  # the average keeps its type through the log


# -- parallelism/map_reduce_and_visualization.py: word count over files, and the graph ---------

LONG_TEXT = """
the quick brown fox jumps over the lazy dog
a lazy afternoon for the dog and the fox

over and over the river runs
"""


def map_reduce_workflow(temp_dir: Path) -> Workflow:
    """The sample's graph: split -> 3 mappers -> shuffle -> 4 reducers -> completion."""
    import ast
    from collections import defaultdict

    from kernel import Executor, WorkflowBuilder, WorkflowContext, handler

    state_data_key = "data_to_be_processed"

    @dataclass
    class SplitCompleted:  # port: a dataclass (a plain class in the sample) to be storable
        """A marker telling each mapper to start."""

        ...

    class Split(Executor):
        def __init__(self, map_executor_ids: list[str], id: str | None = None):
            super().__init__(id=id or "split")
            self._map_executor_ids = map_executor_ids

        @handler
        async def split(self, data: str, ctx: WorkflowContext[SplitCompleted]) -> None:
            words = [w for line in data.splitlines() if line.strip() for w in line.split()]
            ctx.set_state(state_data_key, words)
            count = len(self._map_executor_ids)
            size = len(words) // count

            async def assign(i: int) -> None:
                start = i * size
                end = start + size if i < count - 1 else len(words)
                ctx.set_state(self._map_executor_ids[i], (start, end))
                await ctx.send_message(SplitCompleted(), self._map_executor_ids[i])

            await asyncio.gather(*(asyncio.create_task(assign(i)) for i in range(count)))

    @dataclass
    class MapCompleted:
        file_path: str

    class Map(Executor):
        @handler
        async def map(self, _: SplitCompleted, ctx: WorkflowContext[MapCompleted]) -> None:
            words: list[str] = ctx.get_state(state_data_key)
            start, end = ctx.get_state(self.id)
            file_path = temp_dir / f"map_results_{self.id}.txt"  # port: the sample's TEMP_DIR
            file_path.write_text("".join(f"{word}: 1\n" for word in words[start:end]))
            await ctx.send_message(MapCompleted(str(file_path)))

    @dataclass
    class ShuffleCompleted:
        file_path: str
        reducer_id: str

    class Shuffle(Executor):
        def __init__(self, reducer_ids: list[str], id: str | None = None):
            super().__init__(id=id or "shuffle")
            self._reducer_ids = reducer_ids

        @handler
        async def shuffle(
            self, data: list[MapCompleted], ctx: WorkflowContext[ShuffleCompleted]
        ) -> None:
            grouped: defaultdict[str, list[int]] = defaultdict(list)
            for result in data:
                for line in Path(result.file_path).read_text().splitlines():  # noqa: ASYNC240
                    word, one = line.split(": ")
                    grouped[word].append(int(one))
            pairs = sorted(grouped.items())
            count = len(self._reducer_ids)
            size, extra = divmod(len(pairs), count)
            chunks = [pairs[i : i + size] for i in range(0, len(pairs) - extra, size)]
            if extra:
                chunks[-1].extend(pairs[-extra:])

            async def write(chunk: list[tuple[str, list[int]]], index: int) -> None:
                file_path = temp_dir / f"shuffle_results_{index}.txt"  # port: TEMP_DIR
                file_path.write_text("".join(f"{key}: {values}\n" for key, values in chunk))
                await ctx.send_message(ShuffleCompleted(str(file_path), self._reducer_ids[index]))

            await asyncio.gather(*(asyncio.create_task(write(c, i)) for i, c in enumerate(chunks)))

    @dataclass
    class ReduceCompleted:
        file_path: str

    class Reduce(Executor):
        @handler
        async def _execute(
            self, data: ShuffleCompleted, ctx: WorkflowContext[ReduceCompleted]
        ) -> None:
            if data.reducer_id != self.id:
                return  # another reducer's partition
            totals: dict[str, int] = {}
            for line in Path(data.file_path).read_text().splitlines():  # noqa: ASYNC240
                key, values = line.split(": ")
                totals[key] = sum(ast.literal_eval(values))
            file_path = temp_dir / f"reduced_results_{self.id}.txt"  # port: TEMP_DIR
            file_path.write_text("".join(f"{key}: {n}\n" for key, n in totals.items()))
            await ctx.send_message(ReduceCompleted(str(file_path)))

    class CompletionExecutor(Executor):
        @handler
        async def complete(
            self, data: list[ReduceCompleted], ctx: WorkflowContext[Never, list[str]]
        ) -> None:
            await ctx.yield_output([result.file_path for result in data])

    mappers = [Map(id=f"map_executor_{i}") for i in range(3)]
    split = Split([m.id for m in mappers], id="split_data_executor")
    reducers = [Reduce(id=f"reduce_executor_{i}") for i in range(4)]
    shuffle = Shuffle([r.id for r in reducers], id="shuffle_executor")
    completion = CompletionExecutor(id="completion_executor")
    return (
        WorkflowBuilder(start_executor=split)
        .add_fan_out_edges(split, mappers)
        .add_fan_in_edges(mappers, shuffle)
        .add_fan_out_edges(shuffle, reducers)
        .add_fan_in_edges(reducers, completion)
        .build()
    )


async def test_map_reduce_counts_words(default_store: str, tmp_path: Path) -> None:
    workflow = map_reduce_workflow(tmp_path)
    outputs: list[list[str]] = []
    async for event in workflow.run(LONG_TEXT, stream=True):  # port: was resources/long_text.txt
        if event.type == "output":
            outputs.append(event.data)

    (files,) = outputs
    assert len(files) == 4  # one file per reducer
    assert read_counts(files) == Counter(LONG_TEXT.split())


def read_counts(files: list[str]) -> Counter[str]:
    """The word counts the reducers wrote."""
    counted: Counter[str] = Counter()
    for name in files:
        for line in Path(name).read_text().splitlines():
            word, n = line.split(": ")
            counted[word] += int(n)
    return counted


async def test_map_reduce_visualization(default_store: str, tmp_path: Path) -> None:
    from kernel import WorkflowViz

    workflow = map_reduce_workflow(tmp_path)
    viz = WorkflowViz(workflow)
    mermaid = viz.to_mermaid()
    digraph = viz.to_digraph()
    ids = ["split_data_executor", "shuffle_executor", "completion_executor"]
    ids += [f"map_executor_{i}" for i in range(3)] + [f"reduce_executor_{i}" for i in range(4)]
    for executor_id in ids:
        assert executor_id in mermaid
        assert executor_id in digraph
    assert "digraph" in digraph
    try:
        svg_file = viz.export(format="svg")
    except ImportError:  # the sample's own fallback: graphviz is optional
        return
    assert "<svg" in Path(svg_file).read_text()  # noqa: ASYNC240 - a test's check, after the run


# -- composition/sub_workflow_basics.py: a parent fans texts out to a sub-workflow -------------

TEXTS = [
    "Hello world! This is a simple test.",
    "Python is a powerful programming language used for many applications.",
    "Short text.",
    "This is a longer text with multiple sentences. It contains more words and characters. "
    "We use it to test our text processing workflow.",
    "",
    "   Spaces   around   text   ",
]


async def test_sub_workflow_basics(default_store: str) -> None:
    from kernel import Executor, WorkflowBuilder, WorkflowContext, WorkflowExecutor, handler

    @dataclass
    class TextProcessingRequest:
        text: str
        task_id: str

    @dataclass
    class TextProcessingResult:
        task_id: str
        text: str
        word_count: int
        char_count: int

    class TextProcessor(Executor):
        def __init__(self):
            super().__init__(id="text_processor")

        @handler
        async def process_text(
            self, request: TextProcessingRequest, ctx: WorkflowContext[Never, TextProcessingResult]
        ) -> None:
            words = len(request.text.split()) if request.text.strip() else 0
            await ctx.yield_output(
                TextProcessingResult(request.task_id, request.text, words, len(request.text))
            )

    class TextProcessingOrchestrator(Executor):
        results: list[TextProcessingResult] = []
        expected_count: int = 0

        def __init__(self):
            super().__init__(id="text_orchestrator")

        @handler
        async def start_processing(
            self, texts: list[str], ctx: WorkflowContext[TextProcessingRequest]
        ) -> None:
            self.expected_count = len(texts)
            for i, text in enumerate(texts):
                request = TextProcessingRequest(text=text, task_id=f"task_{i + 1}")
                await ctx.send_message(request, target_id="text_processor_workflow")

        @handler
        async def collect_result(
            self,
            result: TextProcessingResult,
            ctx: WorkflowContext[Never, list[TextProcessingResult]],
        ) -> None:
            self.results.append(result)
            if len(self.results) == self.expected_count:
                await ctx.yield_output(self.results)

    def create_sub_workflow() -> WorkflowExecutor:
        processing_workflow = WorkflowBuilder(start_executor=TextProcessor()).build()
        return WorkflowExecutor(processing_workflow, id="text_processor_workflow")

    orchestrator = TextProcessingOrchestrator()
    sub_workflow_executor = create_sub_workflow()
    main_workflow = (
        WorkflowBuilder(start_executor=orchestrator)
        .add_edge(orchestrator, sub_workflow_executor)
        .add_edge(sub_workflow_executor, orchestrator)
        .build()
    )
    result = await main_workflow.run(TEXTS)

    task_results = result.get_outputs()
    assert len(task_results) == 1
    ordered = sorted(task_results[0], key=lambda r: r.task_id)
    assert [r.task_id for r in ordered] == [f"task_{i}" for i in range(1, 7)]
    assert [r.word_count for r in ordered] == [7, 10, 2, 23, 0, 3]
    assert [r.char_count for r in ordered] == [len(t) for t in TEXTS]
    assert sum(r.word_count for r in ordered) == 45  # the sample's summary: total words
    assert sum(r.char_count for r in ordered) == 276  # and total characters


# -- composition/sub_workflow_parallel_requests.py: the parent answers a sub-workflow's requests


async def test_sub_workflow_parallel_requests(default_store: str) -> None:
    from kernel import (
        Executor,
        SubWorkflowRequestMessage,
        SubWorkflowResponseMessage,
        WorkflowBuilder,
        WorkflowContext,
        WorkflowEvent,
        WorkflowExecutor,
        handler,
        response_handler,
    )

    @dataclass
    class ComputingResourceRequest:
        request_type: Literal["resource", "policy"]
        resource_type: Literal["cpu", "memory", "disk", "gpu"]
        amount: int
        priority: Literal["low", "normal", "high"] | None = None
        policy_type: Literal["quota", "security"] | None = None

    @dataclass
    class ResourceResponse:
        resource_type: str
        allocated: int
        source: str

    @dataclass
    class PolicyResponse:
        approved: bool
        reason: str

    @dataclass
    class ResourceRequest:
        resource_type: Literal["cpu", "memory", "disk", "gpu"]
        amount: int
        priority: Literal["low", "normal", "high"]
        id: str = str(uuid.uuid4())  # one id for every request, as in the sample

    @dataclass
    class PolicyRequest:
        policy_type: Literal["quota", "security"]
        resource_type: Literal["cpu", "memory", "disk", "gpu"]
        amount: int
        id: str = str(uuid.uuid4())

    class RequestDistribution(Executor):
        @handler
        async def distribute_requests(
            self,
            requests: list[ComputingResourceRequest],
            ctx: WorkflowContext[ResourceRequest | PolicyRequest | int],
        ) -> None:
            for req in requests:
                if req.request_type == "resource":
                    assert req.priority is not None
                    await ctx.send_message(
                        ResourceRequest(req.resource_type, req.amount, req.priority)
                    )
                else:
                    assert req.policy_type is not None
                    await ctx.send_message(
                        PolicyRequest(req.policy_type, req.resource_type, req.amount)
                    )
            await ctx.send_message(len(requests))  # tells the collector how many to expect

    class ResourceRequester(Executor):
        @handler
        async def run(self, request: ResourceRequest, ctx: WorkflowContext) -> None:
            await ctx.request_info(request_data=request, response_type=ResourceResponse)

        @response_handler
        async def handle_response(
            self,
            original_request: ResourceRequest,
            response: ResourceResponse,
            ctx: WorkflowContext[ResourceResponse],
        ) -> None:
            await ctx.send_message(response)

    class PolicyChecker(Executor):
        @handler
        async def run(self, request: PolicyRequest, ctx: WorkflowContext) -> None:
            await ctx.request_info(request_data=request, response_type=PolicyResponse)

        @response_handler
        async def handle_response(
            self,
            original_request: PolicyRequest,
            response: PolicyResponse,
            ctx: WorkflowContext[PolicyResponse],
        ) -> None:
            await ctx.send_message(response)

    class ResultCollector(Executor):
        def __init__(self, id: str) -> None:
            super().__init__(id)
            self._request_count = 0
            self._responses: list[ResourceResponse | PolicyResponse] = []

        @handler
        async def set_request_count(self, count: int, ctx: WorkflowContext) -> None:
            self._request_count = count

        @handler
        async def collect(
            self, response: ResourceResponse | PolicyResponse, ctx: WorkflowContext[Never, str]
        ) -> None:
            self._responses.append(response)
            if len(self._responses) == self._request_count:
                await ctx.yield_output(f"All {self._request_count} requests processed.")

    def build_resource_request_distribution_workflow() -> Workflow:
        orchestrator = RequestDistribution("orchestrator")
        resource_requester = ResourceRequester("resource_requester")
        policy_checker = PolicyChecker("policy_checker")
        result_collector = ResultCollector("result_collector")
        return (
            WorkflowBuilder(start_executor=orchestrator)
            .add_edge(orchestrator, resource_requester)
            .add_edge(orchestrator, policy_checker)
            .add_edge(resource_requester, result_collector)
            .add_edge(policy_checker, result_collector)
            .add_edge(orchestrator, result_collector)
            .build()
        )

    class ResourceAllocator(Executor):
        def __init__(self, id: str) -> None:
            super().__init__(id)
            self._cache = {"cpu": 10, "memory": 50, "disk": 100}
            self._pending_requests: dict[str, WorkflowEvent[Any]] = {}

        @handler
        async def handle_subworkflow_request(
            self,
            request: SubWorkflowRequestMessage,
            ctx: WorkflowContext[SubWorkflowResponseMessage],
        ) -> None:
            source_event = request.source_event
            if not isinstance(source_event.data, ResourceRequest):
                return
            wanted: ResourceRequest = source_event.data
            if self._cache.get(wanted.resource_type, 0) >= wanted.amount:
                self._cache[wanted.resource_type] -= wanted.amount
                await ctx.send_message(
                    request.create_response(
                        ResourceResponse(wanted.resource_type, wanted.amount, "cache")
                    )
                )
            else:  # not in the cache: ask outside the workflow
                self._pending_requests[wanted.id] = source_event
                await ctx.request_info(request_data=wanted, response_type=ResourceResponse)

        @response_handler
        async def handle_external_response(
            self,
            original_request: ResourceRequest,
            response: ResourceResponse,
            ctx: WorkflowContext[SubWorkflowResponseMessage],
        ) -> None:
            source_event = self._pending_requests.pop(original_request.id)
            await ctx.send_message(
                SubWorkflowResponseMessage(data=response, source_event=source_event)
            )

    class PolicyEngine(Executor):
        def __init__(self, id: str) -> None:
            super().__init__(id)
            self._quota = {"cpu": 5, "memory": 20, "disk": 1000}
            self._pending_requests: dict[str, WorkflowEvent[Any]] = {}

        @handler
        async def handle_subworkflow_request(
            self,
            request: SubWorkflowRequestMessage,
            ctx: WorkflowContext[SubWorkflowResponseMessage],
        ) -> None:
            source_event = request.source_event
            if not isinstance(source_event.data, PolicyRequest):
                return
            check: PolicyRequest = source_event.data
            if check.policy_type == "quota":
                within = check.amount <= self._quota.get(check.resource_type, 0)
                verdict = PolicyResponse(
                    within, "Within quota limits" if within else "Exceeds quota limits"
                )
                await ctx.send_message(request.create_response(verdict))
            else:  # another kind of policy: ask outside the workflow
                self._pending_requests[check.id] = source_event
                await ctx.request_info(request_data=check, response_type=PolicyResponse)

        @response_handler
        async def handle_external_response(
            self,
            original_request: PolicyRequest,
            response: PolicyResponse,
            ctx: WorkflowContext[SubWorkflowResponseMessage],
        ) -> None:
            source_event = self._pending_requests.pop(original_request.id)
            await ctx.send_message(
                SubWorkflowResponseMessage(data=response, source_event=source_event)
            )

    resource_allocator = ResourceAllocator("resource_allocator")
    policy_engine = PolicyEngine("policy_engine")
    sub_workflow_executor = WorkflowExecutor(
        build_resource_request_distribution_workflow(),
        "sub_workflow_executor",
        allow_direct_output=True,
    )
    main_workflow = (
        WorkflowBuilder(start_executor=sub_workflow_executor)
        .add_edge(sub_workflow_executor, resource_allocator)
        .add_edge(resource_allocator, sub_workflow_executor)
        .add_edge(sub_workflow_executor, policy_engine)
        .add_edge(policy_engine, sub_workflow_executor)
        .build()
    )
    test_requests = [
        ComputingResourceRequest("resource", "cpu", 2, priority="normal"),  # from the cache
        ComputingResourceRequest("policy", "cpu", 3, policy_type="quota"),  # within quota
        ComputingResourceRequest("resource", "memory", 15, priority="normal"),  # from the cache
        ComputingResourceRequest("policy", "memory", 100, policy_type="quota"),  # over quota
        ComputingResourceRequest("resource", "gpu", 1, priority="high"),  # external
        ComputingResourceRequest("policy", "disk", 500, policy_type="quota"),  # within quota
        ComputingResourceRequest("policy", "cpu", 1, policy_type="security"),  # external
    ]
    run_result = await main_workflow.run(test_requests)

    request_info_events = run_result.get_request_info_events()
    assert sorted(type(e.data).__name__ for e in request_info_events) == [
        "PolicyRequest",
        "ResourceRequest",
    ]
    responses: dict[str, ResourceResponse | PolicyResponse] = {}
    for event in request_info_events:
        assert event.request_id is not None
        if isinstance(event.data, ResourceRequest):
            responses[event.request_id] = ResourceResponse(
                event.data.resource_type, event.data.amount, "external_provider"
            )
        else:
            responses[event.request_id] = PolicyResponse(True, "External system approved")
    run_result = await main_workflow.run(responses=responses)

    assert run_result.get_outputs() == ["All 7 requests processed."]


# -- composition/sub_workflow_request_interception.py: the parent answers a domain check -------


async def test_sub_workflow_request_interception(default_store: str) -> None:
    from kernel import (
        Executor,
        SubWorkflowRequestMessage,
        SubWorkflowResponseMessage,
        WorkflowBuilder,
        WorkflowContext,
        WorkflowExecutor,
        handler,
        response_handler,
    )

    @dataclass
    class SanitizedEmailResult:
        original: str
        sanitized: str
        is_valid: bool

    def build_email_address_validation_workflow() -> Workflow:
        class EmailSanitizer(Executor):
            @handler
            async def handle(
                self, email_address: str, ctx: WorkflowContext[SanitizedEmailResult]
            ) -> None:
                await ctx.send_message(
                    SanitizedEmailResult(email_address, email_address.strip(), False)
                )

        class EmailFormatValidator(Executor):
            @handler
            async def handle(
                self,
                partial_result: SanitizedEmailResult,
                ctx: WorkflowContext[SanitizedEmailResult, SanitizedEmailResult],
            ) -> None:
                address = partial_result.sanitized
                if "@" not in address or "." not in address.split("@")[-1]:
                    await ctx.yield_output(
                        SanitizedEmailResult(partial_result.original, address, False)
                    )
                    return
                await ctx.send_message(
                    SanitizedEmailResult(partial_result.original, address, False)
                )

        class DomainValidator(Executor):
            def __init__(self, id: str):
                super().__init__(id=id)
                self._pending_domains: dict[str, SanitizedEmailResult] = {}

            @handler
            async def handle(
                self, partial_result: SanitizedEmailResult, ctx: WorkflowContext
            ) -> None:
                domain = partial_result.sanitized.split("@")[-1]
                self._pending_domains[domain] = partial_result
                await ctx.request_info(request_data=domain, response_type=bool)

            @response_handler
            async def handle_domain_validation_response(
                self,
                original_request: str,
                is_valid: bool,
                ctx: WorkflowContext[Never, SanitizedEmailResult],
            ) -> None:
                partial = self._pending_domains.pop(original_request)
                await ctx.yield_output(
                    SanitizedEmailResult(partial.original, partial.sanitized, is_valid)
                )

        email_sanitizer = EmailSanitizer(id="email_sanitizer")
        email_format_validator = EmailFormatValidator(id="email_format_validator")
        domain_validator = DomainValidator(id="domain_validator")
        return (
            WorkflowBuilder(start_executor=email_sanitizer)
            .add_edge(email_sanitizer, email_format_validator)
            .add_edge(email_format_validator, domain_validator)
            .build()
        )

    @dataclass
    class Email:
        recipient: str
        subject: str
        body: str

    class SmartEmailOrchestrator(Executor):
        def __init__(self, id: str, approved_domains: set[str]):
            super().__init__(id=id)
            self._approved_domains = approved_domains
            self._approved_recipients: set[str] = set()
            self._disapproved_recipients: set[str] = set()
            self._pending_emails: dict[str, Email] = {}

        @handler
        async def run(self, email: Email, ctx: WorkflowContext[Email | str, bool]) -> None:
            if email.recipient in self._approved_recipients:
                await ctx.send_message(email)
                return
            if email.recipient in self._disapproved_recipients:
                await ctx.yield_output(False)
                return
            self._pending_emails[email.recipient] = email
            await ctx.send_message(email.recipient)

        @handler
        async def handler_domain_validation_request(
            self,
            request: SubWorkflowRequestMessage,
            ctx: WorkflowContext[SubWorkflowResponseMessage],
        ) -> None:
            domain = request.source_event.data
            assert isinstance(domain, str)
            await ctx.send_message(
                request.create_response(domain in self._approved_domains),
                target_id=request.executor_id,
            )

        @handler
        async def handle_validation_result(
            self, result: SanitizedEmailResult, ctx: WorkflowContext[Email, bool]
        ) -> None:
            email = self._pending_emails.pop(result.original)
            email.recipient = result.sanitized
            if result.is_valid:
                self._approved_recipients.add(result.original)
                await ctx.send_message(email)
            else:
                self._disapproved_recipients.add(result.original)
                await ctx.yield_output(False)

    class EmailDelivery(Executor):
        @handler
        async def handle(self, email: Email, ctx: WorkflowContext[Never, bool]) -> None:
            await asyncio.sleep(0)  # port: was sleep(1), the sample's network delay
            await ctx.yield_output(True)

    smart_email_orchestrator = SmartEmailOrchestrator(
        id="smart_email_orchestrator", approved_domains={"example.com", "company.com"}
    )
    email_delivery = EmailDelivery(id="email_delivery")
    email_validation_workflow = WorkflowExecutor(
        build_email_address_validation_workflow(), id="email_validation_workflow"
    )
    workflow = (
        WorkflowBuilder(start_executor=smart_email_orchestrator)
        .add_edge(smart_email_orchestrator, email_validation_workflow)
        .add_edge(email_validation_workflow, smart_email_orchestrator)
        .add_edge(smart_email_orchestrator, email_delivery)
        .build()
    )
    test_emails = [
        Email("user1@example.com", "Hello User1", "This is a test email."),
        Email(" user2@invalid", "Hello User2", "This is a test email."),
        Email("  user3@company.com  ", "Hello User3", "This is a test email."),
        Email("user4@unknown.com", "Hello User4", "This is a test email."),
        Email("user1@example.com", "Hello User1", "This is a test email."),  # approved before
        Email(" user2@invalid", "Hello User2", "This is a test email."),  # refused before
    ]
    verdicts: list[str] = []
    for email in test_emails:
        async for event in workflow.run(email, stream=True):
            if event.type == "output":
                verdicts.append("Delivered" if event.data else "Blocked")

    assert verdicts == ["Delivered", "Blocked", "Delivered", "Blocked", "Delivered", "Blocked"]


# -- observability/executor_io_observation.py: what each executor took and sent ----------------


async def test_executor_io_observation(default_store: str) -> None:
    from kernel import Executor, WorkflowBuilder, WorkflowContext, handler

    class UpperCaseExecutor(Executor):
        def __init__(self, id: str = "upper_case"):
            super().__init__(id=id)

        @handler
        async def handle(self, text: str, ctx: WorkflowContext[str]) -> None:
            await ctx.send_message(text.upper())

    class ReverseTextExecutor(Executor):
        def __init__(self, id: str = "reverse_text"):
            super().__init__(id=id)

        @handler
        async def handle(self, text: str, ctx: WorkflowContext[Never, str]) -> None:
            await ctx.yield_output(text[::-1])

    upper_case = UpperCaseExecutor()
    reverse_text = ReverseTextExecutor()
    workflow = WorkflowBuilder(start_executor=upper_case).add_edge(upper_case, reverse_text).build()

    observed: list[tuple[str, str | None, Any]] = []
    async for event in workflow.run("hello world", stream=True):
        if event.type in ("executor_invoked", "executor_completed", "output"):
            observed.append((event.type, event.executor_id, event.data))

    # port: AF hands the output over while reverse_text runs, before its executor_completed,
    # and lists it in that event's data too; steplog hands it over once the superstep commits,
    # so the output comes last and executor_completed lists only the messages sent
    assert observed == [
        ("executor_invoked", "upper_case", "hello world"),
        ("executor_completed", "upper_case", ["HELLO WORLD"]),
        ("executor_invoked", "reverse_text", "HELLO WORLD"),
        ("executor_completed", "reverse_text", None),
        ("output", "reverse_text", "DLROW OLLEH"),
    ]
