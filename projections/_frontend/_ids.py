"""Ids named on the command line: an instance, a run, a superstep or a request, or a unique prefix
of one.

An exact id wins; else the one id starting with the text; else ``UsageError``: ambiguous (with
the candidates) or unknown (with the closest ids, by ``difflib``). Only ``run_started`` events
are decoded to find runs, in position windows, so a long log is never held in memory.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable, Iterator

from kernel import (
    EventBase,
    EventStore,
    InfoRequested,
    InstanceForked,
    RunStarted,
    StateStaged,
    SuperstepStarted,
)
from projections._frontend._points import UsageError
from projections._frontend._safe import visible

__all__ = [
    "RUN_WINDOW",
    "closest",
    "events_of",
    "find_run",
    "instance_id",
    "pick",
    "request_id",
    "runs_of",
    "superstep_ids",
    "written_keys",
]

RUN_WINDOW = 5000
"""Stream positions read per window while looking for runs."""
_SHOWN = 5


def pick(text: str, ids: Iterable[str], what: str, where: str) -> str:
    """The id of ``ids`` that ``text`` names exactly or as the prefix of exactly one."""
    known = sorted(set(ids))
    if text in known:
        return text
    matches = [i for i in known if text and i.startswith(text)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        shown = ", ".join(map(visible, matches[:_SHOWN])) + (
            " ..." if len(matches) > _SHOWN else ""
        )
        raise UsageError(
            f"{what} {text!r} is ambiguous in {where}: {len(matches)} {what}s start with it "
            f"({shown}); give more characters"
        )
    raise UsageError(f"no {what} {text!r} in {where}{closest(text, known)}")


def closest(text: str, known: Iterable[str]) -> str:
    """``"; closest: a, b"`` naming the ids of ``known`` most like ``text`` (or ``""``)."""
    close = difflib.get_close_matches(text, list(known), n=3, cutoff=0.5)
    return f"; closest: {', '.join(map(visible, close))}" if close else ""


def instance_id(store: EventStore, text: str) -> str:
    """The instance ``text`` names (exactly, or as a unique prefix)."""
    if store.version(text) > 0:
        return text
    return pick(text, store.instances(), "instance", store.url)


def events_of(
    store: EventStore,
    instance: str,
    types: Collection[str] = (),
    *,
    after: int = 0,
    upto: int | None = None,
) -> Iterator[EventBase]:
    """The events of ``instance`` (only ``types``, if given) past position ``after``, in order,
    read window by window: never the whole log in memory at once. Up to ``upto`` if given (no
    window reads past it); else up to the stream's version when asked (its last window whole)."""
    end = store.version(instance) if upto is None else upto
    while after < end:
        stop = after + RUN_WINDOW
        yield from store.read(
            instance, after=after, upto=stop if upto is None else min(stop, upto), types=types
        )
        after = stop


def runs_of(store: EventStore, instance: str) -> Iterator[RunStarted]:
    """The ``run_started`` events of ``instance``, in order (found by their rows' bytes:
    ``EventStore.find_events``)."""
    for event in store.find_events(instance, ("run_started",)):
        if isinstance(event, RunStarted):
            yield event


def superstep_ids(store: EventStore, instance: str) -> list[str]:
    """The ids of the supersteps of ``instance``, in order."""
    return [
        event.superstep_id
        for event in events_of(store, instance, ("superstep_started",))
        if isinstance(event, SuperstepStarted)
    ]


def find_run(store: EventStore, text: str, instance: str | None = None) -> tuple[str, str]:
    """``(instance id, run id)`` of the run ``text`` names, in ``instance`` or in any instance."""
    owners: dict[str, str] = {}
    for name in [instance] if instance is not None else store.instances():
        for started in runs_of(store, name):
            owners.setdefault(started.run_id, name)
    where = f"instance {instance!r}" if instance is not None else store.url
    run = pick(text, owners, "run", where)
    return owners[run], run


def request_id(store: EventStore, instance: str, text: str) -> str:
    """The request of ``instance`` that ``text`` names (exactly, or as a unique prefix), among
    every request it asked for (``info_requested``) or was forked with, answered or not (whether
    it may be answered is the kernel's to say). A text no id starts with is returned as it is:
    ``record_response`` refuses it naming the requests pending, more help than the closest."""
    asked: list[str] = []
    for event in events_of(store, instance, ("info_requested", "instance_forked")):
        if isinstance(event, InfoRequested):
            asked.append(event.request_id)
        elif isinstance(event, InstanceForked):
            asked += [str(r.get("request_id")) for r in event.requests]
    if not any(known.startswith(text) for known in asked):
        return text
    return pick(text, asked, "request", repr(instance))


def written_keys(store: EventStore, instance: str) -> set[str]:
    """Every key ``instance`` staged a write of, or was forked with."""
    keys: set[str] = set()
    for event in events_of(store, instance, ("state_staged", "instance_forked")):
        if isinstance(event, StateStaged):
            keys.add(event.key)
        elif isinstance(event, InstanceForked):
            keys.update(event.values)
    return keys
