"""``@step(record_arguments=True)``: a call's bound arguments are recorded beside its result
(``StepRecorded.arguments``), through the codec, encrypted at rest like the rest of the row, and
redacted by the step's name; off by default; a served call records none; arguments the codec
cannot store stop the call before it runs, recorded as its error."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest

from kernel import (
    DefinitionError,
    EncodingError,
    ErrorInfo,
    EventStore,
    Executor,
    Keyring,
    StepRecorded,
    ValueCodec,
    WorkflowBuilder,
    WorkflowContext,
    handler,
    open_store,
    step,
)
from kernel.testing import LogBuilder
from projections import REDACTED, SensitiveKeys

SECRET = "zq7-SECRET-card-4111"


class Opaque:
    """A value the codec cannot store."""


@step(record_arguments=True)
async def charge(card: str, amount: int = 5, *, ctx: Any = None) -> str:
    return f"charged {amount} to {card}"


@step
async def quiet(card: str) -> str:
    return "ok"


ran: list[str] = []


@step(record_arguments=True, replay_key=lambda thing: "the-one")
async def opaque(thing: Any) -> str:
    ran.append("opaque")
    return "never"


class Till(Executor):
    """Charges the card it is given (recorded with its arguments), then checks it quietly;
    with ``opaque`` it calls a step with an argument the codec cannot store; ``hold`` makes it
    wait after charging (a test cancels it there)."""

    hold: asyncio.Event | None = None
    reached: asyncio.Event

    @handler
    async def take(self, order: dict[str, str], ctx: WorkflowContext[str, str]) -> None:
        if order.get("opaque"):
            await opaque(Opaque())
        await charge(order["card"])
        await quiet(order["card"])
        if self.hold is not None:
            self.reached.set()
            await self.hold.wait()
        await ctx.yield_output("done")


def till(store: EventStore, executor: Till | None = None) -> Any:
    return WorkflowBuilder(
        start_executor=executor or Till(id="till"), store=store, instance_id="till"
    ).build()


def recorded(store: EventStore) -> list[StepRecorded]:
    return [e for e in store.read("till") if isinstance(e, StepRecorded)]


def test_the_option_must_be_a_bool() -> None:
    with pytest.raises(DefinitionError, match="record_arguments must be True or False"):
        step(record_arguments="yes")(charge.__wrapped__)  # type: ignore[call-overload]


async def test_an_opted_in_step_records_its_bound_arguments_and_others_only_a_digest(
    store: EventStore,
) -> None:
    await till(store).run({"card": SECRET})
    first, second = recorded(store)
    assert (first.name, first.arguments) == ("charge", {"card": SECRET, "amount": 5})  # no ctx
    assert first.digest is not None  # the digest stays its identity
    assert (second.name, second.arguments, second.digest is not None) == ("quiet", None, True)


async def test_a_served_call_records_no_arguments(store: EventStore) -> None:
    executor = Till(id="till")
    executor.hold, executor.reached = asyncio.Event(), asyncio.Event()
    workflow = till(store, executor)
    running = asyncio.ensure_future(workflow.run({"card": SECRET}))
    await executor.reached.wait()
    running.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await running
    executor.hold.set()
    await workflow.resume()
    charges = [e for e in recorded(store) if e.name == "charge"]
    assert [(e.reused is not None, e.arguments is not None) for e in charges] == [
        (False, True),
        (True, False),
    ]


async def test_arguments_the_codec_cannot_store_stop_the_call_before_it_runs(
    store: EventStore,
) -> None:
    ran.clear()
    with pytest.raises(EncodingError, match=r"the arguments of step 'opaque'\['thing'\]"):
        await till(store).run({"card": SECRET, "opaque": "yes"})  # as an unstorable result
    assert ran == []  # never ran
    (record,) = recorded(store)
    assert (record.name, record.arguments, record.result) == ("opaque", None, None)
    assert record.error is not None
    assert record.error.type == "kernel.EncodingError"
    assert "the arguments of step 'opaque'" in record.error.message
    assert "Opaque" in record.error.message


async def test_outside_a_run_nothing_is_encoded() -> None:
    assert await opaque(Opaque()) == "never"  # a plain function: nothing to record
    with pytest.raises(EncodingError):  # (the same value, recorded, is refused)
        ValueCodec().encode({"thing": Opaque()}, what="x")


def test_recorded_arguments_are_encrypted_at_rest(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'keyed.db'}"
    keys = Keyring.from_text(Keyring.generate())
    with open_store(url, keyring=keys) as store:
        asyncio.run(till(store).run({"card": SECRET}))
        assert recorded(store)[0].arguments == {"card": SECRET, "amount": 5}  # read back
    assert not any(SECRET.encode() in path.read_bytes() for path in tmp_path.iterdir())


def test_recorded_arguments_are_redacted_by_the_steps_name() -> None:
    log = LogBuilder("till")
    log.start_run("x")
    log.start_superstep()
    log.invoke("till")
    record = log.record_step("charge", "charged", arguments={"card": SECRET})
    failed = log.record_step(
        "charge", error=ErrorInfo(type="ValueError", message="no"), arguments={"card": SECRET}
    )
    assert record.arguments == {"card": SECRET}
    rule = SensitiveKeys(["char*"])
    hidden = rule.event(record)
    assert (hidden.arguments, hidden.result) == (dict(REDACTED), dict(REDACTED))
    assert rule.event(failed).arguments == dict(REDACTED)
    assert rule.event(failed).error == failed.error
    assert SensitiveKeys(["other"]).event(record) is record
