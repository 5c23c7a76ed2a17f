"""Lineage across instances, read from a store: the forks of an instance, and its history with
them.

A fork's ``InstanceForked`` is the first event of the *fork's* stream, so a fold of one instance
sees where it came from (``RunHistory.forked_from``) but not what was forked from it. These
readers look across the store's instances for forks of a given origin; the ``history`` view keeps
the same records under the origin (``Projector.forks``, ``Projector.history``).

Example::

    history = history_of(store, "order-42")
    print(history.forked_from, [fork.instance_id for fork in history.forks()])
"""

from __future__ import annotations

from kernel import EventStore, InstanceForked
from projections._history import RunHistory, fold_history, fork_record
from projections._runrecords import ForkRecord

__all__ = ["forks_of", "history_of"]

_FORKED = frozenset({"instance_forked"})


def forks_of(store: EventStore, origin_instance: str) -> list[ForkRecord]:
    """The instances of ``store`` forked from ``origin_instance``, oldest first.

    Reads the first event of every instance, and decodes only fork events.
    """
    found = []
    for name in store.instances():
        for event in store.read(name, upto=1, types=_FORKED):
            if isinstance(event, InstanceForked) and event.origin_instance == origin_instance:
                found.append(fork_record(event))
    return sorted(found, key=lambda fork: (fork.forked_at, fork.instance_id))


def history_of(store: EventStore, instance_id: str) -> RunHistory:
    """The run history of ``instance_id`` in ``store``, with its forks (``forks_of``)."""
    return fold_history(store.read(instance_id), RunHistory(forks=forks_of(store, instance_id)))
