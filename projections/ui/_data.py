"""What the UI's pages show, asked of the projections' public API (never re-derived here).

``Reader`` keeps, per instance, the events and the run history folded from them, keyed by the
instance's version (``store.version``): a page on an unchanged instance reuses them, and an
instance that grew is read again. Every verdict (a superstep committed or aborted, a write
counted or not) comes from ``fold_history``, ``blame_keys``, ``state_at`` and ``diff_points``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from kernel import (
    EventBase,
    EventStore,
    InfoRequested,
    MessageStaged,
    OutputYielded,
    ResponseReceived,
    SuperstepEvent,
)
from projections import (
    AtPosition,
    KeyBlame,
    RunHistory,
    SensitiveKeys,
    StateAt,
    StateDiff,
    SubworkflowLink,
    blame_keys,
    diff_points,
    fold_history,
    forks_of,
    parent_of,
    sensitive_keys_of,
    state_at,
    subworkflows_of,
)
from projections.cli._ids import RUN_WINDOW, pick
from projections.cli._points import UsageError, parse_point

__all__ = ["NotFound", "Reader", "StepDetail"]

_CACHED = 8
"""Instances whose events and history a ``Reader`` keeps."""


class NotFound(UsageError):
    """An unknown instance, run, superstep or key: the UI answers with a 404 page."""


@dataclass
class _Instance:
    version: int
    events: list[EventBase]
    history: RunHistory
    redactor: SensitiveKeys
    by_step: dict[str, list[EventBase]] = field(default_factory=dict)


@dataclass(frozen=True)
class StepDetail:
    """What a superstep's own events say, beside its ``SuperstepRecord``: the messages it sent
    (source, targets, the message), its outputs, the requests it made."""

    messages: list[tuple[str, tuple[str, ...], Any]]
    outputs: list[tuple[str, Any, str]]
    requests: list[tuple[str, str, Any]]


class Reader:
    """Read-only answers for the UI from ``store`` (see the module docstring).

    ``reveal`` shows sensitive values; ``sensitive`` adds patterns to redact, as the CLI's
    ``--reveal`` and ``--sensitive`` do.
    """

    def __init__(
        self, store: EventStore, *, reveal: bool = False, sensitive: tuple[str, ...] = ()
    ) -> None:
        self.store = store
        self.reveal = reveal
        self.sensitive = SensitiveKeys(sensitive)
        self._cache: OrderedDict[str, _Instance] = OrderedDict()
        self._lock = threading.Lock()

    # -- instances ----------------------------------------------------------------------------

    def instances(self) -> list[str]:
        """Every instance with events."""
        return self.store.instances()

    def version(self, instance_id: str) -> int:
        """The instance's last stream position (0: none)."""
        return self.store.version(instance_id)

    def instance(self, text: str) -> str:
        """The instance ``text`` names exactly or as a unique prefix; ``NotFound`` otherwise."""
        if self.store.version(text) > 0:
            return text
        try:
            return pick(text, self.store.instances(), "instance", "the store")
        except UsageError as error:
            raise NotFound(str(error)) from error

    def _load(self, instance_id: str) -> _Instance:
        version = self.store.version(instance_id)
        with self._lock:
            found = self._cache.get(instance_id)
            if found is not None and found.version == version:
                self._cache.move_to_end(instance_id)
                return found
        events: list[EventBase] = []
        after = 0
        while after < version:
            events.extend(self.store.read(instance_id, after=after, upto=after + RUN_WINDOW))
            after += RUN_WINDOW
        if not events:
            raise NotFound(f"no instance {instance_id!r} in the store")
        history = fold_history(events, RunHistory(forks=forks_of(self.store, instance_id)))
        redactor = (
            SensitiveKeys()
            if self.reveal
            else sensitive_keys_of(
                self.store, instance_id, extra=self.sensitive.patterns, events=events
            )
        )
        loaded = _Instance(events[-1].position, events, history, redactor)
        for event in events:
            if isinstance(event, SuperstepEvent):
                loaded.by_step.setdefault(event.superstep_id, []).append(event)
        with self._lock:
            self._cache[instance_id] = loaded
            while len(self._cache) > _CACHED:
                self._cache.popitem(last=False)
        return loaded

    def history(self, instance_id: str) -> RunHistory:
        """The instance's run history (``fold_history``, with its forks)."""
        return self._load(instance_id).history

    def events(self, instance_id: str) -> list[EventBase]:
        """The instance's events, oldest first."""
        return self._load(instance_id).events

    def redactor(self, instance_id: str) -> SensitiveKeys:
        """What is redacted in the instance's values (nothing when revealing)."""
        return self._load(instance_id).redactor

    def step_detail(self, instance_id: str, superstep_id: str) -> StepDetail:
        """The messages, outputs and requests of one superstep, from its events."""
        loaded = self._load(instance_id)
        messages: list[tuple[str, tuple[str, ...], Any]] = []
        outputs: list[tuple[str, Any, str]] = []
        requests: list[tuple[str, str, Any]] = []
        for event in loaded.by_step.get(superstep_id, ()):
            if isinstance(event, MessageStaged):
                targets = tuple(event.targets) or ((event.target,) if event.target else ())
                messages.append((event.source, targets, event.message))
            elif isinstance(event, OutputYielded):
                outputs.append((event.executor_id, event.value, event.designation))
            elif isinstance(event, InfoRequested):
                requests.append((event.request_id, event.executor_id, event.data))
        return StepDetail(messages, outputs, requests)

    def responses(self, instance_id: str) -> dict[str, list[str]]:
        """Run id -> the request ids whose responses it recorded, in order."""
        found: dict[str, list[str]] = {}
        for event in self._load(instance_id).events:
            if isinstance(event, ResponseReceived):
                found.setdefault(event.run_id, []).append(event.request_id)
        return found

    def routes(self, instance_id: str) -> dict[tuple[str, str], int]:
        """(source, target) -> how many messages the log routed so (``MessageStaged``)."""
        routes: dict[tuple[str, str], int] = {}
        for event in self._load(instance_id).events:
            if isinstance(event, MessageStaged):
                for target in event.targets or ([event.target] if event.target else []):
                    routes[event.source, target] = routes.get((event.source, target), 0) + 1
        return routes

    def subworkflows(self, instance_id: str) -> list[SubworkflowLink]:
        """The sub-workflow runs the instance's supersteps ran (``subworkflows_of``)."""
        return subworkflows_of(self.store, instance_id)

    def parent(self, instance_id: str) -> SubworkflowLink | None:
        """The parent superstep that ran this instance, if it is a sub-workflow (``parent_of``)."""
        return parent_of(self.store, instance_id)

    # -- time travel, diff, blame ---------------------------------------------------------------

    def point(self, instance_id: str, text: str | None) -> tuple[str, StateAt]:
        """The point ``text`` names (``pos:N``, ``step:ID``, ``inside:ID``, ``run:RUN:K``,
        ``time:ISO``; None: now) and the state there, redacted."""
        loaded = self._load(instance_id)
        text = text or f"pos:{loaded.version}"
        try:
            point = parse_point(text, loaded.events)
            at = state_at(loaded.events, point)
        except UsageError as error:
            raise NotFound(str(error)) from error
        except Exception as error:  # a point naming nothing: the projections' own error
            raise NotFound(f"bad point {text!r}: {error}") from error
        return text, loaded.redactor.state(at)

    def diff(self, instance_id: str, before: str, after: str) -> StateDiff:
        """Keys added, removed and changed between two points (``diff_points``), redacted."""
        loaded = self._load(instance_id)
        try:
            a, b = parse_point(before, loaded.events), parse_point(after, loaded.events)
            changes = diff_points(loaded.events, a, b)
        except UsageError as error:
            raise NotFound(str(error)) from error
        except Exception as error:
            raise NotFound(f"bad point: {error}") from error
        return loaded.redactor.diff(changes)

    def blame(self, instance_id: str, key: str) -> KeyBlame:
        """Every write of ``key`` with its verdict (``blame_keys``), redacted; ``NotFound`` for
        a key never written."""
        loaded = self._load(instance_id)
        blame = loaded.redactor.blame(blame_keys(self.store, instance_id, [key]))
        if not blame.writes(key):
            raise NotFound(f"key {key!r} was never written in {instance_id!r}")
        return blame

    def now(self, instance_id: str) -> StateAt:
        """The committed state now, redacted."""
        loaded = self._load(instance_id)
        return loaded.redactor.state(state_at(loaded.events, AtPosition(loaded.version)))
