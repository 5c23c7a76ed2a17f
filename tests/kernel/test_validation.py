"""Validation at ``build()`` with AF's categories: every graph mistake is a
``WorkflowValidationError`` whose ``validation_type`` names the kind, raised as AF's subclass
where AF has one, and a ``DefinitionError`` (so a ``ValueError``) all the same."""

from __future__ import annotations

import pickle
from typing import Any, Never

import pytest

import kernel
from kernel import (
    Case,
    Default,
    DefinitionError,
    EdgeDuplicationError,
    Executor,
    GraphConnectivityError,
    StepLogError,
    TypeCompatibilityError,
    ValidationTypeEnum,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowValidationError,
    handler,
    open_store,
)


class Upper(Executor):
    @handler
    async def run(self, text: str, ctx: WorkflowContext[str]) -> None:
        await ctx.send_message(text.upper())


class Double(Executor):
    @handler
    async def run(self, n: int, ctx: WorkflowContext[int]) -> None:
        await ctx.send_message(n * 2)


class Anything(Executor):
    @handler
    async def run(self, message: Any, ctx: WorkflowContext[Any]) -> None:
        await ctx.send_message(f"seen {message}")


class Undeclared(Executor):
    @handler
    async def run(self, text: str, ctx: WorkflowContext) -> None:  # type: ignore[type-arg]
        await ctx.send_message(text)


class Joiner(Executor):
    @handler
    async def run(self, texts: list[str], ctx: WorkflowContext[str]) -> None:
        await ctx.send_message(", ".join(texts))


class Silent(Executor):
    @handler
    async def run(self, text: str, ctx: WorkflowContext[Never]) -> None: ...


def category(error: pytest.ExceptionInfo[DefinitionError]) -> ValidationTypeEnum | None:
    return error.value.validation_type


# -- the error tree --------------------------------------------------------------------------


def test_the_validation_errors_are_definition_errors_with_afs_names_and_str():
    for cls in (WorkflowValidationError, EdgeDuplicationError, TypeCompatibilityError):
        assert issubclass(cls, DefinitionError)
        assert issubclass(cls, StepLogError)
        assert issubclass(cls, ValueError)
        assert cls.__module__ == "kernel"
    assert issubclass(GraphConnectivityError, WorkflowValidationError)
    assert ValidationTypeEnum.__module__ == "kernel"
    assert {t.value for t in ValidationTypeEnum} >= {
        "EDGE_DUPLICATION",
        "EXECUTOR_DUPLICATION",
        "TYPE_COMPATIBILITY",
        "GRAPH_CONNECTIVITY",
        "HANDLER_OUTPUT_ANNOTATION",
        "OUTPUT_VALIDATION",
    }

    error = WorkflowValidationError("Test message", ValidationTypeEnum.EDGE_DUPLICATION)

    assert str(error) == "[EDGE_DUPLICATION] Test message"
    assert error.message == "Test message"
    assert error.validation_type is ValidationTypeEnum.EDGE_DUPLICATION
    assert DefinitionError("a bad option").validation_type is None
    assert {
        "EdgeDuplicationError",
        "GraphConnectivityError",
        "TypeCompatibilityError",
        "ValidationTypeEnum",
        "WorkflowValidationError",
    } <= set(kernel.__all__)


@pytest.mark.parametrize(
    "error",
    [
        EdgeDuplicationError("a->b"),
        TypeCompatibilityError("a", "b", [str], [int]),
        GraphConnectivityError("unreachable"),
        WorkflowValidationError("twice", ValidationTypeEnum.EXECUTOR_DUPLICATION),
    ],
)
def test_a_validation_error_survives_pickling_with_its_attributes(error):
    copy = pickle.loads(pickle.dumps(error))

    assert type(copy) is type(error)
    assert str(copy) == str(error)
    assert copy.__dict__ == error.__dict__


def test_an_option_error_has_no_category():
    with pytest.raises(DefinitionError) as caught:
        WorkflowBuilder(start_executor=Upper("a"), max_supersteps=0).build()

    assert type(caught.value) is DefinitionError
    assert category(caught) is None


# -- EDGE_DUPLICATION / EXECUTOR_DUPLICATION -------------------------------------------------


def test_the_same_edge_twice_is_an_edge_duplication_error_naming_the_edge():
    a, b = Upper("executor1"), Upper("executor2")

    with pytest.raises(EdgeDuplicationError) as caught:
        WorkflowBuilder(start_executor=a).add_edge(a, b).add_edge(a, b).build()

    assert caught.value.edge_id == "executor1->executor2"
    assert "executor1->executor2" in str(caught.value)  # as AF's tests read it
    assert "Remove the second one" in str(caught.value)
    assert category(caught) is ValidationTypeEnum.EDGE_DUPLICATION


@pytest.mark.parametrize(
    ("make", "edge_id"),
    [
        (lambda w, a, b, c: w.add_edge(a, b).add_fan_out_edges(a, [c, b]), "a->b"),
        (lambda w, a, b, c: w.add_fan_out_edges(a, [b, b]), "a->b"),
        (lambda w, a, b, c: w.add_edge(a, b).add_fan_in_edges([a, b], c).add_edge(a, c), "a->c"),
        (lambda w, a, b, c: w.add_edge(a, b).add_fan_in_edges([b, b], c), "b->c"),
    ],
)
def test_an_edge_repeated_inside_or_across_edge_groups_is_an_edge_duplication(make, edge_id):
    a, b, c = Upper("a"), Upper("b"), Joiner("c")

    with pytest.raises(EdgeDuplicationError) as caught:
        make(WorkflowBuilder(start_executor=a), a, b, c).build()

    assert caught.value.edge_id == edge_id


def test_two_executors_with_one_id_are_an_executor_duplication_and_a_value_error():
    with pytest.raises(ValueError, match="two different executors share the id 'dup'") as caught:
        WorkflowBuilder(start_executor=Upper("dup")).add_edge("dup", Double("dup"))

    assert isinstance(caught.value, WorkflowValidationError)
    assert caught.value.validation_type is ValidationTypeEnum.EXECUTOR_DUPLICATION


# -- TYPE_COMPATIBILITY ----------------------------------------------------------------------


def test_an_edge_whose_target_takes_none_of_the_sent_types_is_a_type_compatibility_error():
    source, target = Upper("string_executor"), Double("int_executor")

    with pytest.raises(TypeCompatibilityError) as caught:
        WorkflowBuilder(start_executor=source).add_edge(source, target).build()

    error = caught.value
    assert (error.source_executor_id, error.target_executor_id) == (
        "string_executor",
        "int_executor",
    )
    assert (error.source_types, error.target_types) == ([str], [int])
    assert error.validation_type is ValidationTypeEnum.TYPE_COMPATIBILITY
    assert "add a handler for it to 'int_executor'" in str(error)


@pytest.mark.parametrize(
    ("source", "target", "words"),
    [
        (Silent("s"), Upper("t"), "declares that it sends nothing"),
        (Upper("s"), Upper("t"), "delivers a list"),
    ],
)
def test_an_edge_that_can_never_deliver_is_a_type_compatibility_error(source, target, words):
    start = Upper("start")
    builder = WorkflowBuilder(start_executor=start).add_edge(start, source)
    if words == "delivers a list":
        builder.add_edge(start, Upper("other")).add_fan_in_edges([source, "other"], target)
    else:
        builder.add_edge(source, target)

    with pytest.raises(TypeCompatibilityError, match=words) as caught:
        builder.build()

    assert caught.value.target_executor_id == "t"


def test_a_handler_no_incoming_edge_feeds_is_a_type_compatibility_error():
    class TwoHandlers(Executor):
        @handler
        async def texts(self, text: str, ctx: WorkflowContext[str]) -> None: ...

        @handler
        async def numbers(self, n: int, ctx: WorkflowContext[int]) -> None: ...

    start = Upper("a")
    with pytest.raises(WorkflowValidationError, match="can never receive a message") as caught:
        WorkflowBuilder(start_executor=start).add_edge(start, TwoHandlers("b")).build()

    assert caught.value.validation_type is ValidationTypeEnum.TYPE_COMPATIBILITY


def test_handlers_that_are_alternatives_need_not_each_be_fed():
    class Either(Executor):
        handlers_are_alternatives = True

        @handler
        async def texts(self, text: str, ctx: WorkflowContext[str]) -> None: ...

        @handler
        async def numbers(self, n: int, ctx: WorkflowContext[int]) -> None: ...

    class Fractions(Executor):
        @handler
        async def run(self, text: str, ctx: WorkflowContext[float]) -> None: ...

    start = Upper("a")
    WorkflowBuilder(start_executor=start).add_edge(start, Either("b")).build()
    start = Fractions("a")
    with pytest.raises(TypeCompatibilityError):  # what an edge carries still needs a handler
        WorkflowBuilder(start_executor=start).add_edge(start, Either("b")).build()


@pytest.mark.parametrize("target", [Anything("t"), Undeclared("t")])
def test_targets_taking_anything_and_sources_that_declare_nothing_pass(target):
    for source in (Upper("s"), Undeclared("s")):
        WorkflowBuilder(start_executor=source).add_edge(source, target).build()


def test_a_fan_in_of_sources_feeding_a_list_handler_passes():
    start, one, two, join = Upper("start"), Upper("one"), Upper("two"), Joiner("join")
    (
        WorkflowBuilder(start_executor=start)
        .add_fan_out_edges(start, [one, two])
        .add_fan_in_edges([one, two], join)
        .build()
    )


# -- GRAPH_CONNECTIVITY ----------------------------------------------------------------------


def test_an_executor_no_edge_from_the_start_reaches_is_a_graph_connectivity_error():
    one, two, three = Upper("executor1"), Upper("executor2"), Upper("executor3")

    with pytest.raises(GraphConnectivityError) as caught:
        WorkflowBuilder(start_executor=one).add_edge(one, two).add_edge(three, two).build()

    text = str(caught.value)
    assert "unreachable" in text
    assert "['executor3']" in text
    assert "Add an edge to each from an executor that is reached" in text
    assert caught.value.validation_type is ValidationTypeEnum.GRAPH_CONNECTIVITY


def test_an_executor_added_without_edges_is_unreachable():
    start = Upper("a")
    builder = WorkflowBuilder(start_executor=start).add_edge(start, Upper("b"))

    with pytest.raises(GraphConnectivityError, match=r"\['lonely'\] are unreachable"):
        builder.add_executor(Upper("lonely")).build()


def test_a_start_executor_without_outgoing_edges_is_named_as_the_cause():
    one, two = Upper("one"), Upper("two")

    with pytest.raises(GraphConnectivityError, match="start executor 'two' has no outgoing edge"):
        WorkflowBuilder(start_executor=one).add_edge(one, two).set_start_executor(two).build()


def test_an_unknown_executor_id_is_a_graph_connectivity_error():
    with pytest.raises(GraphConnectivityError, match="unknown executor 'ghost'"):
        WorkflowBuilder(start_executor=Upper("a")).add_edge("a", "ghost")


def test_a_lone_start_executor_loops_and_cycles_are_connected():
    WorkflowBuilder(start_executor=Upper("alone")).build()
    a, b, c = Upper("a"), Upper("b"), Upper("c")
    WorkflowBuilder(start_executor=a).add_edge(a, b).add_edge(b, c).add_edge(c, a).build()
    WorkflowBuilder(start_executor=a).add_edge(a, a).build()


# -- EDGE_GROUP (steplog's category for edge groups of the wrong shape) ----------------------


@pytest.mark.parametrize(
    ("cases", "words"),
    [
        ([Case(lambda n: n > 0, "b")], "needs a Default as its last entry"),
        ([Default("c"), Case(lambda n: n > 0, "b")], "as its last entry"),
        ([Case(lambda n: n > 0, "b"), Default("c"), Default("b")], "takes one Default"),
        ([Default("c")], "needs at least one Case"),
        ([Case(lambda n: n > 0, "b"), "c"], "must be Case or Default"),
    ],
)
def test_a_switch_case_needs_cases_and_one_last_default(cases, words):
    a, b, c = Double("a"), Double("b"), Double("c")
    builder = WorkflowBuilder(start_executor=a).add_executor(b).add_executor(c)

    with pytest.raises(WorkflowValidationError, match=words) as caught:
        builder.add_switch_case_edge_group(a, cases)

    assert caught.value.validation_type is ValidationTypeEnum.EDGE_GROUP


def test_a_switch_case_with_cases_and_a_last_default_builds(store_url):
    a, b, c = Double("a"), Double("b"), Double("c")
    WorkflowBuilder(start_executor=a, store=open_store(store_url)).add_switch_case_edge_group(
        a, [Case(lambda n: n > 0, b), Case(lambda n: n > 9, b), Default(c)]
    ).build()


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda w, a: w.add_chain([a]), "a chain needs at least two executors"),
        (lambda w, a: w.add_fan_out_edges(a, []), "fan-out targets must not be empty"),
        (lambda w, a: w.add_fan_in_edges([], a), "fan-in sources must not be empty"),
    ],
)
def test_empty_edge_groups_are_edge_group_errors(make, words):
    a = Upper("a")

    with pytest.raises(WorkflowValidationError, match=words) as caught:
        make(WorkflowBuilder(start_executor=a), a)

    assert caught.value.validation_type is ValidationTypeEnum.EDGE_GROUP


# -- OUTPUT_VALIDATION -----------------------------------------------------------------------


class Yields(Executor):
    @handler
    async def run(self, text: str, ctx: WorkflowContext[str, str]) -> None:
        await ctx.yield_output(text)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"output_from": ["ghost"]}, "output executor 'ghost' is not in the workflow graph"),
        ({"output_from": ["a"], "intermediate_output_from": ["a"]}, "both as output"),
        ({"output_from": ["a", "a"]}, r"names \['a'\] more than once"),
        ({"output_from": [], "intermediate_output_from": []}, "names no executor"),
        ({"output_from": ["b"]}, "declares that it yields no workflow outputs"),
    ],
)
def test_an_output_designation_that_cannot_hold_is_an_output_validation_error(options, words):
    a, b = Yields("a"), Upper("b")
    builder = WorkflowBuilder(start_executor=a, **options).add_edge(a, b)

    with pytest.raises(WorkflowValidationError, match=words) as caught:
        builder.build()

    assert caught.value.validation_type is ValidationTypeEnum.OUTPUT_VALIDATION


def test_a_multi_selection_edge_repeated_is_an_edge_duplication():
    a, b = Upper("a"), Upper("b")
    with pytest.raises(EdgeDuplicationError) as caught:
        WorkflowBuilder(start_executor=a).add_multi_selection_edge_group(a, [b, b], lambda m, t: t)
    assert caught.value.edge_id == "a->b"

    builder = WorkflowBuilder(start_executor=a).add_edge(a, b)
    with pytest.raises(EdgeDuplicationError, match="duplicate edge a->b"):
        builder.add_multi_selection_edge_group(a, [b], lambda m, t: t)
