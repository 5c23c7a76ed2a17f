"""What the UI's pages show, asked of the projections' public API (never re-derived here).

``Reader`` keeps, per instance, the run history fold (``RunHistory``) with the instance's
version (``store.version``): a page on an unchanged instance reuses it, and when the instance
grew only the new events are read and folded in (which keeps live pages cheap on a long log).
A fresh ``Reader`` starts an instance's history from the history view when ``steplog project``
built it (``HistoryView``'s rows of the instance, read without creating anything, checked
against their manifest) and folds only the instance's events after the manifest's ``at``;
without a readable view it folds the whole log.
No page scans the instance's whole log: the run list reads the history; a timeline page
reads only its supersteps' positions (``step_details``; a served step's origin record where it
is, one position each); run starts, answers and sub-workflow
marks are found by ``store.find_events`` (which decodes only the rows that may hold one);
state comes from ``TimeTravel`` (from snapshots when the snapshot view was built, by
``steplog project``), blame from ``blame_keys`` (through the key index when built), diff from
``diff`` of two such states. The graph alone needs every route, so only ``graph`` (its own
address, which pages fetch once shown) scans the log, once per server, continued as it grows.
Every verdict (a superstep committed or aborted, a write counted or not) is the projections';
nothing here decides one.

A broken chain is never read past: the store's reads raise ``LogIntegrityError`` (an edited
event, a missing or moved row), a timeline page checks every event of the supersteps it shows,
and each instance's log is checked to still reach its recorded chain head (a removed tail,
which reads alone cannot see: ``verify_chain`` then names it). The error is raised to the page,
which shows it as the CLI does; ``allow_broken_chain`` (``steplog --allow-broken-chain ui``)
reads the log anyway, as the store opened so does.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kernel import (
    SUPERSTEP_MARKER_TYPES,
    DecodeError,
    EventBase,
    EventStore,
    ExecutorInvoked,
    InfoRequested,
    LogIntegrityError,
    MessageStaged,
    OutputYielded,
    ResponseReceived,
    StepLogError,
    StepRecorded,
    SuperstepEvent,
    SuperstepStarted,
)
from projections import (
    SENSITIVE_TYPES,
    ForkRecord,
    HistoryView,
    KeyBlame,
    Point,
    RecordedStep,
    RunHistory,
    SensitiveKeys,
    SnapshotView,
    StateAt,
    StateDiff,
    SubworkflowLink,
    SuperstepRecord,
    TimeTravel,
    backend_for,
    blame_keys,
    diff,
    forks_of,
    parent_of,
    sensitive_keys_of,
    subworkflows_of,
)
from projections._frontend._ids import events_of, pick
from projections._frontend._points import UsageError, point_in
from projections._frontend._steps import steps_of
from projections._views._manifest import MANIFEST_KEY, check_anchor, checked_rows

__all__ = ["NotFound", "Reader", "StepDetail"]

_CACHED = 32
"""Instances whose history a ``Reader`` keeps."""
_FOUND = (*SENSITIVE_TYPES, "response_received", "subworkflow_ran", "subworkflow_started")
"""The rare events pages ask about beside the history (found, not scanned)."""
_GRAPH_TYPES = ("superstep_started", "executor_invoked", "message_staged")
"""What the graph folds: the executors invoked (and when first), the routes messages took."""


class NotFound(UsageError):
    """An unknown instance, run, superstep or key: the UI answers with a 404 page."""


@dataclass
class _Graph:
    """The graph fold of an instance, continued as its log grows (only the graph endpoint
    scans the log for it: no page waits for it)."""

    version: int = 0
    index: dict[str, int] = field(default_factory=dict)  # superstep id -> its index
    first_ran: dict[str, int] = field(default_factory=dict)  # executor -> first superstep index
    routes: dict[tuple[str, str], int] = field(default_factory=dict)


@dataclass
class _Instance:
    """What a ``Reader`` keeps of an instance: the run history fold (kept to be continued when
    the log grows), the supersteps in start order (for pages and naming points), the rare
    events no view holds (found, not scanned), and the graph (scanned only when fetched)."""

    version: int
    history: RunHistory
    redactor: SensitiveKeys
    ids: list[str] = field(default_factory=list)  # every superstep id, in start order
    order: dict[str, int] = field(default_factory=dict)  # superstep id -> its place in ids
    runs: set[str] = field(default_factory=set)  # every run id
    found_version: int = 0  # the position ``declared`` and the marks are caught up to
    declared: list[EventBase] = field(default_factory=list)  # run starts, the fork event
    answered: set[str] = field(default_factory=set)
    ran_subworkflows: bool = False
    is_subworkflow: bool = False
    graph: _Graph = field(default_factory=_Graph)
    lineage: tuple[int, list[SubworkflowLink], SubworkflowLink | None] | None = None
    """(the store's last position, subworkflows_of, parent_of) when last asked."""


@dataclass(frozen=True)
class StepDetail:
    """What a superstep's own events say, beside its ``SuperstepRecord``: the messages it sent
    (source, targets, the message), its outputs, the requests it made, and the recorded steps
    its handlers called (``RecordedStep``: with the superstep's verdict, and for a served call
    the record it reused)."""

    messages: list[tuple[str, tuple[str, ...], Any]]
    outputs: list[tuple[str, Any, str]]
    requests: list[tuple[str, str, Any]]
    steps: list[RecordedStep] = field(default_factory=list)


class Reader:
    """Read-only answers for the UI from ``store`` (see the module docstring).

    ``reveal`` shows sensitive values; ``sensitive`` adds patterns to redact, as the CLI's
    ``--reveal`` and ``--sensitive`` do; ``allow_broken_chain`` does not refuse a log whose end
    falls short of its recorded chain head (the store opened with it reads the rest anyway).
    """

    def __init__(
        self,
        store: EventStore,
        *,
        reveal: bool = False,
        sensitive: tuple[str, ...] = (),
        allow_broken_chain: bool = False,
    ) -> None:
        self.store = store
        self.allow_broken_chain = allow_broken_chain
        self.reveal = reveal
        self.sensitive = SensitiveKeys(sensitive)
        self._cache: OrderedDict[str, _Instance] = OrderedDict()
        self._lock = threading.Lock()
        self._graph_lock = threading.Lock()
        self._travel: TimeTravel | None = None

    def _time_travel(self) -> TimeTravel:
        """``TimeTravel`` from the snapshots when the snapshot view exists (``steplog project``
        built it), else without them (folding the log from its start, page by page). Looking
        creates nothing; a snapshot table that appears later is used from the next start."""
        if self._travel is None:
            backend = backend_for(self.store)
            if backend.exists(SnapshotView().table):
                self._travel = TimeTravel(self.store, backend=backend, page_size=2000)
            else:
                self._travel = TimeTravel(self.store, snapshots=False, page_size=2000)
        return self._travel

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

    def _reached(self, instance_id: str) -> int:
        """The instance's version, once its log is seen to reach its recorded chain head: a
        head past the last row means rows were removed from the end (reads alone cannot tell),
        and ``verify_chain`` names where (raised as ``LogIntegrityError``). The head is read
        before the version: a writer records a row and its head together, so a log that grows
        meanwhile only reaches further."""
        head = self.store.chain_head(instance_id)
        version = self.store.version(instance_id)
        if head is not None and head.position > version and not self.allow_broken_chain:
            problem = self.store.verify_chain(instance_id).first_problem(instance_id)
            if problem is not None:
                raise problem.error()
        return version

    def _load(self, instance_id: str) -> _Instance:
        """The instance's history, caught up with its log: from the history view and its tail
        when the view exists, else folded window by window; when the log grew since the last
        page, only the new events are read and folded. Nothing else is read here. Raises
        ``LogIntegrityError`` for a broken chain (``_reached``, and the reads')."""
        version = self._reached(instance_id)
        if version == 0:
            raise NotFound(f"no instance {instance_id!r} in the store")
        with self._lock:
            loaded = self._cache.get(instance_id)
            if loaded is not None and loaded.version == version:
                self._cache.move_to_end(instance_id)
                return loaded
            fresh = loaded is None
            if loaded is None:
                forks = forks_of(self.store, instance_id)
                viewed = self._viewed(instance_id, forks)
                if viewed is None:
                    loaded = _Instance(0, RunHistory(forks=forks), SensitiveKeys())
                else:  # the history is caught up to its version: only later growth is read
                    history, caught_up = viewed
                    loaded = _Instance(caught_up, history, SensitiveKeys())
            for event in events_of(
                self.store,
                instance_id,
                RunHistory.EVENT_TYPES,
                after=loaded.version,
                upto=version,
            ):
                loaded.history.apply(event)
            loaded.version = max(loaded.version, version)
            if self._found(instance_id, loaded) or fresh:
                loaded.redactor = (
                    SensitiveKeys()
                    if self.reveal
                    else sensitive_keys_of(
                        self.store,
                        instance_id,
                        extra=self.sensitive.patterns,
                        events=loaded.declared,
                    )
                )
            runs = loaded.history.runs()
            # Every superstep in start order: the runs' own lists, runs in start order (an
            # instance runs one run at a time, so the lists follow one another in the log).
            loaded.ids = [s for run in runs for s in run.superstep_ids]
            loaded.order = {s: n for n, s in enumerate(loaded.ids)}
            loaded.runs = {run.run_id for run in runs}
            self._cache[instance_id] = loaded
            self._cache.move_to_end(instance_id)
            while len(self._cache) > _CACHED:
                self._cache.popitem(last=False)
            return loaded

    def _found(self, instance_id: str, loaded: _Instance) -> bool:
        """Catch up the rare events no view holds (run starts and the fork event, which declare
        sensitive keys; answers to requests; sub-workflow marks) with ``store.find_events`` (only
        rows that may hold one are decoded), from where the last page left them; True when a run
        start or a fork event was found (the redaction is then asked again)."""
        declared = False
        for event in self.store.find_events(
            instance_id, _FOUND, after=loaded.found_version, upto=loaded.version
        ):
            if event.type in SENSITIVE_TYPES:
                loaded.declared.append(event)
                declared = True
            elif isinstance(event, ResponseReceived):
                loaded.answered.add(event.request_id)
            elif event.type == "subworkflow_ran":
                loaded.ran_subworkflows = True
            elif event.type == "subworkflow_started":
                loaded.is_subworkflow = True
        loaded.found_version = max(loaded.found_version, loaded.version)
        return declared

    def _viewed(self, instance_id: str, forks: list[ForkRecord]) -> tuple[RunHistory, int] | None:
        """The instance's run history from the history view (``steplog project`` built it), with
        the stream position it is folded up to: its manifest's ``at``, checked against the log
        (the caller folds the instance's events after it). None when there is no view to read
        (no table: nothing is created; rows of another shape; the instance not in it yet), and
        the caller folds the whole log instead.

        Where the view's rows end is the instance's manifest, never the view's global position:
        that is plain text in every store, and a position moved past the log's end would hide
        every event after the rows. The view folds the same events by the same fold
        (``RunHistory``), so its rows continued with the events after ``at`` are the history
        the whole log folds to."""
        backend = backend_for(self.store)
        table = HistoryView().table  # a view of another shape is another table: not found
        if not backend.exists(table):
            return None
        try:
            docs = backend.documents(table, instance_id)
            # Rows that no longer match their manifest or the log are refused, never shown.
            manifest = docs.get(MANIFEST_KEY)
            docs = checked_rows("history", instance_id, docs)
            check_anchor(self.store, "history", instance_id, manifest)
            tracker = docs.get("t")
            if manifest is None or not manifest["at"] or not isinstance(tracker, dict):
                return None
            history = RunHistory.from_rows(
                [doc for key, doc in docs.items() if key.startswith("r:")],
                [doc for key, doc in docs.items() if key.startswith("s:")],
                tracker,
                forks=forks,
            )
        except LogIntegrityError:
            raise  # an altered log or view is shown as such, never read around
        except (StepLogError, KeyError, TypeError, ValueError, AttributeError):
            return None  # rows the history cannot read: fold the log instead
        return history, int(manifest["at"])

    def graph(self, instance_id: str) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
        """Executor -> the index of the first superstep that invoked it, and (source, target)
        -> how many messages the log routed so (``MessageStaged``): the one answer that scans
        the instance's log, kept and continued as the log grows (pages fetch it afterwards)."""
        loaded = self._load(instance_id)
        with self._graph_lock:
            graph = loaded.graph
            version = loaded.version
            for event in events_of(
                self.store, instance_id, _GRAPH_TYPES, after=graph.version, upto=version
            ):
                self._fold_graph(graph, event)
            graph.version = max(graph.version, version)
            return dict(graph.first_ran), dict(graph.routes)

    @staticmethod
    def _fold_graph(graph: _Graph, event: EventBase) -> None:
        if isinstance(event, SuperstepStarted):
            graph.index[event.superstep_id] = event.index
        elif isinstance(event, ExecutorInvoked):
            if event.executor_id not in graph.first_ran:
                graph.first_ran[event.executor_id] = graph.index.get(event.superstep_id, 0)
        elif isinstance(event, MessageStaged):
            for target in event.targets or ([event.target] if event.target else []):
                route = (event.source, target)
                graph.routes[route] = graph.routes.get(route, 0) + 1

    def history(self, instance_id: str) -> RunHistory:
        """The instance's run history (``fold_history``, with its forks)."""
        return self._load(instance_id).history

    def redactor(self, instance_id: str) -> SensitiveKeys:
        """What is redacted in the instance's values (nothing when revealing)."""
        return self._load(instance_id).redactor

    def step_details(self, instance_id: str, steps: list[SuperstepRecord]) -> dict[str, StepDetail]:
        """The messages, outputs, requests and recorded steps of each of ``steps`` (one page of
        a timeline), read from their positions of the log (and, for a served call, the record
        it reused, wherever it is: ``steps_of``); values redacted as the instance's are. Every
        event of those positions is read, so that each is checked against its hash: a page
        never shows supersteps whose events were altered."""
        found: dict[str, StepDetail] = {s.superstep_id: StepDetail([], [], []) for s in steps}
        if not steps:
            return found
        redactor = self._load(instance_id).redactor
        first = min(s.start_position for s in steps)
        last = max(s.position or self.store.version(instance_id) for s in steps)
        records: list[StepRecorded] = []
        for event in self.store.read(
            instance_id,
            after=first - 1,
            upto=last,
        ):
            detail = found.get(getattr(event, "superstep_id", ""))
            if detail is None:
                continue
            if isinstance(event, StepRecorded):
                records.append(event)  # redacted by ``steps_of``, with the record it reused
                continue
            event = redactor.event(event)
            if isinstance(event, MessageStaged):
                targets = tuple(event.targets) or ((event.target,) if event.target else ())
                detail.messages.append((event.source, targets, event.message))
            elif isinstance(event, OutputYielded):
                detail.outputs.append((event.executor_id, event.value, event.designation))
            elif isinstance(event, InfoRequested):
                detail.requests.append((event.request_id, event.executor_id, event.data))
        supersteps = {s.superstep_id: s for s in steps}
        for recorded in steps_of(self.store, instance_id, records, supersteps, redactor):
            found[recorded.record.superstep_id].steps.append(recorded)
        return found

    def page(
        self, instance_id: str, run_id: str | None, page: int, size: int
    ) -> tuple[list[SuperstepRecord], int]:
        """The supersteps of one page of a timeline (of one run, or of every run), and how many
        there are in all; only that page's records are copied out of the history."""
        loaded = self._load(instance_id)
        if run_id is None:
            every = loaded.ids
        else:
            run = loaded.history.run(run_id)
            every = [] if run is None else run.superstep_ids
        ids, total = every[(page - 1) * size : page * size], len(every)
        found = (loaded.history.superstep(i) for i in ids)
        return [s for s in found if s is not None], total

    def neighbours(
        self, instance_id: str, superstep_id: str
    ) -> tuple[SuperstepRecord | None, SuperstepRecord | None]:
        """The supersteps started just before and just after ``superstep_id``."""
        loaded = self._load(instance_id)
        place = loaded.order.get(superstep_id)
        if place is None:
            return None, None
        around = [
            loaded.history.superstep(loaded.ids[i]) if 0 <= i < len(loaded.ids) else None
            for i in (place - 1, place + 1)
        ]
        return around[0], around[1]

    def answered(self, instance_id: str) -> set[str]:
        """The ids of the requests whose responses the instance's runs recorded."""
        return self._load(instance_id).answered

    def moment(self, instance_id: str, position: int) -> datetime | None:
        """The time stamped on the event at ``position`` (None for 0)."""
        if position < 1:
            return None
        found = self.store.read(instance_id, after=position - 1, upto=position)
        return found[0].timestamp if found else None

    def _lineage(self, instance_id: str) -> tuple[list[SubworkflowLink], SubworkflowLink | None]:
        """``subworkflows_of`` and ``parent_of``, asked again only when the store has grown
        (each reads the instance's markers and run ends, and the parent's)."""
        loaded = self._load(instance_id)
        now = self.store.last_position()
        if loaded.lineage is None or loaded.lineage[0] != now:
            # ``subworkflows_of`` folds every marker of the instance and ``parent_of`` reads
            # every ``subworkflow_started``: asked only when the history scan met such events.
            loaded.lineage = (
                now,
                subworkflows_of(self.store, instance_id) if loaded.ran_subworkflows else [],
                parent_of(self.store, instance_id) if loaded.is_subworkflow else None,
            )
        return loaded.lineage[1], loaded.lineage[2]

    def subworkflows(self, instance_id: str) -> list[SubworkflowLink]:
        """The sub-workflow runs the instance's supersteps ran (``subworkflows_of``)."""
        return self._lineage(instance_id)[0]

    def parent(self, instance_id: str) -> SubworkflowLink | None:
        """The parent superstep that ran this instance, if it is a sub-workflow (``parent_of``)."""
        return self._lineage(instance_id)[1]

    # -- time travel, diff, blame ---------------------------------------------------------------

    def _parse(self, instance_id: str, loaded: _Instance, text: str) -> Point:
        """The point ``text`` names, checked by the CLI's rule (``point_in``) against what the
        kept history and the store say of the log; ``NotFound`` when it names nothing there."""
        try:
            return point_in(text, _HistoryPoints(self.store, instance_id, loaded))
        except UsageError as error:
            raise NotFound(str(error)) from error

    def _state(self, instance_id: str, point: Point) -> StateAt:
        try:
            return self._time_travel().state(instance_id, point)
        except (LogIntegrityError, DecodeError):
            raise  # an altered or unreadable log is shown as such, not as a point naming nothing
        except StepLogError as error:  # a point naming nothing: the projections' own error
            raise NotFound(f"no such point: {error}") from error

    def point(self, instance_id: str, text: str | None) -> tuple[str, StateAt]:
        """The point ``text`` names (``pos:N``, ``step:ID``, ``inside:ID``, ``run:RUN:K``,
        ``time:ISO``; None: now) and the state there (``TimeTravel``), redacted."""
        loaded = self._load(instance_id)
        text = text or f"pos:{loaded.version}"
        at = self._state(instance_id, self._parse(instance_id, loaded, text))
        return text, loaded.redactor.state(at)

    def diff(self, instance_id: str, before: str, after: str) -> StateDiff:
        """Keys added, removed and changed between two points (``diff`` of the two states),
        redacted."""
        loaded = self._load(instance_id)
        a, b = (self._parse(instance_id, loaded, text) for text in (before, after))
        changes = diff(self._state(instance_id, a).values, self._state(instance_id, b).values)
        return loaded.redactor.diff(changes)

    def blame(self, instance_id: str, key: str) -> KeyBlame:
        """Every write of ``key`` with its verdict (``blame_keys``: through the key index when
        it was built), redacted; ``NotFound`` for a key never written."""
        loaded = self._load(instance_id)
        blame = loaded.redactor.blame(blame_keys(self.store, instance_id, [key]))
        if not blame.writes(key):
            raise NotFound(f"key {key!r} was never written in {instance_id!r}")
        return blame


class _HistoryPoints:
    """``LogPoints`` of an instance a ``Reader`` keeps (what ``point_in`` checks a point
    against), from its kept history and version: no page scans the log to check a point. Only
    a superstep the history holds open is looked for a marker in the log (one the history did
    not count, after its run ended), by ``store.find_events`` from the superstep's start."""

    def __init__(self, store: EventStore, instance_id: str, loaded: _Instance) -> None:
        self._store = store
        self._instance_id = instance_id
        self._loaded = loaded

    @property
    def last(self) -> int:
        return self._loaded.version

    @property
    def supersteps(self) -> Collection[str]:
        return self._loaded.order.keys()

    @property
    def runs(self) -> Collection[str]:
        return self._loaded.runs

    def _started(self, run_id: str) -> list[SuperstepRecord]:
        history = self._loaded.history
        run = history.run(run_id)
        found = (history.superstep(s) for s in (run.superstep_ids if run else ()))
        return [s for s in found if s is not None]

    def superstep_at(self, run_id: str, index: int) -> str | None:
        return next((s.superstep_id for s in self._started(run_id) if s.index == index), None)

    def last_index(self, run_id: str) -> int | None:
        return max((s.index for s in self._started(run_id)), default=None)

    def marked(self, superstep_id: str) -> bool:
        step = self._loaded.history.superstep(superstep_id)
        if step is None:
            return False
        if step.position is not None:
            return True
        return any(
            isinstance(event, SuperstepEvent) and event.superstep_id == superstep_id
            for event in self._store.find_events(
                self._instance_id,
                SUPERSTEP_MARKER_TYPES,
                after=step.start_position,
                upto=self._loaded.version,
            )
        )
