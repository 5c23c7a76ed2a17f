"""The public surface: ``kernel`` and ``projections`` export exactly their public names, sorted, and
every exported class reports the package as its module (the value codec stores it by that name).

A name added to a package's namespace without a decision (an import left public, a helper without
its underscore) fails here; so does a class that would be stored under its private module."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from enum import Enum

import pytest

import kernel
import projections
from kernel._codec._renamed import FORMER_NAMES
from kernel._codec._valuetypes import value_classes

PACKAGES = [kernel, projections]


def public_names(package: types.ModuleType) -> list[str]:
    """The names a package's namespace offers without an underscore, modules left out
    (``kernel.testing`` is a public module, not a name); lazy names count once loaded."""
    for name in package.__all__:
        getattr(package, name)
    return [
        name
        for name, value in vars(package).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    ]


def ruff_order(name: str) -> tuple[int, str]:
    """``__all__``'s order (ruff's RUF022): constants, then classes, then functions."""
    kind = 0 if name.isupper() else 1 if name[0].isupper() else 2
    return kind, name


def exported_classes(package: types.ModuleType) -> list[tuple[str, type]]:
    return [
        (name, value)
        for name in package.__all__
        if isinstance(value := getattr(package, name), type)
    ]


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)
def test_the_exported_names_are_the_public_names_sorted(package: types.ModuleType) -> None:
    assert package.__all__ == sorted(public_names(package), key=ruff_order)


def test_internals_are_not_exported() -> None:
    assert "ROW_SHIFT" not in kernel.__all__
    assert "Prepared" not in kernel.__all__
    assert not hasattr(kernel, "ROW_SHIFT")
    assert not hasattr(kernel, "Prepared")


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)
def test_every_exported_class_reports_the_package_that_exports_it(
    package: types.ModuleType,
) -> None:
    elsewhere = {
        name: cls.__module__
        for name, cls in exported_classes(package)
        if cls.__module__ != package.__name__
        and not (package is projections and getattr(kernel, name, None) is cls)
    }
    assert elsewhere == {}
    assert len(exported_classes(package)) > 20


@pytest.mark.parametrize(
    "cls",
    [cls for p in PACKAGES for _, cls in exported_classes(p) if dataclasses.is_dataclass(cls)],
    ids=lambda c: c.__qualname__,
)
def test_the_fields_of_an_exported_dataclass_resolve_though_it_reports_the_package(
    cls: type,
) -> None:
    """``typing.get_type_hints`` (which the value codec uses to find the classes inside a stored
    class) looks names up in ``__module__``: they were resolved where the class is written."""
    hints = typing.get_type_hints(cls)
    assert set(hints) >= {f.name for f in dataclasses.fields(cls)}


def stored_classes() -> list[type]:
    """The exported kernel classes the value codec can store (enums, models, dataclasses)."""
    return [cls for _, cls in exported_classes(kernel) if value_classes(cls) and cls is not Enum]


@pytest.mark.parametrize("cls", stored_classes(), ids=lambda c: c.__qualname__)
def test_a_stored_public_class_is_named_by_the_package_and_comes_back(cls: type) -> None:
    codec = kernel.ValueCodec()
    codec.register(cls)
    assert codec.registered[f"kernel:{cls.__qualname__}"] is cls


def test_a_value_stored_under_a_former_module_decodes_to_the_same_class() -> None:
    """Issue 22: logs written before the public classes reported ``kernel`` name them by their
    private module (a sub-workflow's request holds a ``kernel._emit:WorkflowEvent``)."""
    codec = kernel.ValueCodec()
    codec.register(kernel.SubWorkflowRequestMessage)
    event = kernel.WorkflowEvent("request_info", "x", run_id="run", request_id="r1")
    request = kernel.SubWorkflowRequestMessage(event, "sub", "bool")
    tree = codec.encode(request)
    written = json.dumps(tree)
    assert '"kernel:WorkflowEvent"' in written
    assert '"kernel:WorkflowEventSource"' in written
    old = json.loads(written.replace('"kernel:WorkflowEvent', '"kernel._emit:WorkflowEvent'))
    assert '"kernel._emit:WorkflowEventSource"' in json.dumps(old)
    back = codec.decode(old)
    assert isinstance(back, kernel.SubWorkflowRequestMessage)
    assert isinstance(back.source_event, kernel.WorkflowEvent)
    assert isinstance(back.source_event.origin, kernel.WorkflowEventSource)
    assert back.source_event.request_id == "r1"


def test_every_former_name_leads_to_a_stored_public_class() -> None:
    stored = {f"kernel:{cls.__qualname__}" for cls in stored_classes()}
    renamed = set(FORMER_NAMES.values())
    assert renamed <= stored
    assert all(not old.startswith("kernel:") for old in FORMER_NAMES)
    # What needs no former name: the classes that reported ``kernel`` before issue 22.
    before = (
        kernel.EventBase,
        kernel.ErrorInfo,
        kernel.SubWorkflowRequestMessage,
        kernel.SubWorkflowResponseMessage,
        kernel.ValidationTypeEnum,
    )
    # exported since issue 22 (StepInfo: issue 23; LoggedCheckpoint: issue 25): never stored
    # under another name
    new = (
        kernel.InstanceSettings,
        kernel.LoggedCheckpoint,
        kernel.RunInfo,
        kernel.StepInfo,
        kernel.SuperstepInfo,
    )
    unchanged = [cls for cls in stored_classes() if f"kernel:{cls.__qualname__}" not in renamed]
    assert [cls for cls in unchanged if not issubclass(cls, before) and cls not in new] == []


@pytest.mark.parametrize(
    ("package", "allowed"),
    [(kernel, {"testing", "agents"}), (projections, {"cli", "ui"})],
    ids=lambda value: getattr(value, "__name__", ""),
)
def test_no_public_attribute_is_a_module_the_package_merely_imported(
    package: types.ModuleType, allowed: set[str]
) -> None:
    """Issue 22 review: ``from kernel import typing`` worked. A package's public attributes are
    its exported names and its public subpackages, never a module it imports for itself."""
    modules = {
        name
        for name, value in vars(package).items()
        if not name.startswith("_") and isinstance(value, types.ModuleType)
    }
    assert modules <= allowed
