"""What the reading commands share: the ``--reveal`` and ``--sensitive`` options, what they
redact (``redactor``), and the events of an instance that must exist (``require_events``)."""

from __future__ import annotations

import argparse

from kernel import EventBase, EventStore
from projections import SensitiveKeys, sensitive_keys_of
from projections._frontend._points import UsageError

__all__ = ["redactor", "require_events", "sensitivity_options"]


def sensitivity_options(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--reveal",
        action="store_true",
        help="show the values of sensitive keys and steps (not redacted)",
    )
    command.add_argument(
        "--sensitive",
        action="append",
        default=[],
        metavar="PATTERN",
        help="also redact the keys (and results of steps named) matching PATTERN (a key or an "
        "fnmatch glob; repeatable)",
    )


def require_events(store: EventStore, instance: str) -> list[EventBase]:
    events = store.read(instance)
    if not events:
        raise UsageError(f"no instance {instance!r} in {store.url}")
    return events


def redactor(
    store: EventStore,
    args: argparse.Namespace,
    events: list[EventBase] | None = None,
    *,
    instance: str | None = None,
) -> SensitiveKeys:
    """What a reading command redacts: nothing with ``--reveal``, else the instance's sensitive
    keys and the ``--sensitive`` patterns (``events``: the instance's, when read already;
    ``instance``: the instance, when the command was not given it but a run)."""
    extra = SensitiveKeys(args.sensitive)  # a bad pattern is bad input, --reveal or not
    if args.reveal:
        return SensitiveKeys()
    name = args.instance if instance is None else instance
    return sensitive_keys_of(store, name, extra=extra.patterns, events=events)
