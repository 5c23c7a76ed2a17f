"""Snapshots: an instance's folded view kept beside its log, so that opening it, starting a run on
it or resuming its last run folds only the log's tail, not its whole history.

A snapshot holds what ``InstanceContext`` folds (``kernel._run._instance``): committed state
(``CommittedState.to_snapshot``, pending writes included), the open run (``OpenRun``) and the
ledger, *pruned*: only the instance's last run is kept, with its last committed superstep and a
``Root`` (its standing after that superstep as wire values, the requests then pending, the
responses recorded and not yet delivered), plus what the ledger's questions need of the rest
(the latest checkpoint, a fork's origin, the ids of answered requests, the recorded steps of the
latest lineage, the supersteps still without a marker). A question about anything pruned raises
``HistoryNeeded`` and is asked again of a ledger folded from the whole log.

It is a cache, never a second truth: it names the stream position it was folded to and the
chain hash the log has there, and is used only if the log still ends a row at that position
with that hash (``EventStore.read_after_head``, which also reads the tail). A snapshot that is
missing, stale (past the log's end, or over another log), foreign (another instance, another
graph, another format), corrupt (undecodable, or its digest does not match), sealed when the
store has no key or plain when it has one, is ignored, for a reason the instance keeps
(``InstanceContext.snapshot_note``); the view is then folded from the log, which gives the same
answer. Ignoring, not refusing: the log alone decides every answer, a bad cache only costs time.

When the store has keys the snapshot body is sealed like a row (``Keyring.seal``), bound to the
instance and the position. Decoding one builds only registered event classes and JSON trees: it
imports and calls nothing a log row could not make it call.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import orjson

from kernel._codec._hashing import CHAIN_BYTES
from kernel._define._graph import FanIn, Graph
from kernel._log._events import EVENT_TYPES, EventBase, InstanceForked, ResponseReceived
from kernel._log._fold import CommittedState, OpenRun
from kernel._run._ledger import (
    WIRE,
    Ledger,
    Root,
    RunLine,
    _Step,
    pending_wire,
    standing_tree,
    undelivered,
)

if TYPE_CHECKING:
    from kernel._codec._cipher import Keyring
    from kernel._run._algo import Router

__all__ = [
    "DEFAULT_SNAPSHOT_EVERY",
    "SNAPSHOT_FORMAT",
    "Loaded",
    "SnapshotUnusable",
    "decode_snapshot",
    "encode_snapshot",
    "graph_signature",
    "prune",
]

SNAPSHOT_FORMAT = 1
"""The version of a snapshot's layout; a snapshot of another format is ignored."""
DEFAULT_SNAPSHOT_EVERY = 1000
"""Supersteps between two snapshots a long run takes (and one at every run's end)."""
_MAGIC = "steplog-snapshot"
_SAME = "same as committed"
_MAX_POSITION = (1 << 63) - 1
"""The largest stream position a store can hold (a signed 64-bit integer in SQLite and
PostgreSQL)."""
_MAX_BODY = 1 << 30  # a body that inflates past this is not decoded whole (and fails to parse)


class SnapshotUnusable(Exception):
    """Why a snapshot cannot serve (the instance folds from the log instead)."""


@dataclass(slots=True)
class Loaded:
    """A snapshot decoded and checked against its header: the views folded to ``position``."""

    position: int
    head: bytes
    committed: CommittedState
    open_run: OpenRun
    ledger: Ledger


def graph_signature(graph: Graph) -> list[Any]:
    """What a snapshot's standing depends on of the graph: its start, its executors and its
    fan-in groups (a standing rebuilt over another graph could differ)."""
    fan_ins = sorted([g.target, list(g.sources)] for g in graph.groups if isinstance(g, FanIn))
    return [graph.start, sorted(graph.executors), fan_ins]


# -- pruning --------------------------------------------------------------------------------------


def _stub(step: _Step) -> _Step:
    """A committed superstep without its items (a pruned ledger keeps only where it is)."""
    return _Step(step.superstep_id, step.run_id, step.index, step.timestamp, step.position, [])


def prune(ledger: Ledger, router: Router, origin: Callable[[InstanceForked], Ledger]) -> Ledger:
    """A ledger that answers what ``ledger`` answers about the instance's last run and its
    latest checkpoint, and raises ``HistoryNeeded`` for the rest (see the module's docstring).

    Raises ``ResumeError`` when the log names what the workflow has not (no snapshot then)."""
    pruned = Ledger(ledger.instance_id)
    pruned.pruned = True
    pruned.position = ledger.position
    pruned._pending = {k: list(v) for k, v in ledger._pending.items()}
    pruned._closed = {k: dict(v) for k, v in ledger._closed.items()}
    pruned._ended_runs = set(ledger._ended_runs)
    pruned._starts = dict(ledger._starts)
    pruned._step_lineage = ledger._step_lineage
    pruned._step_records = list(ledger._step_records)
    pruned._step_aborts = dict(ledger._step_aborts)
    pruned.forked = ledger.forked
    pruned.answered = set(ledger.answered)
    latest = _stub(ledger.checkpoints[-1]) if ledger.checkpoints else None
    line = ledger.last_run()
    if line is not None:
        resume_point = line.steps[-1].superstep_id if line.steps else None
        standing = ledger.standing(
            line.run_id, resume_point, router=router, codec=WIRE, origin=origin
        )
        forked = ledger.forked
        inherited = list(forked.requests) if forked is not None else []
        pending = pending_wire(ledger, line.run_id, resume_point, forked_requests=inherited)
        responses: list[ResponseReceived] = []
        if not line.steps and line.started.continues is not None:
            responses = undelivered(ledger, ledger.run(line.started.continues))
        steps = [_stub(line.steps[-1])] if line.steps else []
        if steps and latest is not None and latest.superstep_id == steps[0].superstep_id:
            steps = [latest]
        pruned.runs[line.run_id] = RunLine(
            line.started,
            line.base,
            list(line.responses),
            steps,
            line.end,
            line.tried_after,
            line.lineage,
            Root(standing_tree(standing), pending, responses, len(steps)),
        )
    pruned.checkpoints = [latest] if latest is not None else []
    return pruned


# -- trees --------------------------------------------------------------------------------------


def _event_tree(event: EventBase) -> dict[str, Any]:
    return event.model_dump(mode="json")


def _event(tree: Any) -> Any:
    if not isinstance(tree, dict):
        raise SnapshotUnusable("an event in it is not an object")
    cls = EVENT_TYPES.get(tree.get("type"))  # type: ignore[arg-type]
    if cls is None:
        raise SnapshotUnusable(f"it holds an event of unknown type {tree.get('type')!r}")
    return cls.model_validate(tree)


def _step_tree(step: _Step) -> list[Any]:
    return [step.superstep_id, step.run_id, step.index, step.timestamp.isoformat(), step.position]


def _step(tree: list[Any]) -> _Step:
    superstep_id, run_id, index, timestamp, position = tree
    return _Step(
        str(superstep_id),
        str(run_id),
        int(index),
        datetime.fromisoformat(timestamp),
        int(position),
        [],
    )


def _ledger_tree(ledger: Ledger) -> dict[str, Any]:
    lines = []
    for line in ledger.runs.values():
        root = line.root
        assert root is not None
        lines.append(
            {
                "started": _event_tree(line.started),
                "base": line.base,
                "responses": [_event_tree(r) for r in line.responses],
                "steps": [_step_tree(s) for s in line.steps],
                "end": None if line.end is None else _event_tree(line.end),
                "tried_after": line.tried_after,
                "lineage": line.lineage,
                "root": {
                    "standing": root.standing,
                    "pending": root.pending,
                    "responses": [_event_tree(r) for r in root.responses],
                    "skip": root.skip,
                },
            }
        )
    return {
        "position": ledger.position,
        "runs": lines,
        "checkpoints": [_step_tree(s) for s in ledger.checkpoints],
        "forked": None if ledger.forked is None else _event_tree(ledger.forked),
        "answered": sorted(ledger.answered),
        "pending": {k: [_event_tree(e) for e in v] for k, v in ledger._pending.items()},
        "closed": ledger._closed,
        "ended_runs": sorted(ledger._ended_runs),
        "starts": [_event_tree(e) for e in ledger._starts.values()],
        "step_lineage": ledger._step_lineage,
        "step_records": [[_event_tree(e), i] for e, i in ledger._step_records],
        "step_aborts": ledger._step_aborts,
    }


def _ledger(tree: dict[str, Any], instance_id: str) -> Ledger:
    ledger = Ledger(instance_id)
    ledger.pruned = True
    ledger.position = int(tree["position"])
    checkpoints = [_step(s) for s in tree["checkpoints"]]
    by_id = {s.superstep_id: s for s in checkpoints}
    for node in tree["runs"]:
        root = node["root"]
        steps = [_step(s) for s in node["steps"]]
        steps = [by_id.get(s.superstep_id, s) for s in steps]
        line = RunLine(
            _event(node["started"]),
            node["base"],
            [_event(r) for r in node["responses"]],
            steps,
            None if node["end"] is None else _event(node["end"]),
            bool(node["tried_after"]),
            str(node["lineage"]),
            Root(
                dict(root["standing"]),
                {str(k): dict(v) for k, v in root["pending"].items()},
                [_event(r) for r in root["responses"]],
                int(root["skip"]),
            ),
        )
        ledger.runs[line.run_id] = line
    ledger.checkpoints = checkpoints
    ledger.forked = None if tree["forked"] is None else _event(tree["forked"])
    ledger.answered = {str(r) for r in tree["answered"]}
    ledger._pending = {str(k): [_event(e) for e in v] for k, v in tree["pending"].items()}
    ledger._closed = {
        str(k): {str(s): bool(c) for s, c in v.items()} for k, v in tree["closed"].items()
    }
    ledger._ended_runs = {str(r) for r in tree["ended_runs"]}
    starts = [_event(e) for e in tree["starts"]]
    ledger._starts = {e.superstep_id: e for e in starts}
    ledger._step_lineage = tree["step_lineage"]
    ledger._step_records = [(_event(e), i) for e, i in tree["step_records"]]
    ledger._step_aborts = {str(k): str(v) for k, v in tree["step_aborts"].items()}
    return ledger


def _open_run_tree(head: OpenRun) -> list[Any]:
    return [
        head.version,
        head.run_id,
        head.owner,
        head.superstep_id,
        head.index,
        head.requests_may_wait,
    ]


def _open_run(tree: list[Any]) -> OpenRun:
    head = OpenRun()
    version, run_id, owner, superstep_id, index, may_wait = tree
    head.version, head.run_id, head.owner = int(version), run_id, str(owner)
    head.superstep_id, head.index, head.requests_may_wait = superstep_id, int(index), bool(may_wait)
    return head


# -- the text kept in the store ---------------------------------------------------------------


def _place(instance_id: str, position: int) -> bytes:
    return f"snapshot\x00{instance_id}\x00{position}".encode()


def encode_snapshot(
    instance_id: str,
    head: bytes,
    graph: Graph,
    committed: CommittedState,
    open_run: OpenRun,
    ledger: Ledger,
    keyring: Keyring | None,
) -> str:
    """The snapshot of the views, folded to ``open_run.version`` where the chain hash is
    ``head``, as the text the store keeps (sealed with ``keyring``'s current key, if any)."""
    position = open_run.version
    committed_tree = committed.to_snapshot()
    ledger_tree = _ledger_tree(ledger)
    # Both folds keep the same record of markers (the one rule, over the same events): it grows
    # with an open run's supersteps, so it is written once when they agree.
    for name in ("closed", "ended_runs"):
        if committed_tree[name] == ledger_tree[name]:
            ledger_tree[name] = _SAME
    body = zlib.compress(
        orjson.dumps(
            {
                "format": SNAPSHOT_FORMAT,
                "instance_id": instance_id,
                "position": position,
                "head": head.hex(),
                "graph": graph_signature(graph),
                "committed": committed_tree,
                "open_run": _open_run_tree(open_run),
                "ledger": ledger_tree,
            }
        ),
        1,
    )
    sealed = keyring is not None
    if keyring is not None:
        body = keyring.seal(body, _place(instance_id, position))
    digest = hashlib.sha256(body).hexdigest()
    return (
        f"{_MAGIC} {SNAPSHOT_FORMAT} {position} {head.hex()} {digest} {int(sealed)}\n"
        + base64.b64encode(body).decode()
    )


def snapshot_header(text: str) -> tuple[int, bytes]:
    """The position and chain hash a snapshot's text names. Raises ``SnapshotUnusable``."""
    try:
        header, _ = text.split("\n", 1)
        magic, form, position, head, _digest, _sealed = header.split(" ")
        if magic != _MAGIC:
            raise ValueError
        if int(form) != SNAPSHOT_FORMAT:
            raise SnapshotUnusable(f"it is of format {form}, not {SNAPSHOT_FORMAT}")
        at, chain_hash = int(position), bytes.fromhex(head)
    except SnapshotUnusable:
        raise
    except ValueError:
        raise SnapshotUnusable("its header is malformed") from None
    if not 0 < at <= _MAX_POSITION:  # (a database integer holds no more)
        raise SnapshotUnusable(f"its header names position {position:.30}, which no log has")
    if len(chain_hash) != CHAIN_BYTES:
        raise SnapshotUnusable("its header's chain hash is not a hash")
    return at, chain_hash


def decode_snapshot(text: str, instance_id: str, graph: Graph, keyring: Keyring | None) -> Loaded:
    """The views a snapshot's text holds, checked: of ``instance_id``, over ``graph``'s
    signature, sealed iff the store has keys, whole (its digest). Raises ``SnapshotUnusable``
    saying why not. Checking it against the chain is the caller's (``read_after_head``)."""
    position, head = snapshot_header(text)
    header, encoded = text.split("\n", 1)
    _, _, _, _, digest, sealed = header.split(" ")
    try:
        body = base64.b64decode(encoded, validate=True)
    except ValueError:
        raise SnapshotUnusable("its body is not base64") from None
    if not hmac.compare_digest(hashlib.sha256(body).hexdigest(), digest):
        raise SnapshotUnusable("its body does not match its digest (corrupt)")
    if sealed == "1":
        if keyring is None:
            raise SnapshotUnusable("it is encrypted and the store was opened without keys")
        try:
            body = keyring.open(body, _place(instance_id, position), "a snapshot")
        except Exception as error:  # a missing key, or a body altered or moved
            raise SnapshotUnusable(f"it does not open: {error}") from None
    elif keyring is not None:
        raise SnapshotUnusable("it is plain and the store has keys: never trusted unsealed")
    try:
        tree = orjson.loads(zlib.decompressobj().decompress(body, _MAX_BODY))
        for name in ("closed", "ended_runs"):
            if tree["ledger"][name] == _SAME:
                tree["ledger"][name] = tree["committed"][name]
        if tree["format"] != SNAPSHOT_FORMAT:
            raise SnapshotUnusable(f"its body is of format {tree['format']!r}")
        if tree["instance_id"] != instance_id:
            raise SnapshotUnusable(f"it is of instance {tree['instance_id']!r}")
        if tree["position"] != position or tree["head"] != head.hex():
            raise SnapshotUnusable("its body and its header name different points of the log")
        if tree["graph"] != graph_signature(graph):
            raise SnapshotUnusable("it was folded over another graph")
        committed = CommittedState.from_snapshot(tree["committed"])
        open_run = _open_run(tree["open_run"])
        if open_run.version != position:
            raise SnapshotUnusable("its open run is at another position")
        ledger = _ledger(tree["ledger"], instance_id)
    except SnapshotUnusable:
        raise
    except Exception as error:  # anything malformed: a cache is never trusted past a doubt
        raise SnapshotUnusable(f"it is malformed ({type(error).__name__}: {error})") from None
    return Loaded(position, head, committed, open_run, ledger)
