"""``InstanceSettings``: what a ``Workflow`` is bound with besides its graph and store, in one.

The builder makes the settings once; every other ``Workflow`` is bound with a copy derived from
another's by one method, never by listing the fields again:

* ``for_instance(instance_id)``: the same workflow on another instance (a fork);
* ``for_child(instance_id, parent=...)``: a sub-workflow's child, run by a parent instance;
* ``replace(...)``: anything else (a rerun's scratch instance takes its own clock and ids).

``WorkflowInstance`` is the ``InstanceContext`` a ``Workflow`` gives its runs: the one place the
settings are handed to the runner's seam, and where a sub-workflow finds its parent's settings.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kernel._base._clock import Clock, IdFactory
from kernel._base._errors import DefinitionError
from kernel._base._ids import check_id
from kernel._define._executor import require_storable
from kernel._run._algo import Router
from kernel._run._hooks import RunHooks, chain_hooks
from kernel._run._instance import Durability, InstanceContext, LeasePolicy
from kernel._run._snapshot import DEFAULT_SNAPSHOT_EVERY
from kernel._store._owner import process_owner

if TYPE_CHECKING:
    from kernel._define._graph import Graph
    from kernel._store._eventstore import EventStore

__all__ = ["DEFAULT_LEASE", "InstanceSettings", "WorkflowInstance", "check_patterns"]

DEFAULT_LEASE = LeasePolicy()
"""The lease policy of a workflow that sets none (``WorkflowBuilder.with_lease``'s defaults)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class InstanceSettings:
    """The settings of one workflow instance: frozen, built once (by ``WorkflowBuilder.build``)
    and handed whole to ``Workflow(graph, store=..., settings=...)``.

    ``instance_id`` is the instance's stream; ``name`` the workflow's name, recorded in each
    ``RunStarted``; ``max_supersteps`` counts across a run's continuations; ``durability`` is
    ``"superstep"`` (one batch per superstep) or ``"write"`` (one append per event); ``clock`` and
    ``id_factory`` stamp and name runs, supersteps and requests; ``lease`` is how runs hold the
    instance's lease; ``sensitive_keys`` the state-key patterns readers redact; ``hooks`` the
    ``RunHooks`` every run of the instance calls, in order (never written to the log);
    ``live_steps`` None (a step call without a record runs), or the names of the only steps whose
    calls without a record may run, any other being refused, never executed (``rerun`` binds its
    scratch instance so; a child takes it from its parent).

    This is the place for a new instance-wide setting: add a field here and hand it on in
    ``WorkflowInstance``; forks, sub-workflows and reruns then carry it without another edit.
    Say in ``for_child`` whether a child takes it from its own workflow or from its parent (by
    default, from its parent).

    Every field is checked here, once, for every way a workflow is bound (the builder, a fork, a
    child, a rerun, ``Workflow(settings=...)``): a value the log could not hold back is refused
    before anything is written. Raises ``DefinitionError`` naming the field.
    """

    instance_id: str
    name: str
    max_supersteps: int
    durability: Durability
    clock: Clock
    id_factory: IdFactory
    lease: LeasePolicy = DEFAULT_LEASE
    sensitive_keys: tuple[str, ...] = ()
    hooks: tuple[RunHooks, ...] = ()
    live_steps: frozenset[str] | None = None
    snapshot_every: int = DEFAULT_SNAPSHOT_EVERY
    """A run keeps a snapshot of the instance's view beside the log every ``snapshot_every``
    committed supersteps and at its end; 0: none is taken, and none is read (every open folds
    the whole log)."""

    def __post_init__(self) -> None:
        check_id(self.instance_id, "instance_id", DefinitionError)
        if not isinstance(self.name, str) or not self.name:
            raise DefinitionError(f"a workflow name must be a non-empty string, got {self.name!r}")
        require_storable(self.name, "a workflow name")
        if (
            isinstance(self.max_supersteps, bool)
            or not isinstance(self.max_supersteps, int)
            or self.max_supersteps < 1
        ):
            raise DefinitionError(
                f"max_supersteps must be a positive int, got {self.max_supersteps!r}"
            )
        if self.durability not in ("superstep", "write"):
            raise DefinitionError(
                f"durability must be 'superstep' or 'write', got {self.durability!r}"
            )
        for what, value in (("clock", self.clock), ("id_factory", self.id_factory)):
            if not callable(value):
                raise DefinitionError(f"{what} must be a callable, got {value!r}")
        if not isinstance(self.lease, LeasePolicy):
            raise DefinitionError(f"lease must be a LeasePolicy, got {self.lease!r}")
        if not isinstance(self.sensitive_keys, tuple):
            raise DefinitionError(
                f"sensitive_keys must be a tuple of patterns, got {self.sensitive_keys!r}"
            )
        check_patterns(self.sensitive_keys)
        if not isinstance(self.hooks, tuple):
            raise DefinitionError(f"hooks must be a tuple of RunHooks, got {self.hooks!r}")
        chain_hooks(self.hooks)  # refuses what is not a RunHooks
        every = self.snapshot_every
        if isinstance(every, bool) or not isinstance(every, int) or every < 0:
            raise DefinitionError(f"snapshot_every must be an int >= 0, got {every!r}")
        live = self.live_steps
        if live is not None and (
            not isinstance(live, frozenset) or not all(isinstance(n, str) and n for n in live)
        ):
            raise DefinitionError(
                f"live_steps must be None or a frozenset of step names, got {live!r}"
            )

    def replace(self, **changes: Any) -> InstanceSettings:
        """A copy with ``changes`` (field names as keywords); ``TypeError`` for an unknown one."""
        return dataclasses.replace(self, **changes)

    def for_instance(self, instance_id: str) -> InstanceSettings:
        """These settings, for another instance of the same workflow (a fork of this one)."""
        return self.replace(instance_id=instance_id)

    def for_child(self, instance_id: str, *, parent: InstanceSettings) -> InstanceSettings:
        """The settings of a sub-workflow's child instance ``instance_id``, whose workflow these
        settings are, run inside ``parent``'s instance.

        The child keeps what its own workflow defines (``name``, ``max_supersteps``,
        ``sensitive_keys``) and takes everything else from the parent that runs it: its
        ``durability``, ``clock``, ids, ``lease`` and ``hooks`` (a child's run is part of its
        parent's, so the parent's hooks see it, nested in the sub-workflow executor's
        invocation), and any setting added later."""
        return parent.replace(
            instance_id=instance_id,
            name=self.name,
            max_supersteps=self.max_supersteps,
            sensitive_keys=self.sensitive_keys,
        )


class WorkflowInstance(InstanceContext):
    """The ``InstanceContext`` of a ``Workflow``: made from its ``InstanceSettings``, which it
    keeps as ``settings`` (a sub-workflow run on it binds its child with them)."""

    def __init__(self, store: EventStore, graph: Graph, settings: InstanceSettings) -> None:
        super().__init__(
            store,
            settings.instance_id,
            workflow_name=settings.name,
            router=Router(graph),
            max_supersteps=settings.max_supersteps,
            durability=settings.durability,
            clock=settings.clock,
            id_factory=settings.id_factory,
            owner=process_owner(),
            lease=settings.lease,
            sensitive_keys=settings.sensitive_keys,
            hooks=settings.hooks,
            live_steps=settings.live_steps,
            snapshot_every=settings.snapshot_every or DEFAULT_SNAPSHOT_EVERY,
            use_snapshots=settings.snapshot_every > 0,
        )
        self.settings = settings


def check_patterns(patterns: tuple[str, ...]) -> tuple[str, ...]:
    """``patterns`` (sensitive-key patterns), each a non-empty string the log can store; raises
    ``DefinitionError`` naming the first that is not."""
    for pattern in patterns:
        if not isinstance(pattern, str) or not pattern:
            raise DefinitionError(
                f"a sensitive key pattern must be a non-empty string, got {pattern!r}"
            )
        require_storable(pattern, "a sensitive key pattern")
    return patterns
