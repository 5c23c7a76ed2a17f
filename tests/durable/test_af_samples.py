"""Agent Framework's checkpoint and human-in-the-loop samples (their pure-workflow parts), ported.

Each test re-tells one AF 1.23 sample in its own words, importing from ``kernel`` instead of
``agent_framework``. Model calls are replaced by plain executors and the human by a script. Every
line that had to change beyond the import is marked ``# port:``; docs/porting.md ("Checkpoints
and human input") lists each difference and why. The assertions are what the sample promises: an
interrupted or failed run, resumed, ends with the result an uninterrupted run gives, and a human
answer given later (in a new ``Workflow`` object, as another process would) carries the run on.

Each test runs on every backend (``store_url``: memory, SQLite, PostgreSQL).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Never

import pytest

from kernel import (  # port: was `from agent_framework import ...`
    Checkpoint,
    EventStore,
    Executor,
    ResumeError,
    SubWorkflowRequestMessage,
    SubWorkflowResponseMessage,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowEvent,
    WorkflowExecutor,
    handler,
    open_store,
    response_handler,
)
from tests.durable.helpers import reopen


def run_types(wf: Workflow) -> list[str]:
    """The run-level events of the instance's log, in order (starts and ends)."""
    return [e.type for e in wf.events() if e.type.startswith("run_")]


# -- checkpoint_with_resume: factor pairs, interrupted after some supersteps ---------------------


@dataclass
class ComputeTask:
    """The numbers still to factor."""

    remaining_numbers: list[int]


Pairs = dict[int, list[tuple[int, int]]]


class FactorStart(Executor):
    @handler
    async def start(self, upper_limit: int, ctx: WorkflowContext[ComputeTask]) -> None:
        await ctx.send_message(ComputeTask(list(range(1, upper_limit + 1))))


class FactorWorker(Executor):
    """Factors one number per superstep and loops to itself until none is left.

    AF's worker kept the pairs in an attribute saved by ``on_checkpoint_save``; steplog never
    calls that hook, so they live in workflow state, which every checkpoint carries.
    """

    @handler
    async def compute(self, task: ComputeTask, ctx: WorkflowContext[ComputeTask, Pairs]) -> None:
        number = task.remaining_numbers.pop(0)
        pairs: Pairs = dict(ctx.get_state("pairs", {}))  # port: was self._composite_number_pairs
        pairs[number] = [(i, number // i) for i in range(1, number) if number % i == 0]
        ctx.set_state("pairs", pairs)  # port: replaces on_checkpoint_save/on_checkpoint_restore
        if task.remaining_numbers:
            await ctx.send_message(task)
        else:
            await ctx.yield_output(pairs)


def factor_workflow(store: EventStore) -> Workflow:
    """A fresh graph each call, as AF's executor factories gave one per ``build()``."""
    start, worker = FactorStart("start"), FactorWorker("worker")
    return (
        WorkflowBuilder(
            start_executor=start,
            store=store,  # port: was checkpoint_storage=InMemoryCheckpointStorage()
            instance_id="factors",  # port: checkpoints belong to an instance, not a builder
        )
        .add_edge(start, worker)
        .add_edge(worker, worker)
        .build()
    )


def expected_pairs(limit: int) -> Pairs:
    return {n: [(i, n // i) for i in range(1, n) if n % i == 0] for n in range(1, limit + 1)}


async def test_checkpoint_with_resume_survives_interruptions_after_any_superstep(
    store_url: str,
) -> None:
    store = open_store(store_url)
    interrupt_after = iter([2, 5, 6])  # the sample's random() < 0.5, scripted
    stop_at = next(interrupt_after)
    latest: Checkpoint | None = None
    output: Pairs | None = None
    rounds = 0
    while True:
        rounds += 1
        workflow = factor_workflow(reopen(store_url, store))
        event_stream = (
            workflow.run(10, stream=True)
            if latest is None
            else workflow.run(checkpoint_id=latest.checkpoint_id, stream=True)
        )
        async for event in event_stream:
            if event.type == "output":
                output = event.data
                break
            if event.type == "superstep_completed" and event.superstep == stop_at:
                stop_at = next(interrupt_after, 0)
                break  # the interruption: the stream is let go mid-run, as in AF
        all_checkpoints = workflow.checkpoints()  # port: was await storage.list_checkpoints()
        assert all_checkpoints, "no checkpoint to resume from"
        latest = all_checkpoints[-1]
        if output is not None:
            break
        # the broken-off run is still open in the log (AF has no such status): the next run
        # closes it as abandoned once the stream is dropped (rebinding ``event_stream`` does it)
        assert latest.status == "running"
    assert rounds == 4
    assert output == expected_pairs(10)
    assert latest.iteration_count == 11  # the start, then one superstep per number
    assert latest.status == "completed"
    assert workflow.committed_state() == {"pairs": expected_pairs(10)}
    # each interrupted run is closed before the run that continues it appends anything
    assert run_types(workflow) == ["run_started", "run_abandoned"] * 3 + [
        "run_started",
        "run_completed",
    ]


async def test_a_dropped_stream_does_not_block_the_next_workflow_object(store_url: str) -> None:
    """A stream broken off and dropped (no ``aclose()``) gives its instance up: a run of another
    ``Workflow`` object on the same instance closes it as abandoned and continues, rather than
    finding its lease held (``RunInProgressError``)."""
    store = open_store(store_url)
    event_stream = factor_workflow(store).run(4, stream=True)
    async for event in event_stream:
        if event.type == "superstep_completed" and event.superstep == 2:
            break
    del event_stream  # dropped without aclose(), as the sample does
    workflow = factor_workflow(store)
    latest = workflow.checkpoints()[-1]
    result = await workflow.run(checkpoint_id=latest.checkpoint_id)
    assert result.get_outputs() == [expected_pairs(4)]
    assert run_types(workflow) == ["run_started", "run_abandoned", "run_started", "run_completed"]


# -- checkpoint_with_resume_from_failure: workers that stop short, retried from a checkpoint -----


class SampleLister(Executor):
    """AF's start executor listed sample files on disk; here the list is the input."""

    @handler
    async def start(self, sample_files: list[str], ctx: WorkflowContext[list[str]]) -> None:
        ctx.set_state("expected_files", sample_files)  # port: was await ctx.set_shared_state(...)
        await ctx.send_message(sample_files)


class Distributor(Executor):
    def __init__(self, id: str, worker_ids: list[str]) -> None:
        super().__init__(id)
        self._worker_ids = worker_ids

    @handler
    async def distribute(self, sample_files: list[str], ctx: WorkflowContext[list[str]]) -> None:
        shares: list[list[str]] = [[] for _ in self._worker_ids]
        for index, name in enumerate(sample_files):
            shares[index % len(self._worker_ids)].append(name)
        for worker_id, share in zip(self._worker_ids, shares, strict=True):
            await ctx.send_message(share, target_id=worker_id)


class SampleWorker(Executor):
    """Runs its share of samples; ``flaky`` (outside the workflow, like AF's ``random()``) says
    whether it stops short this time, sending only what it processed."""

    def __init__(self, id: str, flaky: Callable[[str, str], bool]) -> None:
        super().__init__(id)
        self._flaky = flaky

    @handler
    async def run_samples(self, sample_files: list[str], ctx: WorkflowContext[list[str]]) -> None:
        key = f"processed:{self.id}"  # port: was self._processed_files (on_checkpoint_save)
        processed: list[str] = list(ctx.get_state(key, []))
        for name in sample_files:
            if name in processed:
                continue
            if self._flaky(self.id, name):
                break
            processed.append(name)
        ctx.set_state(key, processed)
        await ctx.send_message(processed)


class SampleCollector(Executor):
    @handler
    async def collect(self, worker_results: list[str], ctx: WorkflowContext[Never, str]) -> None:
        expected: list[str] = ctx.get_state("expected_files")  # port: was get_shared_state
        collected: list[str] = list(ctx.get_state("collected", []))  # port: was self attribute
        for name in worker_results:
            if name not in expected:
                raise ValueError(f"unexpected result {name!r}")
            if name in collected:
                raise ValueError(f"duplicate result {name!r}")
        collected.extend(worker_results)
        ctx.set_state("collected", collected)
        if len(collected) == len(expected):
            await ctx.yield_output("All samples processed successfully.")


def samples_workflow(
    store: EventStore, flaky: Callable[[str, str], bool], instance_id: str = "samples"
) -> Workflow:
    workers = [SampleWorker(f"worker_{i}", flaky) for i in range(3)]
    start = SampleLister("start")
    distributor = Distributor("distributor", [w.id for w in workers])
    collector = SampleCollector("collector")
    builder = WorkflowBuilder(start_executor=start, store=store, instance_id=instance_id)  # port
    builder.add_edge(start, distributor)
    for worker in workers:
        builder.add_edge(distributor, worker)
        builder.add_edge(worker, collector)
    return builder.build()


async def test_checkpoint_with_resume_from_failure_retries_from_the_second_checkpoint(
    store_url: str,
) -> None:
    store = open_store(store_url)
    files = [f"sample_{n}.py" for n in range(7)]
    failing = {("worker_1", "sample_4.py")}  # fails on the first attempt only

    def flaky(worker_id: str, name: str) -> bool:
        if (worker_id, name) in failing:
            failing.discard((worker_id, name))
            return True
        return False

    workflow = samples_workflow(store, flaky)
    event_stream = workflow.run(files, stream=True)
    outputs: list[str] = []
    attempts = 0
    while True:
        attempts += 1
        async for event in event_stream:
            if event.type == "output":
                outputs.append(event.data)
                break
        if outputs:
            break
        all_checkpoints = workflow.checkpoints()
        second = all_checkpoints[1]  # right after the distributor ran
        # port: AF restores any checkpoint in place; steplog continues only the latest one, and
        # refuses an older one (appending nothing), pointing to fork
        with pytest.raises(ResumeError, match=r"not the latest.*[Ff]ork"):
            await workflow.run(checkpoint_id=second.checkpoint_id)
        retry = workflow.fork(at=second.checkpoint_id, instance_id=f"samples-retry-{attempts}")
        event_stream = retry.resume(stream=True)  # port: was run_stream(checkpoint_id=...)
        workflow = retry
    assert attempts == 2
    assert outputs == ["All samples processed successfully."]
    assert sorted(workflow.committed_state()["collected"]) == files
    # the first attempt's instance still tells what happened: it completed without the output
    first = samples_workflow(store, flaky)
    assert first.checkpoints()[-1].status == "completed"
    assert "sample_4.py" not in first.committed_state()["collected"]


# -- guessing_game_with_human_input: the agent replaced by a bisecting guesser -------------------


@dataclass
class HumanFeedbackRequest:
    prompt: str


@dataclass
class GuessRequest:
    """What AF sent the agent (an ``AgentExecutorRequest``): here, just the human's feedback."""

    feedback: str | None = None


@dataclass
class GuessReply:
    """What AF's agent answered (an ``AgentExecutorResponse`` holding ``{"guess": n}``)."""

    guess: int


class Guesser(Executor):
    """Stands in for the model: bisects 1..10, keeping its bounds in workflow state."""

    @handler
    async def guess(self, request: GuessRequest, ctx: WorkflowContext[GuessReply]) -> None:
        low, high = ctx.get_state("bounds", (1, 10))
        last = ctx.get_state("last_guess")
        if request.feedback == "higher":
            low = last + 1
        elif request.feedback == "lower":
            high = last - 1
        guess = (low + high) // 2
        ctx.set_state("bounds", (low, high))
        ctx.set_state("last_guess", guess)
        await ctx.send_message(GuessReply(guess))


class TurnManager(Executor):
    def __init__(self, id: str | None = None) -> None:
        super().__init__(id or "turn_manager")

    @handler
    async def start(self, _: str, ctx: WorkflowContext[GuessRequest]) -> None:
        await ctx.send_message(GuessRequest())

    @handler
    async def on_agent_response(self, result: GuessReply, ctx: WorkflowContext) -> None:
        prompt = f"The agent guessed: {result.guess}. Type higher, lower, correct, or exit."
        await ctx.request_info(request_data=HumanFeedbackRequest(prompt), response_type=str)

    @response_handler
    async def on_human_feedback(
        self,
        original_request: HumanFeedbackRequest,
        feedback: str,
        ctx: WorkflowContext[GuessRequest, str],
    ) -> None:
        reply = feedback.strip().lower()
        if reply == "correct":
            await ctx.yield_output("Guessed correctly!")
            return
        await ctx.send_message(GuessRequest(reply))


def scripted_human(secret: int, asked: list[int]) -> Callable[[HumanFeedbackRequest], str]:
    """Answers like the sample's person at the keyboard, who thought of ``secret``."""

    def answer(request: HumanFeedbackRequest) -> str:
        guess = int(request.prompt.split(": ")[1].split(".")[0])
        asked.append(guess)
        return "correct" if guess == secret else ("higher" if secret > guess else "lower")

    return answer


async def process_event_stream(
    stream: AsyncIterable[WorkflowEvent],
    human: Callable[[HumanFeedbackRequest], str],
    outputs: list[str],
    ends: list[str],
) -> dict[str, str] | None:
    """The sample's loop body: collect request_info events, then ask the human about each."""
    requests: list[tuple[str, HumanFeedbackRequest]] = []
    async for event in stream:
        if event.type == "request_info" and isinstance(event.data, HumanFeedbackRequest):
            assert event.request_id is not None
            requests.append((event.request_id, event.data))
        elif event.type == "output":
            outputs.append(event.data)
        elif event.type in ("completed", "awaiting_input"):  # port: AF ends with "status" events
            ends.append(event.type)
    if requests:
        return {request_id: human(request) for request_id, request in requests}
    return None


@pytest.mark.parametrize(("secret", "expected_guesses"), [(7, [5, 8, 6, 7]), (1, [5, 2, 1])])
async def test_guessing_game_with_a_scripted_human(
    store_url: str, secret: int, expected_guesses: list[int]
) -> None:
    store = open_store(store_url)

    def build(on: EventStore) -> Workflow:
        turn_manager, guesser = TurnManager(id="turn_manager"), Guesser("guesser")
        return (
            WorkflowBuilder(start_executor=turn_manager, store=on, instance_id="game")  # port
            .add_edge(turn_manager, guesser)
            .add_edge(guesser, turn_manager)
            .build()
        )

    asked: list[int] = []
    outputs: list[str] = []
    ends: list[str] = []
    human = scripted_human(secret, asked)
    workflow = build(store)
    pending = await process_event_stream(workflow.run("start", stream=True), human, outputs, ends)
    while pending is not None:
        # each answer in a new Workflow object, as if the person came back in another process
        workflow = build(reopen(store_url, store))
        stream = workflow.run(stream=True, responses=pending)
        pending = await process_event_stream(stream, human, outputs, ends)
    assert asked == expected_guesses
    assert outputs == ["Guessed correctly!"]
    assert ends == ["awaiting_input"] * len(expected_guesses) + ["completed"]
    assert workflow.pending_requests() == []
    assert workflow.committed_state()["last_guess"] == secret


# -- checkpoint_with_human_in_the_loop: the writer agent replaced by a plain executor ------------


@dataclass
class WriterRequest:
    """Stands in for ``AgentExecutorRequest``: the prompt for the copywriter."""

    prompt: str


@dataclass
class WriterResponse:
    """Stands in for ``AgentExecutorResponse``: the draft."""

    text: str


@dataclass
class HumanApprovalRequest:
    prompt: str = ""
    draft: str = ""
    iteration: int = 0


class BriefPreparer(Executor):
    def __init__(self, id: str, agent_id: str) -> None:
        super().__init__(id)
        self._agent_id = agent_id

    @handler
    async def prepare(self, brief: str, ctx: WorkflowContext[WriterRequest, str]) -> None:
        normalized = " ".join(brief.split()).strip()
        if not normalized.endswith("."):
            normalized += "."
        ctx.set_state("brief", normalized)
        await ctx.send_message(WriterRequest(f"BRIEF: {normalized}"), target_id=self._agent_id)


class Writer(Executor):
    """Stands in for the ``AgentExecutor``: drafts deterministically from the prompt."""

    @handler
    async def write(self, request: WriterRequest, ctx: WorkflowContext[WriterResponse]) -> None:
        drafts = ctx.get_state("drafts", 0) + 1
        ctx.set_state("drafts", drafts)
        guidance = request.prompt.rsplit("Human guidance: ", 1)
        extra = f" ({guidance[1]})" if len(guidance) == 2 else ""
        await ctx.send_message(WriterResponse(f"Draft {drafts}{extra}"))


class ReviewGateway(Executor):
    def __init__(self, id: str, writer_id: str) -> None:
        super().__init__(id)
        self._writer_id = writer_id

    @handler
    async def on_agent_response(self, response: WriterResponse, ctx: WorkflowContext) -> None:
        iteration = ctx.get_state("iteration", 0) + 1  # port: was self._iteration += 1
        ctx.set_state("iteration", iteration)  # port: replaces on_checkpoint_save/restore
        await ctx.request_info(
            request_data=HumanApprovalRequest(
                prompt="Review the draft. Reply 'approve' or provide edit instructions.",
                draft=response.text,
                iteration=iteration,
            ),
            response_type=str,
        )

    @response_handler
    async def on_human_feedback(
        self,
        original_request: HumanApprovalRequest,
        feedback: str,
        ctx: WorkflowContext[WriterRequest | str, str],
    ) -> None:
        reply = feedback.strip()
        if len(reply) == 0 or reply.lower() == "approve":
            await ctx.yield_output(original_request.draft)
            return
        prompt = f"Previous draft: {original_request.draft}\nHuman guidance: {reply}"
        await ctx.send_message(WriterRequest(prompt), target_id=self._writer_id)


def create_workflow(store: EventStore) -> Workflow:
    writer = Writer("writer")
    review_gateway = ReviewGateway(id="review_gateway", writer_id="writer")
    prepare_brief = BriefPreparer(id="prepare_brief", agent_id="writer")
    return (
        WorkflowBuilder(
            # port: was max_iterations=6, which the revision round below (7 supersteps: both
            # frameworks count them across responses) would exceed; AF stops it too
            max_supersteps=8,
            start_executor=prepare_brief,
            store=store,  # port: was checkpoint_storage=FileCheckpointStorage(TEMP_DIR)
            instance_id="release-notes",  # port: checkpoints belong to an instance
        )
        .add_edge(prepare_brief, writer)
        .add_edge(writer, review_gateway)
        .add_edge(review_gateway, writer)
        .build()
    )


async def run_interactive_session(
    workflow: Workflow,
    reviewer: Iterator[str],
    *,
    initial_message: str | None = None,
    checkpoint_id: str | None = None,
) -> str | None:
    """The sample's session loop; ``reviewer`` yields the human's replies ("exit" to stop)."""
    requests: dict[str, HumanApprovalRequest] = {}
    responses: dict[str, str] | None = None
    completed_output: str | None = None
    while True:
        if responses:
            event_stream = workflow.run(stream=True, responses=responses)
            requests.clear()
            responses = None
        elif initial_message:
            event_stream = workflow.run(initial_message, stream=True)
            initial_message = None
        elif checkpoint_id:
            # port: AF restores the checkpoint and emits its pending request_info events again;
            # steplog has nothing to run there (it refuses, appending nothing) and lists them
            with pytest.raises(ResumeError, match="waiting for responses"):
                await workflow.run(checkpoint_id=checkpoint_id)
            requests = {r.request_id: r.data for r in workflow.pending_requests()}
            checkpoint_id = None
            event_stream = None
        else:
            raise ValueError("Either initial_message or checkpoint_id must be provided")
        if event_stream is not None:
            async for event in event_stream:
                if event.type == "output":
                    completed_output = event.data
                if event.type == "request_info":
                    assert isinstance(event.data, HumanApprovalRequest)
                    assert event.request_id is not None
                    requests[event.request_id] = event.data
        if completed_output:
            return completed_output
        if not requests:
            raise RuntimeError("Workflow stopped without completing or requesting input")
        reply = next(reviewer)
        if reply == "exit":
            return None  # the human goes offline; the request waits in the log
        responses = {request_id: reply for request_id in requests}


async def test_checkpoint_with_human_in_the_loop_resumes_in_a_later_process(
    store_url: str,
) -> None:
    store = open_store(store_url)
    brief = "Introduce our   limited edition grinder,  $249"
    workflow = create_workflow(store)
    assert await run_interactive_session(workflow, iter(["exit"]), initial_message=brief) is None

    # later: pick the checkpoint that waits for a human (AF: get_checkpoint_summary's status)
    new_workflow = create_workflow(reopen(store_url, store))
    sorted_cps = new_workflow.checkpoints()  # port: was await storage.list_checkpoints(...)
    assert [cp.iteration_count for cp in sorted_cps] == [1, 2, 3]
    (chosen,) = [cp for cp in sorted_cps if cp.status == "awaiting_input"]  # port: summary
    (waiting,) = new_workflow.pending_requests()
    assert waiting.data == HumanApprovalRequest(
        "Review the draft. Reply 'approve' or provide edit instructions.", "Draft 1", 1
    )
    result = await run_interactive_session(
        new_workflow, iter(["make it shorter", "approve"]), checkpoint_id=chosen.checkpoint_id
    )
    assert result == "Draft 2 (make it shorter)"
    assert new_workflow.committed_state() == {
        "brief": "Introduce our limited edition grinder, $249.",
        "drafts": 2,
        "iteration": 2,
    }
    # superstep indexes run on across the responses (3 + 3 + 1), as AF's iteration count does
    assert new_workflow.checkpoints()[-1].iteration_count == 7
    assert run_types(new_workflow) == [
        "run_started",
        "run_awaiting_input",
        "run_started",
        "run_awaiting_input",
        "run_started",
        "run_completed",
    ]


# -- checkpoint_hydrate_with_input (a newer AF tree): a new turn on restored state --------------


class HistoryExecutor(Executor):
    @handler
    async def accumulate(self, text: str, ctx: WorkflowContext[Any, list[str]]) -> None:
        history = [*ctx.get_state("history", []), text]  # port: was self._history (+ hooks)
        ctx.set_state("history", history)
        await ctx.yield_output(history)


async def test_checkpoint_hydrate_with_input_is_a_new_run_on_the_same_instance(
    store_url: str,
) -> None:
    store = open_store(store_url)

    def build(on: EventStore) -> Workflow:
        return WorkflowBuilder(
            name="hydrate-with-input-sample",
            start_executor=HistoryExecutor("history"),
            store=on,  # port: was checkpoint_storage=storage
            instance_id="chat",  # port: the instance holds the restored state
        ).build()

    first = await build(store).run("hello")
    assert first.get_outputs() == [["hello"]]
    resumed = build(reopen(store_url, store))
    latest = resumed.checkpoints()[-1]
    # port: AF (after 1.23) takes run(message, checkpoint_id=...); steplog refuses the pair,
    # appending nothing, because a new run of the instance already starts from its latest state
    with pytest.raises(ResumeError, match="not both"):
        await resumed.run("again", checkpoint_id=latest.checkpoint_id)
    second = await resumed.run("again")
    assert second.get_outputs() == [["hello", "again"]]
    streamed = build(reopen(store_url, store))
    seen = [e.data async for e in streamed.run("once more", stream=True) if e.type == "output"]
    assert seen == [["hello", "again", "once more"]]
    assert run_types(streamed) == ["run_started", "run_completed"] * 3


# -- sub_workflow_checkpoint: a parent whose sub-workflow waits for a human review ---------------


LAUNCH_TIME = datetime(2025, 9, 25, 14, 29, 34)  # port: the sample reads datetime.now()


@dataclass
class DraftTask:
    topic: str
    due: datetime
    iteration: int = 1


@dataclass
class DraftPackage:
    topic: str
    content: str
    iteration: int
    created_at: datetime = LAUNCH_TIME  # port: a default_factory of datetime.now in the sample


@dataclass
class FinalDraft:
    topic: str
    content: str
    iterations: int
    approved_at: datetime


@dataclass
class ReviewRequest:
    id: str = ""  # port: the sample's default is one uuid4 shared by every instance
    topic: str = ""
    iteration: int = 1
    draft_excerpt: str = ""
    due_iso: str = ""
    reviewer_guidance: list[str] = field(default_factory=list)


@dataclass
class ReviewDecision:
    decision: str
    original_request: ReviewRequest


class DraftWriter(Executor):
    def __init__(self) -> None:
        super().__init__(id="draft_writer")

    @handler
    async def create_draft(self, task: DraftTask, ctx: WorkflowContext[DraftPackage]) -> None:
        content = (
            f"Launch plan for {task.topic}.\n\n- Outline the customer message.\n"
            f"- Highlight three differentiators.\n- Close with a next-step CTA.\n"
            f"(iteration {task.iteration})"
        )
        await ctx.send_message(DraftPackage(task.topic, content, task.iteration), "draft_review")


class DraftReviewRouter(Executor):
    def __init__(self) -> None:
        super().__init__(id="draft_review")

    @handler
    async def request_review(self, draft: DraftPackage, ctx: WorkflowContext) -> None:
        request = ReviewRequest(
            id=f"review-{draft.iteration}",  # port: see ReviewRequest.id
            topic=draft.topic,
            iteration=draft.iteration,
            draft_excerpt=draft.content.splitlines()[0],
            due_iso=draft.created_at.isoformat(),
            reviewer_guidance=[
                "Ensure tone matches launch messaging",
                "Confirm CTA is action-oriented",
            ],
        )
        await ctx.request_info(request_data=request, response_type=str)

    @response_handler
    async def forward_decision(
        self, original_request: ReviewRequest, decision: str, ctx: WorkflowContext[ReviewDecision]
    ) -> None:
        await ctx.send_message(ReviewDecision(decision, original_request))


class DraftFinaliser(Executor):
    def __init__(self) -> None:
        super().__init__(id="draft_finaliser")

    @handler
    async def on_review_decision(
        self, review: ReviewDecision, ctx: WorkflowContext[DraftTask, FinalDraft]
    ) -> None:
        original = review.original_request
        if review.decision.strip().lower() != "approve":
            task = DraftTask(original.topic, LAUNCH_TIME, original.iteration + 1)  # port: now()
            await ctx.send_message(task, target_id="draft_writer")
            return
        content = (
            f"Approved launch narrative for {original.topic} (iteration {original.iteration})."
        )
        await ctx.yield_output(FinalDraft(original.topic, content, original.iteration, LAUNCH_TIME))


class LaunchCoordinator(Executor):
    def __init__(self) -> None:
        super().__init__(id="launch_coordinator")

    @handler
    async def kick_off(self, topic: str, ctx: WorkflowContext[DraftTask]) -> None:
        await ctx.send_message(DraftTask(topic, LAUNCH_TIME))  # port: now() + 2 hours

    @handler
    async def collect_final(
        self, draft: FinalDraft, ctx: WorkflowContext[None, FinalDraft]
    ) -> None:
        await ctx.yield_output(draft)  # port: the sample reparses a string date, never needed here

    @handler
    async def handler_sub_workflow_request(
        self, request: SubWorkflowRequestMessage, ctx: WorkflowContext
    ) -> None:
        if not isinstance(request.source_event.data, ReviewRequest):
            raise TypeError(f"Expected 'ReviewRequest', got {type(request.source_event.data)}")
        review_request = request.source_event.data
        ctx.set_state(f"pending:{review_request.id}", request)  # port: was self._pending_requests
        await ctx.request_info(request_data=review_request, response_type=str)

    @response_handler
    async def handle_request_response(
        self,
        original_request: ReviewRequest,
        response: str,
        ctx: WorkflowContext[SubWorkflowResponseMessage],
    ) -> None:
        request_message = ctx.get_state(f"pending:{original_request.id}")  # port: as above
        if request_message is None:
            raise ValueError("No matching pending request found for the resource response")
        ctx.delete_state(f"pending:{original_request.id}")  # port: as above
        await ctx.send_message(request_message.create_response(response))

    # port: on_checkpoint_save / on_checkpoint_restore are gone: the pending requests are state


def build_sub_workflow() -> WorkflowExecutor:
    writer, router, finaliser = DraftWriter(), DraftReviewRouter(), DraftFinaliser()
    sub_workflow = (
        WorkflowBuilder(start_executor=writer)
        .add_edge(writer, router)
        .add_edge(router, finaliser)
        .add_edge(finaliser, writer)  # revision loops
        .build()
    )
    return WorkflowExecutor(sub_workflow, id="launch_subworkflow")


def build_parent_workflow(store: EventStore) -> Workflow:
    coordinator, sub_executor = LaunchCoordinator(), build_sub_workflow()
    return (
        WorkflowBuilder(
            start_executor=coordinator,
            store=store,  # port: was .with_checkpointing(storage)
            instance_id="launch",  # port: the instance whose checkpoints a later process reads
        )
        .add_edge(coordinator, sub_executor)
        .add_edge(sub_executor, coordinator)
        .build()
    )


async def test_sub_workflow_checkpoint_resumes_the_parent_and_its_sub_workflow(
    store_url: str,
) -> None:
    store = open_store(store_url)
    workflow = build_parent_workflow(store)

    # Stage 1: run until the sub-workflow's review request reaches the human.
    request_id: str | None = None
    async for event in workflow.run("Contoso Gadget Launch", stream=True):
        if event.type == "request_info" and request_id is None:
            request_id = event.request_id
        if event.type == "awaiting_input":  # port: AF's status event IDLE_WITH_PENDING_REQUESTS
            break
    assert request_id is not None
    checkpoints = workflow.checkpoints()  # port: was await storage.list_checkpoints(workflow.id)
    resume_checkpoint = checkpoints[-1]
    assert resume_checkpoint.status == "awaiting_input"
    assert resume_checkpoint.iteration_count == 3  # coordinator, sub-workflow, coordinator

    # Stage 2: a fresh parent, as another process would build it, finds the pending request.
    workflow2 = build_parent_workflow(reopen(store_url, store))
    # port: AF restores the checkpoint and emits the request again; steplog refuses to run a
    # checkpoint that only waits for a response (appending nothing) and lists the request
    with pytest.raises(ResumeError, match="waiting for responses"):
        await workflow2.run(checkpoint_id=resume_checkpoint.checkpoint_id)
    (pending,) = workflow2.pending_requests()
    assert pending.request_id == request_id
    assert pending.data.topic == "Contoso Gadget Launch"
    assert workflow2.committed_state()["pending:review-1"].executor_id == "launch_subworkflow"

    # Stage 3: approve; the answer goes through the coordinator back into the sub-workflow.
    outputs = [
        event.data
        async for event in workflow2.run(stream=True, responses={request_id: "approve"})
        if event.type == "output"
    ]
    assert outputs == [
        FinalDraft(
            "Contoso Gadget Launch",
            "Approved launch narrative for Contoso Gadget Launch (iteration 1).",
            1,
            LAUNCH_TIME,
        )
    ]
    assert workflow2.committed_state() == {}
    asked, answered = (e for e in workflow2.events() if e.type == "subworkflow_ran")
    assert answered.continues == asked.child_instance
    assert store.read(answered.child_instance)[-1].type == "run_completed"
    assert run_types(workflow2) == [
        "run_started",
        "run_awaiting_input",
        "run_started",
        "run_completed",
    ]
