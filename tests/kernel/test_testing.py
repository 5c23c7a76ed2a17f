"""``kernel.testing.LogBuilder``: the logs it builds are the logs the runner writes, they decode
and fold as the runner's do, and it builds the disorderly logs that tests need."""

from __future__ import annotations

import ast
import asyncio
import itertools
import textwrap
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

import kernel.testing
from kernel import (
    EventStore,
    Executor,
    MemoryStore,
    RunStarted,
    StepLogError,
    ValueCodec,
    WorkflowBuilder,
    WorkflowContext,
    counter_ids,
    fold_committed,
    handler,
)
from kernel.testing import LogBuilder, LogBuilderError, ticking_clock

OUTAGE = ConnectionError("payment provider timed out")


class Checkout(Executor):
    @handler
    async def charge(self, order_id: str, ctx: WorkflowContext[str, str]) -> None:
        ctx.set_state("token", f"tok-{order_id}")
        if order_id == "bad":
            raise OUTAGE
        await ctx.send_message(f"{order_id}!")
        await ctx.yield_output(f"charged {order_id}")


class Ship(Executor):
    @handler
    async def ship(self, parcel: str, ctx: WorkflowContext[str]) -> None:
        ctx.set_state("shipped", parcel)


def checkout_flow(store: EventStore, **options: object) -> WorkflowBuilder:
    checkout, ship = Checkout(id="checkout"), Ship(id="ship")
    return WorkflowBuilder(
        start_executor=checkout, store=store, instance_id="orders-42", **options
    ).add_edge(checkout, ship)


def a_good_run(log: LogBuilder, order_id: str, owner: str, run_id: str | None = None) -> None:
    """What the runner appends for a run of ``checkout_flow`` that succeeds."""
    log.start_run(order_id, workflow_name="checkout", owner=owner, run_id=run_id)
    log.start_superstep()
    log.invoke("checkout")
    log.write("token", f"tok-{order_id}")
    log.send(f"{order_id}!", targets=["ship"])
    log.output(f"charged {order_id}")
    log.complete()
    log.commit()
    log.start_superstep()
    log.invoke("ship")
    log.write("shipped", f"{order_id}!")
    log.complete()
    log.commit()
    log.complete_run()


def a_failed_run_then_a_good_one(log: LogBuilder, owner: str) -> LogBuilder:
    """What the runner appends for ``checkout_flow`` run with "bad", then with "A-1"."""
    log.start_run("bad", workflow_name="checkout", owner=owner)
    log.start_superstep()
    log.invoke("checkout")
    log.write("token", "tok-bad")
    log.fail(error=OUTAGE)
    log.abort("failed", error=OUTAGE)
    log.fail_run(OUTAGE, executor_id="checkout")
    a_good_run(log, "A-1", owner)
    return log


async def test_a_log_built_like_a_run_is_the_log_the_runner_writes(store: EventStore) -> None:
    wf = checkout_flow(store, clock=ticking_clock(), id_factory=counter_ids()).build()
    await asyncio.gather(wf.run("bad"), return_exceptions=True)
    await wf.run("A-1")
    ran = wf.events()
    owner = ran[0].owner if isinstance(ran[0], RunStarted) else ""

    log = LogBuilder("orders-42", clock=ticking_clock(), ids=counter_ids())
    assert a_failed_run_then_a_good_one(log, owner).events() == ran
    # Appended and read back, a built log decodes to itself and folds as the run's log does.
    copy = LogBuilder("copy", clock=ticking_clock(), ids=counter_ids())
    a_failed_run_then_a_good_one(copy, owner).append_to(store)
    read = store.read("copy")
    assert read == copy.events()
    assert fold_committed(read).values == fold_committed(ran).values
    assert fold_committed(read).values == {"token": "tok-A-1", "shipped": "A-1!"}


def interrupted(log: LogBuilder) -> None:
    """A run whose process went away in its second superstep: no marker, no run end."""
    log.start_run("A-0", workflow_name="checkout", owner="elsewhere:1")
    log.start_superstep()
    log.invoke("checkout")
    log.write("token", "tok-A-0")
    log.complete()
    log.commit()
    log.start_superstep()
    log.invoke("ship")
    log.write("shipped", "A-0!")


async def test_the_runner_takes_a_built_log_as_its_own_history(store: EventStore) -> None:
    clock, ids = ticking_clock(), counter_ids()
    log = LogBuilder("orders-42", clock=clock, ids=ids)
    interrupted(log)
    log.append_to(store)
    wf = checkout_flow(store, clock=clock, id_factory=ids).build()
    await wf.run("A-1")  # closes the interrupted run first, as abandoned (another host's)
    ran = wf.events()

    expected_ids = counter_ids()
    expected = LogBuilder("orders-42", clock=ticking_clock(), ids=expected_ids)
    interrupted(expected)
    next_run = expected_ids()
    expected.abort("abandoned")
    expected.abandon_run("abandoned", closed_by=next_run)
    owner = ran[len(log.events()) + 2]
    assert isinstance(owner, RunStarted)
    a_good_run(expected, "A-1", owner.owner, run_id=next_run)
    assert ran == expected.events()
    assert wf.committed_state() == {"token": "tok-A-1", "shipped": "A-1!"}


def test_it_builds_the_disorderly_logs_tests_need() -> None:
    log = LogBuilder("i", clock=ticking_clock(), ids=counter_ids())
    first = log.start_run().run_id
    s1 = log.start_superstep().superstep_id
    log.invoke("e")
    log.write("k", 1)
    log.commit()
    late = log.write("k", 2, superstep=s1)  # a write after its superstep's marker
    again = log.abort("failed", superstep=s1)  # a second marker
    second = log.start_run().run_id  # interleaved: the first run is still open
    s2 = log.start_superstep().superstep_id
    log.write("k", 3, executor_id="e")
    s3 = log.start_superstep(run=first).superstep_id
    log.write("j", 4, executor_id="e")
    log.commit(superstep=s2)
    log.complete_run(run=second)
    log.complete_run(run=first)
    after_end = log.commit(superstep=s3)  # a marker after its run ended
    gone = log.write("g", 5, executor_id="e", superstep="never-started", run=first)

    assert (late.run_id, late.superstep_id, late.position) == (first, s1, 6)
    assert (again.run_id, again.superstep_id) == (first, s1)
    assert (after_end.run_id, after_end.superstep_id) == (first, s3)
    assert (gone.run_id, gone.superstep_id) == (first, "never-started")
    assert [e.position for e in log.events()] == list(range(1, 18))
    # The kernel's rule: the late write, the second marker and the marker after the run's end
    # change nothing.
    assert fold_committed(log.events()).values == {"k": 3}


def test_run_ends_name_the_superstep_that_did_not_commit() -> None:
    log = LogBuilder("i", clock=ticking_clock(), ids=counter_ids())
    first = log.start_run().run_id
    log.start_superstep()
    log.commit()
    assert log.fail_run(RuntimeError("limit")).superstep_id is None  # between supersteps
    log.start_run()
    sid = log.start_superstep().superstep_id
    assert log.cancel_run().superstep_id == sid  # in flight
    assert log.complete_run(run=first).supersteps == 1


def test_batches_end_where_flushed_and_append_in_order() -> None:
    store = MemoryStore()
    log = LogBuilder("i", clock=ticking_clock(), ids=counter_ids())
    log.start_run()
    log.flush()
    log.flush()  # an empty batch is never made
    log.start_superstep()
    log.invoke("e")
    assert [[e.position for e in b] for b in log.batches()] == [[1], [2, 3]]
    positions = log.append_to(store)
    assert positions == [r.global_position for r in store.read_all()]
    assert positions == sorted(set(positions))
    assert [e.position for e in store.read("i")] == [1, 2, 3]
    log.write("k", 1)
    assert len(log.append_to(store)) == 1  # only what was not appended yet
    assert [e.position for e in store.read("i")] == [1, 2, 3, 4]
    assert store.read("i") == log.events()
    assert store.version("i") == log.version == 4

    more = LogBuilder("i", clock=ticking_clock(), version=store.version("i"))
    more.commit(superstep="id-2", run="id-1")
    more.append_to(store)
    assert fold_committed(store.read("i")).values == {"k": 1}


def test_drain_forgets_what_was_built_and_carries_on() -> None:
    log = LogBuilder("i", clock=ticking_clock(), ids=counter_ids())
    log.start_run()
    log.start_superstep()
    assert [len(b) for b in log.drain()] == [2]
    assert log.events() == []
    log.invoke("e")
    assert [(e.position, e.superstep_id) for e in log.events()] == [(3, "id-2")]  # type: ignore[attr-defined]


def test_unvalidated_events_equal_validated_ones_and_round_trip() -> None:
    def build(validate: bool) -> LogBuilder:
        log = LogBuilder("i", clock=ticking_clock(), ids=counter_ids(), validate=validate)
        log.start_run({"n": 1}, kwargs={"mode": "fast"})
        log.start_superstep()
        log.invoke("e")
        log.write("k", [1, {"x": None}])
        log.delete("gone")
        log.send("m", target="f")
        log.fail(error=ValueError("bad"))
        log.abort(error=ValueError("bad"))
        log.fail_run(ValueError("bad"), executor_id="e")
        return log

    fast, checked = build(False).events(), build(True).events()
    assert [e.model_dump() for e in fast] == [e.model_dump() for e in checked]
    assert fast == checked
    store = MemoryStore()
    store.append("i", fast, expected_version=0)
    assert store.read("i") == checked


def test_a_codec_encodes_python_values() -> None:
    codec = ValueCodec()
    log = LogBuilder("i", clock=ticking_clock(), ids=counter_ids(), codec=codec)
    started = log.start_run(("a", 1), kwargs={"budget": Decimal("1.50")})
    log.start_superstep()
    staged = log.write("due", datetime(2025, 3, 1, tzinfo=UTC), executor_id="e")
    assert codec.decode(started.input) == ("a", 1)
    assert codec.decode(started.kwargs["budget"]) == Decimal("1.50")
    assert codec.decode(staged.value) == datetime(2025, 3, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("call", "names"),
    [
        (lambda log: log.start_superstep(), "no run is open"),
        (lambda log: log.write("k", 1, executor_id="e"), "no superstep is open"),
        (lambda log: log.commit(superstep="ghost"), "'ghost' was never started"),
        (lambda log: log.complete_run(), "no run is open"),
    ],
)
def test_a_call_with_nothing_to_belong_to_is_refused(call, names) -> None:
    log = LogBuilder("i", clock=ticking_clock())
    with pytest.raises(LogBuilderError, match=names):
        call(log)
    assert log.events() == []


def test_wrong_calls_are_errors_of_the_library_tree() -> None:
    log = LogBuilder("i", clock=ticking_clock(), ids=counter_ids())
    log.start_run()
    sid = log.start_superstep().superstep_id
    with pytest.raises(LogBuilderError, match="no executor was invoked"):
        log.write("k", 1)
    with pytest.raises(LogBuilderError, match="belongs to run 'id-1', not 'other'"):
        log.commit(superstep=sid, run="other")
    with pytest.raises(LogBuilderError, match="not a valid StateStaged"):
        log.write(1, 1, executor_id="e")  # type: ignore[arg-type]
    naive = LogBuilder("i", clock=lambda: datetime(2025, 1, 1))
    with pytest.raises(LogBuilderError, match="naive datetime"):
        naive.start_run()
    assert issubclass(LogBuilderError, StepLogError)


def test_a_refused_call_leaves_no_gap_in_positions() -> None:
    log = LogBuilder("i", clock=ticking_clock(), ids=counter_ids())
    log.start_run()
    with pytest.raises(LogBuilderError):
        log.start_run(durability="bogus")  # type: ignore[arg-type]
    assert log.start_superstep().position == 2
    assert [e.position for e in log.events()] == [1, 2]


def test_a_ticking_clock_advances_on_every_reading() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    clock = ticking_clock(start, step=0.5)
    assert [clock(), clock()] == [start + timedelta(seconds=0.5), start + timedelta(seconds=1)]


def test_the_module_exports_what_it_names() -> None:
    assert sorted(kernel.testing.__all__) == ["LogBuilder", "LogBuilderError", "ticking_clock"]
    assert all(hasattr(kernel.testing, name) for name in kernel.testing.__all__)


def test_the_module_docstring_example_runs() -> None:
    doc = kernel.testing.__doc__ or ""
    lines = doc.split("Example::\n", 1)[1].splitlines()
    block = itertools.takewhile(lambda line: not line or line.startswith("    "), lines)
    example = textwrap.dedent("\n".join(block))
    assert "LogBuilder(" in example
    assert "assert fold_committed(" in example
    exec(compile(example, "kernel.testing[example]", "exec"), {})


def _fixtures(path: Path) -> set[str]:
    """The names of the pytest fixtures a module defines (``name=`` if given)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for decorator in node.decorator_list:
            call = decorator if isinstance(decorator, ast.Call) else None
            target = call.func if call is not None else decorator
            if ast.unparse(target).endswith("fixture"):
                renamed = [k.value for k in (call.keywords if call else []) if k.arg == "name"]
                names.add(renamed[0].value if renamed else node.name)  # type: ignore[attr-defined]
    return names


def test_no_test_module_shadows_a_fixture_of_the_shared_conftest() -> None:
    tests = Path(__file__).resolve().parents[1]
    shared = _fixtures(tests / "conftest.py")
    assert "store" in shared
    shadowing = {
        str(path.relative_to(tests)): sorted(_fixtures(path) & shared)
        for path in tests.rglob("*.py")
        if path != tests / "conftest.py" and _fixtures(path) & shared
    }
    assert shadowing == {}
