"""What a built workflow is, read from its graph: its executors, the output designation, and the
definition as a dict in Agent Framework's shape (``to_dict``, ``to_json``).

``DefinitionView`` is a base of ``Workflow``: it only reads ``graph`` and the few settings below,
and writes nothing anywhere.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kernel._define._graph import FanIn, FanOut, Graph, MultiSelection, Single, SwitchCase

if TYPE_CHECKING:
    from kernel._define._executor import Executor
    from kernel._define._graph import EdgeGroup

__all__ = ["DefinitionView", "callable_name", "group_kind"]


class DefinitionView:
    """Read-only accessors of a workflow's definition, named as Agent Framework names them."""

    graph: Graph

    if TYPE_CHECKING:

        @property
        def name(self) -> str: ...
        @property
        def instance_id(self) -> str: ...
        @property
        def max_supersteps(self) -> int: ...

    @property
    def description(self) -> str | None:
        """The builder's ``description=``, if one was given."""
        return self.graph.description

    @property
    def max_iterations(self) -> int:
        """Agent Framework's name for ``max_supersteps``."""
        return self.max_supersteps

    @property
    def executors(self) -> dict[str, Executor]:
        """The workflow's executors by id, in the order they were added (a copy)."""
        return dict(self.graph.executors)

    @property
    def start_executor_id(self) -> str:
        return self.graph.start

    def get_start_executor(self) -> Executor:
        """The executor that receives a run's input message."""
        return self.graph.executors[self.graph.start]

    def get_executors_list(self) -> list[Executor]:
        """The workflow's executors, in the order they were added."""
        return list(self.graph.executors.values())

    @property
    def input_types(self) -> list[Any]:
        """The message types a run's input may have: the start executor's ``input_types``."""
        return self.get_start_executor().input_types

    @property
    def output_types(self) -> list[Any]:
        """The types of the workflow's outputs: the ``workflow_output_types`` of the executors
        whose yields are outputs (``get_output_executors()``), in order, without duplicates."""
        found: list[Any] = []
        for executor in self.get_output_executors():
            found.extend(t for t in executor.workflow_output_types if t not in found)
        return found

    def get_output_executors(self) -> list[Executor]:
        """The executors whose yields are workflow outputs: every executor unless
        ``output_from=`` (or ``intermediate_output_from=``) was given."""
        return [e for i, e in self.graph.executors.items() if self.is_terminal_executor(i)]

    def get_intermediate_executors(self) -> list[Executor]:
        """The executors whose yields are intermediate outputs."""
        return [e for i, e in self.graph.executors.items() if self.is_intermediate_executor(i)]

    def is_terminal_executor(self, executor_id: str) -> bool:
        """Whether ``executor_id``'s yields reach the caller as workflow outputs."""
        return self.graph.outputs.classify(executor_id) == "output"

    def is_intermediate_executor(self, executor_id: str) -> bool:
        """Whether ``executor_id``'s yields reach the caller as intermediate outputs."""
        return self.graph.outputs.classify(executor_id) == "intermediate"

    def to_dict(self) -> dict[str, Any]:
        """The definition as plain data, in Agent Framework's shape: ``name``, ``id`` (the
        instance id), ``start_executor_id``, ``max_iterations``, ``edge_groups`` (each with its
        ``id``, its ``type`` and its ``edges``; conditions and selection functions by name),
        ``executors`` (id and class name; a nested workflow's definition under ``workflow``),
        ``output_executors`` and ``intermediate_executors`` (None unless designated), and
        ``description`` when there is one. Edge group ids are ``Type/index``, stable across
        builds of the same graph."""
        graph = self.graph
        designated = graph.outputs.outputs
        data: dict[str, Any] = {
            "name": self.name,
            "id": self.instance_id,
            "start_executor_id": graph.start,
            "max_iterations": self.max_supersteps,
            "edge_groups": [_group_dict(g, i) for i, g in enumerate(graph.groups)],
            "executors": {i: _executor_dict(e) for i, e in graph.executors.items()},
            "output_executors": None if designated is None else sorted(designated),
            "intermediate_executors": (
                None if designated is None else sorted(graph.outputs.intermediates)
            ),
        }
        if graph.description is not None:
            data["description"] = graph.description
        return data

    def to_json(self) -> str:
        """``to_dict()`` as JSON text."""
        return json.dumps(self.to_dict())


def callable_name(func: Callable[..., Any] | None) -> str | None:
    """How a condition or selection function is named in a definition: its ``__name__``
    (``"<lambda>"`` for a lambda), ``"<callable>"`` for an object without one."""
    if func is None:
        return None
    name = getattr(func, "__name__", None)
    return name if isinstance(name, str) else "<callable>"


def group_kind(group: EdgeGroup) -> str:
    """Agent Framework's class name for an edge group (a multi-selection group is its fan-out
    group with a selection function)."""
    if isinstance(group, Single):
        return "SingleEdgeGroup"
    if isinstance(group, FanOut | MultiSelection):
        return "FanOutEdgeGroup"
    if isinstance(group, FanIn):
        return "FanInEdgeGroup"
    return "SwitchCaseEdgeGroup"


def _group_dict(group: EdgeGroup, index: int) -> dict[str, Any]:
    kind = group_kind(group)
    edges: list[dict[str, Any]] = []
    for source in group.sources:
        for target in dict.fromkeys(group.targets):
            edge: dict[str, Any] = {"source_id": source, "target_id": target}
            if isinstance(group, Single) and group.condition is not None:
                edge["condition_name"] = callable_name(group.condition)
            edges.append(edge)
    data: dict[str, Any] = {"id": f"{kind}/{index}", "type": kind, "edges": edges}
    if isinstance(group, FanOut | SwitchCase):
        data["selection_func_name"] = None
    elif isinstance(group, MultiSelection):
        data["selection_func_name"] = callable_name(group.selection)
    if isinstance(group, SwitchCase):
        cases: list[dict[str, Any]] = [
            {"target_id": target, "type": "Case", "condition_name": callable_name(condition)}
            for condition, target in group.cases
        ]
        if group.default is not None:
            cases.append({"target_id": group.default, "type": "Default"})
        data["cases"] = cases
    return data


def _executor_dict(executor: Executor) -> dict[str, Any]:
    data: dict[str, Any] = {"id": executor.id, "type": type(executor).__name__}
    inner = getattr(executor, "workflow", None)
    if isinstance(inner, DefinitionView):  # an executor that runs a workflow
        data["workflow"] = inner.to_dict()
    return data
