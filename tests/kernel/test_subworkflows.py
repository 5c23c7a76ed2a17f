"""Sub-workflows: ``WorkflowExecutor`` runs a workflow as one executor of another.

Agent Framework 1.23's composition samples (``sub_workflow_basics.py``,
``sub_workflow_request_interception.py``, ``sub_workflow_parallel_requests.py``) are re-told
here in our own words, importing from ``kernel``; lines that differ from the sample beyond the
import are marked ``# port:``. Around them: the links between the logs, failure and abort
semantics, and answering requests after the parent's process is gone.

Every test runs on memory and SQLite.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Literal, Never

import pytest

from kernel import (  # port: was `from agent_framework import ...`
    EventStore,
    ExecutionError,
    Executor,
    ResponseError,
    SubworkflowRan,
    SubWorkflowRequestMessage,
    SubWorkflowResponseMessage,
    SubworkflowStarted,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowExecutor,
    counter_ids,
    fold_committed,
    handler,
    open_store,
    response_handler,
)

# Every test on memory and SQLite: the shared ``store`` fixture, given these two backends.
pytestmark = pytest.mark.parametrize("store_url", ["memory", "sqlite"], indirect=True)


def links(wf: Workflow) -> list[SubworkflowRan]:
    return [e for e in wf.events() if isinstance(e, SubworkflowRan)]


def parent_link(store: EventStore, instance_id: str) -> SubworkflowStarted:
    (event,) = [e for e in store.read(instance_id) if isinstance(e, SubworkflowStarted)]
    return event


def markers(events: list[Any]) -> dict[str, str]:
    """Superstep id -> the type of its marker."""
    return {
        e.superstep_id: e.type
        for e in events
        if e.type in ("superstep_committed", "superstep_aborted")
    }


# -- sub_workflow_basics: a parent fans texts out to a sub-workflow and gathers the counts -------


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
    def __init__(self) -> None:
        super().__init__(id="text_processor")

    @handler
    async def process_text(
        self, request: TextProcessingRequest, ctx: WorkflowContext[Never, TextProcessingResult]
    ) -> None:
        words = len(request.text.split()) if request.text.strip() else 0
        ctx.set_state("last_task", request.task_id)
        await ctx.yield_output(
            TextProcessingResult(request.task_id, request.text, words, len(request.text))
        )


class TextProcessingOrchestrator(Executor):
    def __init__(self) -> None:
        super().__init__(id="text_orchestrator")

    @handler
    async def start_processing(
        self, texts: list[str], ctx: WorkflowContext[TextProcessingRequest]
    ) -> None:
        ctx.set_state("expected", len(texts))  # port: an attribute in the sample
        for i, text in enumerate(texts):
            request = TextProcessingRequest(text=text, task_id=f"task_{i + 1}")
            await ctx.send_message(request, target_id="text_processor_workflow")

    @handler
    async def collect_result(
        self,
        result: TextProcessingResult,
        ctx: WorkflowContext[Never, list[TextProcessingResult]],
    ) -> None:
        results = [*ctx.get_state("results", []), result]  # port: an attribute in the sample
        ctx.set_state("results", results)  # port: an attribute in the sample
        if len(results) == ctx.get_state("expected"):  # port: an attribute in the sample
            await ctx.yield_output(results)


def text_workflow(store: EventStore, **options: Any) -> Workflow:
    processing = WorkflowBuilder(start_executor=TextProcessor()).build()
    orchestrator = TextProcessingOrchestrator()
    sub = WorkflowExecutor(processing, id="text_processor_workflow")
    return (
        WorkflowBuilder(
            start_executor=orchestrator,
            store=store,  # port: the store the parent and its sub-workflows are logged in
            **options,
        )
        .add_edge(orchestrator, sub)
        .add_edge(sub, orchestrator)
        .build()
    )


TEXTS = [
    "Hello world! This is a simple test.",
    "Python is a powerful programming language used for many applications.",
    "Short text.",
    "",
    "   Spaces   around   text   ",
]


async def test_sub_workflow_basics_gathers_every_result(store: EventStore) -> None:
    wf = text_workflow(store)
    result = await wf.run(TEXTS)
    (gathered,) = result.get_outputs()
    assert sorted((r.task_id, r.word_count, r.char_count) for r in gathered) == [
        ("task_1", 7, 35),
        ("task_2", 10, 69),
        ("task_3", 2, 11),
        ("task_4", 0, 0),
        ("task_5", 3, 28),
    ]
    # One child instance per message, each its own instance of the same store.
    ran = links(wf)
    assert len(ran) == len(TEXTS)
    assert all(
        link.child_instance.startswith(f"{wf.instance_id}/text_processor_workflow/") for link in ran
    )
    for link in ran:
        child = store.read(link.child_instance)
        assert [e.type for e in child][:2] == ["run_started", "subworkflow_started"]
        assert child[-1].type == "run_completed"
        assert fold_committed(child).values["last_task"] is not None


async def test_the_logs_are_linked_both_ways(store: EventStore) -> None:
    wf = text_workflow(store, id_factory=counter_ids("id"))
    await wf.run(TEXTS[:2])
    first, second = links(wf)
    assert first.superstep_id == second.superstep_id  # both ran in the parent's superstep 2
    assert markers(wf.events())[first.superstep_id] == "superstep_committed"
    for link in (first, second):
        back = parent_link(store, link.child_instance)
        assert (back.parent_instance, back.parent_run, back.parent_superstep) == (
            wf.instance_id,
            link.run_id,
            link.superstep_id,
        )
        assert back.executor_id == "text_processor_workflow"
        assert back.run_id == link.child_run
    # Ids come from the injected factory: the same run twice gives the same child ids.
    other = open_store("memory://")
    again = text_workflow(other, id_factory=counter_ids("id"))
    await again.run(TEXTS[:2])
    assert [link.child_instance for link in links(again)] == [
        first.child_instance,
        second.child_instance,
    ]


# -- failures ------------------------------------------------------------------------------------


class Boom(Exception):
    pass


class Fragile(Executor):
    def __init__(self) -> None:
        super().__init__(id="fragile")

    @handler
    async def work(self, text: str, ctx: WorkflowContext[Never, str]) -> None:
        ctx.set_state("seen", text)
        if text == "boom":
            raise Boom("inner failure")
        await ctx.yield_output(text.upper())


class Starter(Executor):
    def __init__(self) -> None:
        super().__init__(id="starter")

    @handler
    async def go(self, text: str, ctx: WorkflowContext[str]) -> None:
        ctx.set_state("started", text)
        await ctx.send_message(text)


class Sink(Executor):
    def __init__(self) -> None:
        super().__init__(id="sink")

    @handler
    async def take(self, text: str, ctx: WorkflowContext[Never, str]) -> None:
        ctx.set_state("got", text)
        await ctx.yield_output(text)


class Sibling(Executor):
    """Runs beside the sub-workflow and fails once the sub-workflow's run has completed."""

    def __init__(self, done: asyncio.Event | None) -> None:
        super().__init__(id="sibling")
        self.done = done  # None: it does not fail

    @handler
    async def work(self, text: str, ctx: WorkflowContext[Never]) -> None:
        ctx.set_state("sibling", text)
        if self.done is not None:
            await self.done.wait()
            raise Boom("sibling failure")


class Watched(WorkflowExecutor):
    """A WorkflowExecutor that says when its child's run has ended."""

    def __init__(self, workflow: Workflow, done: asyncio.Event) -> None:
        super().__init__(workflow, id="sub")
        self.done = done

    async def _deliver(self, ctx: Any, step: Any, produced: Any) -> None:
        self.done.set()
        await asyncio.sleep(0)  # let the sibling fail first
        await super()._deliver(ctx, step, produced)


def fragile_parent(store: EventStore, sibling: Executor | None = None, **kw: Any) -> Workflow:
    inner = WorkflowBuilder(start_executor=Fragile()).build()
    starter, sink = Starter(), Sink()
    sub = kw.pop("sub", None) or WorkflowExecutor(inner, id="sub")
    builder = (
        WorkflowBuilder(start_executor=starter, store=store, **kw)
        .add_edge(starter, sub)
        .add_edge(sub, sink)
    )
    if sibling is not None:
        builder.add_edge(starter, sibling)
    return builder.build()


async def test_an_inner_failure_aborts_the_parent_superstep(store: EventStore) -> None:
    wf = fragile_parent(store)
    with pytest.raises(Boom, match="inner failure"):
        await wf.run("boom")
    events = wf.events()
    (link,) = links(wf)
    assert markers(events)[link.superstep_id] == "superstep_aborted"
    assert events[-1].type == "run_failed"
    assert events[-1].executor_id == "sub"
    child = store.read(link.child_instance)
    assert child[-1].type == "run_failed"
    assert [e.type for e in child if e.type == "superstep_aborted"] == ["superstep_aborted"]
    assert wf.committed_state() == {"started": "boom"}


async def test_a_sibling_failing_after_the_inner_run_keeps_its_outputs_from_the_parent(
    store: EventStore,
) -> None:
    done = asyncio.Event()
    inner = WorkflowBuilder(start_executor=Fragile()).build()
    wf = fragile_parent(store, Sibling(done), sub=Watched(inner, done))
    with pytest.raises(Boom, match="sibling failure"):
        await wf.run("fine")
    events = wf.events()
    (link,) = links(wf)
    # The inner run completed and committed its own state...
    child = store.read(link.child_instance)
    assert child[-1].type == "run_completed"
    assert fold_committed(child).values == {"seen": store.codec.encode("fine")}
    # ...but the parent superstep that ran it aborted: its output never reached the parent.
    assert markers(events)[link.superstep_id] == "superstep_aborted"
    assert not [e for e in events if e.type == "message_staged" and e.source == "sub"] or all(
        markers(events)[e.superstep_id] == "superstep_aborted"
        for e in events
        if e.type == "message_staged" and e.source == "sub"
    )
    assert "got" not in wf.committed_state()
    assert wf.committed_state() == {"started": "fine"}
    # Resuming the parent runs the superstep again, with a new child instance.
    wf2 = fragile_parent(store, Sibling(None), instance_id=wf.instance_id)
    result = await wf2.resume()
    assert result.get_outputs() == ["FINE"]
    first, second = links(wf2)
    assert first.child_instance != second.child_instance
    assert markers(wf2.events())[second.superstep_id] == "superstep_committed"
    assert wf2.committed_state() == {"started": "fine", "sibling": "fine", "got": "FINE"}


# -- sub_workflow_request_interception: the parent answers the sub-workflow's requests ----------


@dataclass
class SanitizedEmailResult:
    original: str
    sanitized: str
    is_valid: bool


class EmailSanitizer(Executor):
    @handler
    async def handle(self, email_address: str, ctx: WorkflowContext[SanitizedEmailResult]) -> None:
        sanitized = email_address.strip()
        await ctx.send_message(SanitizedEmailResult(email_address, sanitized, False))


class EmailFormatValidator(Executor):
    @handler
    async def handle(
        self,
        partial: SanitizedEmailResult,
        ctx: WorkflowContext[SanitizedEmailResult, SanitizedEmailResult],
    ) -> None:
        if "@" not in partial.sanitized or "." not in partial.sanitized.split("@")[-1]:
            await ctx.yield_output(SanitizedEmailResult(partial.original, partial.sanitized, False))
            return
        await ctx.send_message(SanitizedEmailResult(partial.original, partial.sanitized, False))


class DomainValidator(Executor):
    @handler
    async def handle(self, partial: SanitizedEmailResult, ctx: WorkflowContext) -> None:
        domain = partial.sanitized.split("@")[-1]
        ctx.set_state(f"pending:{domain}", partial)  # port: an attribute in the sample
        await ctx.request_info(request_data=domain, response_type=bool)

    @response_handler
    async def on_domain(
        self, domain: str, is_valid: bool, ctx: WorkflowContext[Never, SanitizedEmailResult]
    ) -> None:
        partial = ctx.get_state(f"pending:{domain}")  # port: an attribute in the sample
        if partial is None:
            raise ValueError(f"response for unknown domain {domain!r}")
        ctx.delete_state(f"pending:{domain}")  # port: an attribute in the sample
        await ctx.yield_output(SanitizedEmailResult(partial.original, partial.sanitized, is_valid))


def email_validation_workflow() -> Workflow:
    sanitizer = EmailSanitizer("email_sanitizer")
    formats = EmailFormatValidator("email_format_validator")
    domains = DomainValidator("domain_validator")
    return (
        WorkflowBuilder(start_executor=sanitizer)
        .add_edge(sanitizer, formats)
        .add_edge(formats, domains)
        .build()
    )


@dataclass
class Email:
    recipient: str
    subject: str
    body: str


class SmartEmailOrchestrator(Executor):
    def __init__(self, id: str, approved_domains: set[str]) -> None:
        super().__init__(id=id)
        self._approved_domains = approved_domains  # configuration, not state: it never changes

    @handler
    async def run(self, email: Email, ctx: WorkflowContext[Email | str, bool]) -> None:
        recipient = email.recipient
        if recipient in ctx.get_state("approved", []):  # port: an attribute in the sample
            await ctx.send_message(email)
            return
        if recipient in ctx.get_state("disapproved", []):  # port: an attribute in the sample
            await ctx.yield_output(False)
            return
        ctx.set_state(f"email:{recipient}", email)  # port: an attribute in the sample
        await ctx.send_message(recipient)

    @handler
    async def on_domain_request(
        self, request: SubWorkflowRequestMessage, ctx: WorkflowContext[SubWorkflowResponseMessage]
    ) -> None:
        domain = request.source_event.data
        if not isinstance(domain, str):
            raise TypeError(f"expected a domain, got {type(domain)}")
        is_valid = domain in self._approved_domains
        await ctx.send_message(request.create_response(is_valid), target_id=request.executor_id)

    @handler
    async def on_result(
        self, result: SanitizedEmailResult, ctx: WorkflowContext[Email, bool]
    ) -> None:
        email = ctx.get_state(f"email:{result.original}")  # port: an attribute in the sample
        ctx.delete_state(f"email:{result.original}")  # port: an attribute in the sample
        email.recipient = result.sanitized
        key = "approved" if result.is_valid else "disapproved"  # port: attributes in the sample
        ctx.set_state(key, [*ctx.get_state(key, []), result.original])  # port: as above
        if result.is_valid:
            await ctx.send_message(email)
        else:
            await ctx.yield_output(False)


class EmailDelivery(Executor):
    @handler
    async def handle(self, email: Email, ctx: WorkflowContext[Never, bool]) -> None:
        await ctx.yield_output(True)  # port: the sample sleeps a second to "send"


def email_workflow(store: EventStore, instance_id: str | None = None) -> Workflow:
    orchestrator = SmartEmailOrchestrator(
        "smart_email_orchestrator", {"example.com", "company.com"}
    )
    delivery = EmailDelivery("email_delivery")
    validation = WorkflowExecutor(email_validation_workflow(), id="email_validation_workflow")
    return (
        WorkflowBuilder(start_executor=orchestrator, store=store, instance_id=instance_id)
        .add_edge(orchestrator, validation)
        .add_edge(validation, orchestrator)
        .add_edge(orchestrator, delivery)
        .build()
    )


async def test_sub_workflow_request_interception_delivers_or_blocks_each_email(
    store: EventStore,
) -> None:
    wf = email_workflow(store)
    emails = [
        Email("user1@example.com", "Hello User1", "This is a test email."),
        Email(" user2@invalid", "Hello User2", "This is a test email."),
        Email("  user3@company.com  ", "Hello User3", "This is a test email."),
        Email("user4@unknown.com", "Hello User4", "This is a test email."),
        Email("user1@example.com", "Hello User1", "This is a test email."),
        Email(" user2@invalid", "Hello User2", "This is a test email."),
    ]
    verdicts = []
    for email in emails:
        outputs = [e.data async for e in wf.run(email, stream=True) if e.type == "output"]
        verdicts.append(outputs)
    assert verdicts == [[True], [False], [True], [False], [True], [False]]
    assert wf.pending_requests() == []
    # The domain checks were answered inside: each answer continued the child in a fork of it.
    answered = [link for link in links(wf) if link.continues is not None]
    assert len(answered) == 3  # example.com, company.com, unknown.com
    for link in answered:
        forked = store.read(link.child_instance)[0]
        assert forked.type == "instance_forked"
        assert forked.origin_instance == link.continues
        assert store.read(link.child_instance)[-1].type == "run_completed"


# -- requests nobody intercepts become the parent's own -----------------------------------------


@dataclass
class DomainCheck:
    domain: str


class Asker(Executor):
    def __init__(self) -> None:
        super().__init__(id="asker")

    @handler
    async def ask(self, email: str, ctx: WorkflowContext) -> None:
        ctx.set_state("email", email)
        await ctx.request_info(DomainCheck(email.split("@")[1]), bool)

    @response_handler
    async def answered(
        self, check: DomainCheck, ok: bool, ctx: WorkflowContext[Never, str]
    ) -> None:
        ctx.set_state("ok", ok)
        await ctx.yield_output(f"{ctx.get_state('email')}: {'valid' if ok else 'invalid'}")


def asking_parent(store: EventStore, instance_id: str | None = None, **options: Any) -> Workflow:
    inner = WorkflowBuilder(start_executor=Asker()).build()
    starter, sink = Starter(), Sink()
    sub = WorkflowExecutor(inner, id="sub", **options)
    return (
        WorkflowBuilder(start_executor=starter, store=store, instance_id=instance_id)
        .add_edge(starter, sub)
        .add_edge(sub, sink)
        .build()
    )


@pytest.mark.parametrize("propagate", [False, True])
async def test_a_request_nobody_intercepts_is_the_parents_and_its_answer_continues_the_child(
    store: EventStore, propagate: bool
) -> None:
    wf = asking_parent(store, instance_id="parent", propagate_request=propagate)
    result = await wf.run("ann@example.com")
    assert result.status == "awaiting_input"
    (request,) = wf.pending_requests()
    assert request.data == DomainCheck("example.com")
    assert request.executor_id == "sub"
    assert request.response_type == "bool"
    (first,) = links(wf)
    assert first.requests == [request.request_id]
    # Answered by a later process: a new Workflow object on the same store and instance.
    later = asking_parent(store, instance_id="parent", propagate_request=propagate)
    result = await later.run(responses={request.request_id: True})
    assert result.status == "completed"
    assert result.get_outputs() == ["ann@example.com: valid"]
    assert later.committed_state()["got"] == "ann@example.com: valid"
    first, second = links(later)
    assert second.continues == first.child_instance
    assert second.requests == []
    child = store.read(second.child_instance)
    assert fold_committed(child).values["ok"] is True
    # The first child is as it was: still waiting, never continued in place.
    assert store.read(first.child_instance)[-1].type == "run_awaiting_input"


class DoubleAnswer(Executor):
    """Answers each sub-workflow request twice: the second answer finds no child waiting."""

    def __init__(self) -> None:
        super().__init__(id="double")

    @handler
    async def on_request(
        self, request: SubWorkflowRequestMessage, ctx: WorkflowContext[SubWorkflowResponseMessage]
    ) -> None:
        await ctx.send_message(request.create_response(True))
        await ctx.send_message(request.create_response(False))


async def test_a_second_answer_to_one_request_fails_naming_it(store: EventStore) -> None:
    inner = WorkflowBuilder(start_executor=Asker()).build()
    starter, double, sink = Starter(), DoubleAnswer(), Sink()
    sub = WorkflowExecutor(inner, id="sub")
    wf = (
        WorkflowBuilder(start_executor=starter, store=store)
        .add_edge(starter, sub)
        .add_edge(sub, double)
        .add_edge(double, sub)
        .add_edge(sub, sink)
        .build()
    )
    with pytest.raises(ExecutionError, match="none of its sub-workflows is waiting for it"):
        await wf.run("ann@example.com")
    first, answered = links(wf)
    assert answered.continues == first.child_instance
    assert markers(wf.events())[answered.superstep_id] == "superstep_aborted"
    assert "got" not in wf.committed_state()


def test_a_response_of_the_wrong_type_is_refused_when_made(store: EventStore) -> None:
    from kernel import WorkflowEvent

    request = SubWorkflowRequestMessage(
        WorkflowEvent("request_info", "run", request_id="r1", data="x"), "sub", "bool"
    )
    assert request.create_response(True).data is True
    with pytest.raises(TypeError, match="must be a bool, got a str"):
        request.create_response("yes")


# -- sub_workflow_parallel_requests: two parent services answer a sub-workflow's requests -------


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
    resource_type: str
    amount: int
    priority: str
    id: str = ""  # port: the sample's default is one uuid4 shared by every instance


@dataclass
class PolicyRequest:
    policy_type: str
    resource_type: str
    amount: int
    id: str = ""  # port: as above


class RequestDistribution(Executor):
    @handler
    async def distribute(
        self,
        requests: list[ComputingResourceRequest],
        ctx: WorkflowContext[ResourceRequest | PolicyRequest | int],
    ) -> None:
        for i, req in enumerate(requests):
            if req.request_type == "resource":
                assert req.priority is not None
                await ctx.send_message(
                    ResourceRequest(req.resource_type, req.amount, req.priority, f"r{i}")
                )
            else:
                assert req.policy_type is not None
                await ctx.send_message(
                    PolicyRequest(req.policy_type, req.resource_type, req.amount, f"p{i}")
                )
        await ctx.send_message(len(requests))


class ResourceRequester(Executor):
    @handler
    async def run(self, request: ResourceRequest, ctx: WorkflowContext) -> None:
        await ctx.request_info(request_data=request, response_type=ResourceResponse)

    @response_handler
    async def on_response(
        self,
        original: ResourceRequest,
        response: ResourceResponse,
        ctx: WorkflowContext[ResourceResponse],
    ) -> None:
        await ctx.send_message(response)


class PolicyChecker(Executor):
    @handler
    async def run(self, request: PolicyRequest, ctx: WorkflowContext) -> None:
        await ctx.request_info(request_data=request, response_type=PolicyResponse)

    @response_handler
    async def on_response(
        self,
        original: PolicyRequest,
        response: PolicyResponse,
        ctx: WorkflowContext[PolicyResponse],
    ) -> None:
        await ctx.send_message(response)


class ResultCollector(Executor):
    @handler
    async def set_request_count(self, count: int, ctx: WorkflowContext) -> None:
        ctx.set_state("count", count)  # port: an attribute in the sample

    @handler
    async def collect(
        self, response: ResourceResponse | PolicyResponse, ctx: WorkflowContext[Never, str]
    ) -> None:
        responses = [*ctx.get_state("responses", []), response]  # port: an attribute
        ctx.set_state("responses", responses)  # port: an attribute in the sample
        count = ctx.get_state("count")
        if len(responses) == count:
            await ctx.yield_output(f"All {count} requests processed.")
        elif count is not None and len(responses) > count:
            raise ValueError("more responses than requests")


def distribution_workflow() -> Workflow:
    orchestrator = RequestDistribution("orchestrator")
    resources = ResourceRequester("resource_requester")
    policies = PolicyChecker("policy_checker")
    collector = ResultCollector("result_collector")
    return (
        WorkflowBuilder(start_executor=orchestrator)
        .add_edge(orchestrator, resources)
        .add_edge(orchestrator, policies)
        .add_edge(resources, collector)
        .add_edge(policies, collector)
        .add_edge(orchestrator, collector)
        .build()
    )


class ResourceAllocator(Executor):
    @handler
    async def on_request(
        self, request: SubWorkflowRequestMessage, ctx: WorkflowContext[SubWorkflowResponseMessage]
    ) -> None:
        payload = request.source_event.data
        if not isinstance(payload, ResourceRequest):
            return
        cache = ctx.get_state("cache", {"cpu": 10, "memory": 50, "disk": 100})  # port: attribute
        if cache.get(payload.resource_type, 0) >= payload.amount:
            cache = {**cache, payload.resource_type: cache[payload.resource_type] - payload.amount}
            ctx.set_state("cache", cache)  # port: an attribute in the sample
            response = ResourceResponse(payload.resource_type, payload.amount, "cache")
            await ctx.send_message(request.create_response(response))
        else:
            ctx.set_state(f"pending:{payload.id}", request.source_event)  # port: an attribute
            await ctx.request_info(request_data=payload, response_type=ResourceResponse)

    @response_handler
    async def on_external(
        self,
        original: ResourceRequest,
        response: ResourceResponse,
        ctx: WorkflowContext[SubWorkflowResponseMessage],
    ) -> None:
        source_event = ctx.get_state(f"pending:{original.id}")  # port: an attribute
        if source_event is None:
            raise ValueError("no pending request for this resource response")
        await ctx.send_message(SubWorkflowResponseMessage(data=response, source_event=source_event))


class PolicyEngine(Executor):
    QUOTA = {"cpu": 5, "memory": 20, "disk": 1000}

    @handler
    async def on_request(
        self, request: SubWorkflowRequestMessage, ctx: WorkflowContext[SubWorkflowResponseMessage]
    ) -> None:
        payload = request.source_event.data
        if not isinstance(payload, PolicyRequest):
            return
        if payload.policy_type == "quota":
            allowed = payload.amount <= self.QUOTA.get(payload.resource_type, 0)
            reason = "Within quota limits" if allowed else "Exceeds quota limits"
            await ctx.send_message(request.create_response(PolicyResponse(allowed, reason)))
        else:
            ctx.set_state(f"pending:{payload.id}", request.source_event)  # port: an attribute
            await ctx.request_info(request_data=payload, response_type=PolicyResponse)

    @response_handler
    async def on_external(
        self,
        original: PolicyRequest,
        response: PolicyResponse,
        ctx: WorkflowContext[SubWorkflowResponseMessage],
    ) -> None:
        source_event = ctx.get_state(f"pending:{original.id}")  # port: an attribute
        if source_event is None:
            raise ValueError("no pending request for this policy response")
        await ctx.send_message(SubWorkflowResponseMessage(data=response, source_event=source_event))


def resource_workflow(store: EventStore, instance_id: str | None = None) -> Workflow:
    allocator = ResourceAllocator("resource_allocator")
    policy = PolicyEngine("policy_engine")
    sub = WorkflowExecutor(
        distribution_workflow(), "sub_workflow_executor", allow_direct_output=True
    )
    return (
        WorkflowBuilder(start_executor=sub, store=store, instance_id=instance_id)
        .add_edge(sub, allocator)
        .add_edge(allocator, sub)
        .add_edge(sub, policy)
        .add_edge(policy, sub)
        .build()
    )


async def test_sub_workflow_parallel_requests_answered_inside_and_outside(
    store: EventStore,
) -> None:
    wf = resource_workflow(store, instance_id="resources")
    requests = [
        ComputingResourceRequest("resource", "cpu", 2, priority="normal"),
        ComputingResourceRequest("policy", "cpu", 3, policy_type="quota"),
        ComputingResourceRequest("resource", "memory", 15, priority="normal"),
        ComputingResourceRequest("policy", "memory", 100, policy_type="quota"),
        ComputingResourceRequest("resource", "gpu", 1, priority="high"),
        ComputingResourceRequest("policy", "disk", 500, policy_type="quota"),
        ComputingResourceRequest("policy", "cpu", 1, policy_type="security"),
    ]
    result = await wf.run(requests)
    assert result.status == "awaiting_input"
    asked = result.get_request_info_events()
    assert sorted(type(e.data).__name__ for e in asked) == ["PolicyRequest", "ResourceRequest"]
    responses: dict[str, Any] = {}
    for event in asked:
        if isinstance(event.data, ResourceRequest):
            responses[event.request_id or ""] = ResourceResponse(
                event.data.resource_type, event.data.amount, "external_provider"
            )
        else:
            responses[event.request_id or ""] = PolicyResponse(True, "External system approved")
    later = resource_workflow(store, instance_id="resources")  # port: a later process
    result = await later.run(responses=responses)
    assert result.status == "completed"
    assert result.get_outputs() == ["All 7 requests processed."]
    # Every answer went to the child holding the request, each in a fork of the one before.
    chain = [link for link in links(later) if link.continues is not None]
    assert len(chain) == 7
    last = store.read(chain[-1].child_instance)
    assert len(fold_committed(last).values["responses"]) == 7


# -- AF's test_sub_workflow.py, re-told: many children at once, per-child interception ---------


@dataclass
class EmailValidationRequest:
    email: str


@dataclass
class DomainCheckRequest:
    id: str = ""  # port: a uuid4 default_factory in AF's test; the email is unique here
    domain: str = ""
    email: str = ""


@dataclass
class ValidationResult:
    email: str
    is_valid: bool
    reason: str


class FormatCheck(Executor):
    def __init__(self) -> None:
        super().__init__(id="email_format_validator")

    @handler
    async def validate(
        self,
        request: EmailValidationRequest,
        ctx: WorkflowContext[DomainCheckRequest, ValidationResult],
    ) -> None:
        if "@" not in request.email:
            await ctx.yield_output(ValidationResult(request.email, False, "Invalid email format"))
            return
        domain = request.email.split("@")[1]
        await ctx.send_message(DomainCheckRequest(request.email, domain, request.email))


class DomainCheck2(Executor):
    def __init__(self) -> None:
        super().__init__(id="email_domain_validator")

    @handler
    async def validate(
        self, request: DomainCheckRequest, ctx: WorkflowContext[DomainCheckRequest]
    ) -> None:
        await ctx.request_info(request, bool)

    @response_handler
    async def on_domain(
        self,
        original: DomainCheckRequest,
        approved: bool,
        ctx: WorkflowContext[Never, ValidationResult],
    ) -> None:
        reason = "Domain approved" if approved else "Domain not approved"
        await ctx.yield_output(ValidationResult(original.email, approved, reason))


def validation_workflow() -> Workflow:
    formats, domains = FormatCheck(), DomainCheck2()
    return WorkflowBuilder(start_executor=formats).add_edge(formats, domains).build()


class ConcurrentProcessor(Executor):
    def __init__(self, approve: dict[str, set[str]] | None = None) -> None:
        super().__init__(id="processor")
        self.approve = approve or {}  # per WorkflowExecutor id: domains answered inside

    @handler
    async def start(self, emails: list[str], ctx: WorkflowContext[EmailValidationRequest]) -> None:
        for email in emails:
            target = None  # one sub-workflow executor, or (with rules) one per email
            if self.approve:
                target = "workflow_b" if email.endswith(".org") else "workflow_a"
            await ctx.send_message(EmailValidationRequest(email), target_id=target)

    @handler
    async def on_request(
        self, request: SubWorkflowRequestMessage, ctx: WorkflowContext[SubWorkflowResponseMessage]
    ) -> None:
        check = request.source_event.data
        assert isinstance(check, DomainCheckRequest)
        if check.domain in self.approve.get(request.executor_id, set()):
            await ctx.send_message(request.create_response(True), target_id=request.executor_id)
            return
        ctx.set_state(f"pending:{check.id}", request)  # port: an attribute in AF's test
        await ctx.request_info(check, bool)

    @response_handler
    async def on_answer(
        self,
        original: DomainCheckRequest,
        approved: bool,
        ctx: WorkflowContext[SubWorkflowResponseMessage],
    ) -> None:
        request = ctx.get_state(f"pending:{original.id}")  # port: an attribute in AF's test
        ctx.delete_state(f"pending:{original.id}")
        await ctx.send_message(request.create_response(approved), target_id=request.executor_id)

    @handler
    async def collect(self, result: ValidationResult, ctx: WorkflowContext) -> None:
        ctx.set_state(f"result:{result.email}", result)  # port: an attribute in AF's test


def processor_workflow(store: EventStore, processor: ConcurrentProcessor, *subs: str) -> Workflow:
    builder = WorkflowBuilder(start_executor=processor, store=store, instance_id="processor")
    for sub_id in subs:
        sub = WorkflowExecutor(validation_workflow(), sub_id)
        builder.add_edge(processor, sub).add_edge(sub, processor)
    return builder.build()


def results(wf: Workflow) -> dict[str, ValidationResult]:
    state = wf.committed_state()
    return {k.removeprefix("result:"): v for k, v in state.items() if k.startswith("result:")}


async def test_many_children_of_one_executor_wait_and_are_answered_at_once(
    store: EventStore,
) -> None:
    emails = [f"user{i}@domain{i}.com" for i in range(1, 6)]
    wf = processor_workflow(store, ConcurrentProcessor(), "email_workflow")
    result = await wf.run(emails)
    asked = result.get_request_info_events()
    assert sorted(e.data.domain for e in asked) == [f"domain{i}.com" for i in range(1, 6)]
    children = {link.child_instance for link in links(wf)}
    assert len(children) == 5  # one child per message, all waiting at once
    later = processor_workflow(store, ConcurrentProcessor(), "email_workflow")
    result = await later.run(responses={e.request_id or "": True for e in asked})
    assert result.status == "completed"
    assert {e: (r.is_valid, r.reason) for e, r in results(later).items()} == {
        e: (True, "Domain approved") for e in emails
    }
    assert later.pending_requests() == []


async def test_each_sub_workflow_executor_is_intercepted_by_its_own_rules(
    store: EventStore,
) -> None:
    processor = ConcurrentProcessor({"workflow_a": {"strict.com"}, "workflow_b": {"random.org"}})
    wf = processor_workflow(store, processor, "workflow_a", "workflow_b")
    result = await wf.run(["user@strict.com", "user@random.org"])
    assert result.get_request_info_events() == []
    assert {e: r.is_valid for e, r in results(wf).items()} == {
        "user@strict.com": True,
        "user@random.org": True,
    }
    by_executor = {link.executor_id for link in links(wf)}
    assert by_executor == {"workflow_a", "workflow_b"}


@dataclass
class StepRequest:
    prompt: str


class TwoStep(Executor):
    def __init__(self) -> None:
        super().__init__(id="two_step_executor")

    @handler
    async def begin(self, msg: str, ctx: WorkflowContext) -> None:
        await ctx.request_info(StepRequest(f"First request for: {msg}"), str)

    @response_handler
    async def on_answer(
        self, original: StepRequest, answer: str, ctx: WorkflowContext[Never, bool]
    ) -> None:
        answers = [*ctx.get_state("answers", []), answer]  # port: an attribute in AF's test
        ctx.set_state("answers", answers)
        if len(answers) == 1:
            await ctx.request_info(StepRequest("Second request"), str)
        else:
            await ctx.yield_output(True)


async def test_a_resumed_parent_gets_only_the_new_request_of_its_child(store: EventStore) -> None:
    def build() -> Workflow:
        inner = WorkflowBuilder(start_executor=TwoStep()).build()
        starter = Starter()
        sub = WorkflowExecutor(inner, id="sub_workflow_executor", allow_direct_output=True)
        return (
            WorkflowBuilder(start_executor=starter, store=store, instance_id="two-step")
            .add_edge(starter, sub)
            .build()
        )

    first = [e async for e in build().run("test_value", stream=True) if e.type == "request_info"]
    (asked,) = first
    resumed = build()
    (pending,) = resumed.pending_requests()
    assert pending.request_id == asked.request_id
    again = [
        e
        async for e in resumed.run(stream=True, responses={pending.request_id: "first_answer"})
        if e.type == "request_info"
    ]
    assert [e.data.prompt for e in again] == ["Second request"]
    (second,) = resumed.pending_requests()
    final = await resumed.run(responses={second.request_id: "second_answer"})
    assert final.get_outputs() == [True]


# -- sub_workflow_kwargs: the parent run's arguments reach every level --------------------------


class KwargsReader(Executor):
    def __init__(self) -> None:
        super().__init__(id="reader")

    @handler
    async def read(self, text: str, ctx: WorkflowContext[Never, str]) -> None:
        user = ctx.run_kwargs["user_token"]["user_name"]
        await ctx.yield_output(f"{text} for {user}")


async def test_run_arguments_reach_nested_sub_workflows(store: EventStore) -> None:
    innermost = WorkflowBuilder(start_executor=KwargsReader()).build()
    middle_sub = WorkflowExecutor(innermost, id="inner", allow_direct_output=True)
    middle = WorkflowBuilder(start_executor=middle_sub).build()
    outer_sub = WorkflowExecutor(middle, id="middle", allow_direct_output=True)
    wf = WorkflowBuilder(start_executor=outer_sub, store=store, instance_id="outer").build()
    result = await wf.run("profile", user_token={"user_name": "alice@contoso.com"})
    assert result.get_outputs() == ["profile for alice@contoso.com"]
    (link,) = links(wf)
    (nested,) = [e for e in store.read(link.child_instance) if isinstance(e, SubworkflowRan)]
    assert nested.child_instance.startswith(f"{link.child_instance}/inner/")
    assert parent_link(store, nested.child_instance).parent_instance == link.child_instance


async def test_a_fork_of_a_waiting_parent_answers_in_a_child_of_its_own(store: EventStore) -> None:
    wf = asking_parent(store, instance_id="parent")
    await wf.run("ann@example.com")
    (request,) = wf.pending_requests()
    fork = wf.fork(at=wf.checkpoints()[-1].checkpoint_id, instance_id="parent-fork")
    (forked_request,) = fork.pending_requests()
    assert forked_request.request_id == request.request_id
    result = await fork.run(responses={request.request_id: False})
    assert result.get_outputs() == ["ann@example.com: invalid"]
    (answered,) = links(fork)
    (asked,) = links(wf)
    assert answered.continues == asked.child_instance
    assert answered.child_instance.startswith("parent-fork/sub/")
    # The origin is untouched and can still answer the same request its own way.
    result = await wf.run(responses={request.request_id: True})
    assert result.get_outputs() == ["ann@example.com: valid"]


class Waiter(Executor):
    """Says when it has started, then waits until cancelled."""

    def __init__(self, entered: asyncio.Event) -> None:
        super().__init__(id="waiter")
        self.entered = entered

    @handler
    async def work(self, text: str, ctx: WorkflowContext[Never, str]) -> None:
        ctx.set_state("waiting", text)
        self.entered.set()
        await asyncio.Event().wait()


async def test_a_cancelled_parent_cancels_its_running_child(store: EventStore) -> None:
    entered = asyncio.Event()
    inner = WorkflowBuilder(start_executor=Waiter(entered)).build()
    starter, sink = Starter(), Sink()
    sub = WorkflowExecutor(inner, id="sub")
    wf = (
        WorkflowBuilder(start_executor=starter, store=store, instance_id="parent")
        .add_edge(starter, sub)
        .add_edge(sub, sink)
        .build()
    )
    task = asyncio.create_task(wf.run("go"))
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (link,) = links(wf)
    assert markers(wf.events())[link.superstep_id] == "superstep_aborted"
    assert wf.events()[-1].type == "run_cancelled"
    child = store.read(link.child_instance)
    assert child[-1].type == "run_cancelled"
    assert fold_committed(child).values == {}


async def test_a_passed_on_request_refuses_a_wrong_answer_before_recording_it(
    store: EventStore,
) -> None:
    wf = asking_parent(store, instance_id="parent")
    await wf.run("ann@example.com")
    (request,) = wf.pending_requests()
    before = len(wf.events())
    with pytest.raises(ResponseError, match="must be a bool"):
        await wf.run(responses={request.request_id: "yes"})
    assert len(wf.events()) == before
    result = await wf.run(responses={request.request_id: True})
    assert result.get_outputs() == ["ann@example.com: valid"]


class Answerer(Executor):
    """Answers each sub-workflow request at once, and tells ``flaky`` that it did."""

    def __init__(self) -> None:
        super().__init__(id="answerer")

    @handler
    async def on_request(
        self, request: SubWorkflowRequestMessage, ctx: WorkflowContext[Any]
    ) -> None:
        await ctx.send_message(request.create_response(True), target_id=request.executor_id)
        await ctx.send_message("answered", target_id="flaky")


class Flaky(Executor):
    """Fails once the sub-workflow's answering child has run (or, without ``done``, never)."""

    def __init__(self, done: asyncio.Event | None) -> None:
        super().__init__(id="flaky")
        self.done = done

    @handler
    async def on_note(self, note: str, ctx: WorkflowContext) -> None:
        ctx.set_state("flaky", note)
        if self.done is not None:
            await self.done.wait()
            raise Boom("flaky sibling")


class WatchedAnswers(WorkflowExecutor):
    """Says when a child that took an answer has run."""

    def __init__(self, workflow: Workflow, done: asyncio.Event) -> None:
        super().__init__(workflow, id="sub")
        self.done = done

    async def _deliver(self, ctx: Any, step: Any, produced: Any) -> None:
        if not produced.requests:  # the answering child (the asking one made a request)
            self.done.set()
            await asyncio.sleep(0)
        await super()._deliver(ctx, step, produced)


def answering_parent(store: EventStore, flaky: Flaky, sub: WorkflowExecutor | None) -> Workflow:
    inner = WorkflowBuilder(start_executor=Asker()).build()
    sub = sub or WorkflowExecutor(inner, id="sub")
    starter, answerer, sink = Starter(), Answerer(), Sink()
    return (
        WorkflowBuilder(start_executor=starter, store=store, instance_id="answering")
        .add_edge(starter, sub)
        .add_edge(sub, answerer)
        .add_edge(answerer, sub)
        .add_edge(answerer, flaky)
        .add_edge(sub, sink)
        .build()
    )


async def test_an_aborted_answer_leaves_the_asking_child_as_it_was_and_the_retry_answers_again(
    store: EventStore,
) -> None:
    done = asyncio.Event()
    inner = WorkflowBuilder(start_executor=Asker()).build()
    wf = answering_parent(store, Flaky(done), WatchedAnswers(inner, done))
    with pytest.raises(Boom, match="flaky sibling"):
        await wf.run("ann@example.com")
    asked, aborted = links(wf)
    assert markers(wf.events())[asked.superstep_id] == "superstep_committed"
    assert markers(wf.events())[aborted.superstep_id] == "superstep_aborted"
    assert aborted.continues == asked.child_instance
    asking_log = store.read(asked.child_instance)
    assert asking_log[-1].type == "run_awaiting_input"
    assert store.read(aborted.child_instance)[-1].type == "run_completed"  # orphaned, inert

    retry = answering_parent(store, Flaky(None), None)
    result = await retry.resume()
    assert result.get_outputs() == ["ann@example.com: valid"]
    _, _, answered = links(retry)
    assert answered.continues == asked.child_instance  # the asking child, not the orphan
    assert answered.child_instance not in (asked.child_instance, aborted.child_instance)
    assert markers(retry.events())[answered.superstep_id] == "superstep_committed"
    assert store.read(asked.child_instance) == asking_log  # never touched
    assert retry.committed_state() == {
        "started": "ann@example.com",
        "flaky": "answered",
        "got": "ann@example.com: valid",
    }
