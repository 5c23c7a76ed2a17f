"""Instance settings: built once by the builder, handed whole to every workflow derived from it."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kernel import (
    DefinitionError,
    Executor,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    counter_ids,
    handler,
    open_store,
)
from kernel._ops._settings import InstanceSettings
from kernel._run._instance import LeasePolicy


class Echo(Executor):
    @handler
    async def echo(self, text: str, ctx: WorkflowContext[str, str]) -> None:
        ctx.set_state("last", text)
        await ctx.yield_output(text)


def build(store: Any, instance_id: str = "a") -> Workflow:
    return (
        WorkflowBuilder(
            start_executor=Echo("echo"),
            store=store,
            instance_id=instance_id,
            name="echoes",
            max_supersteps=7,
            durability="write",
            id_factory=counter_ids("id"),
        )
        .with_lease(ttl=9.0, wait=1.0)
        .with_sensitive_keys("last")
        .build()
    )


def test_the_builder_hands_over_one_frozen_settings_object() -> None:
    wf = build(open_store("memory://"))
    settings = wf.settings
    assert (settings.instance_id, settings.name, settings.max_supersteps) == ("a", "echoes", 7)
    assert settings.durability == "write"
    assert settings.lease == LeasePolicy(9.0, 1.0)
    assert settings.sensitive_keys == ("last",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.name = "other"  # type: ignore[misc]
    assert wf.name == "echoes"
    assert wf.max_supersteps == 7
    assert wf.sensitive_keys == ("last",)


async def test_a_fork_is_bound_with_the_same_settings_on_its_own_instance() -> None:
    store = open_store("memory://")
    wf = build(store)
    await wf.run("hello")
    fork = wf.fork(at=wf.events()[-1].position, instance_id="b")
    assert fork.settings == wf.settings.for_instance("b")
    assert fork.settings.replace(instance_id="a") == wf.settings
    await fork.run("again")
    started = [e for e in fork.events() if e.type == "run_started"]
    assert started[-1].sensitive_keys == ["last"]  # type: ignore[attr-defined]


def test_a_child_keeps_its_workflows_definition_and_takes_the_rest_from_its_parent() -> None:
    parent = build(open_store("memory://"), "p").settings
    inner = InstanceSettings(
        instance_id="inner",
        name="inner-flow",
        max_supersteps=3,
        durability="superstep",
        clock=parent.clock,
        id_factory=counter_ids("inner"),
        sensitive_keys=("token",),
    )
    child = inner.for_child("p/x/1", parent=parent)
    assert child.instance_id == "p/x/1"
    assert (child.name, child.max_supersteps, child.sensitive_keys) == ("inner-flow", 3, ("token",))
    assert child.durability == parent.durability == "write"
    assert child.lease == parent.lease
    assert child.id_factory is parent.id_factory


def test_the_keyword_form_of_the_constructor_still_binds_a_workflow() -> None:
    wf = build(open_store("memory://"))
    same = Workflow(
        wf.graph,
        store=wf.store,
        instance_id="a",
        name="echoes",
        max_supersteps=7,
        durability="write",
        clock=wf.settings.clock,
        id_factory=wf.settings.id_factory,
        lease=LeasePolicy(9.0, 1.0),
        sensitive_keys=("last",),
    )
    assert same.settings == wf.settings
    with pytest.raises(TypeError, match="not both"):
        Workflow(wf.graph, store=wf.store, settings=wf.settings, name="x")
    with pytest.raises(DefinitionError, match="instance_id"):
        wf.settings.for_instance("")


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"durability": "bogus"}, "durability must be"),
        ({"name": None}, "workflow name"),
        ({"name": "\ud800"}, "workflow name"),
        ({"max_supersteps": "x"}, "max_supersteps"),
        ({"max_supersteps": -5}, "max_supersteps"),
        ({"max_supersteps": True}, "max_supersteps"),
        ({"clock": None}, "clock must be a callable"),
        ({"id_factory": None}, "id_factory must be a callable"),
        ({"hooks": None}, "hooks must be a tuple"),
        ({"hooks": (object(),)}, "RunHooks"),
        ({"sensitive_keys": "secret"}, "sensitive_keys must be a tuple"),
        ({"sensitive_keys": ("",)}, "sensitive key pattern"),
        ({"lease": (1, 2)}, "lease must be a LeasePolicy"),
        ({"instance_id": ""}, "instance_id"),
    ],
    ids=lambda value: next(iter(value)) if isinstance(value, dict) else None,
)
async def test_a_setting_the_log_could_not_hold_is_refused_before_anything_is_written(
    change: dict[str, Any], says: str
) -> None:
    """Issue 22 review: ``Workflow(settings=wf.settings.replace(durability="bogus"))`` ran, and
    its ``RunStarted`` could never be read back. Every field is checked where the settings are
    made, however a workflow is bound."""
    with open_store("memory://") as store:
        settings = build(store).settings
        with pytest.raises(DefinitionError, match=says):
            settings.replace(**{"instance_id": "other", **change})
        assert store.read("other") == []


@pytest.mark.parametrize(("ttl", "wait"), [(0, 0), (-1, 0), (float("inf"), 0), (1, -1), (True, 0)])
def test_a_lease_policy_checks_its_numbers(ttl: Any, wait: Any) -> None:
    with pytest.raises(DefinitionError, match="lease"):
        LeasePolicy(ttl, wait)
    assert LeasePolicy(7, 1) == LeasePolicy(7.0, 1.0)
