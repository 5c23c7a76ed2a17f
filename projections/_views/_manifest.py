"""Each view's manifest: per instance, which log its rows reflect and which rows it holds.

A view's rows are copies of what the log says, kept so that readers need not scan the log. They
are never trusted beyond that: every view table keeps, for each instance, a manifest row under
the key ``#`` (``MANIFEST_KEY``), written by ``Projector`` in the transaction of every page that
changes the instance's rows::

    {"at": 42, "hash": "9f...", "rows": 17, "digest": "03ab..."}

``at``
    the stream position of the instance's last event the view has folded, and ``hash`` the
    chain's hash of that event (hex; None for an event written before the chain): the log the
    rows were folded from;
``rows`` and ``digest``
    how many other rows the instance has, and the sum (modulo 2**256) of the SHA-256 of each
    row's key and document (its JSON with sorted keys): a row deleted, added, edited or rolled
    back changes them.

On a store with keys the manifest is sealed like every document (``projections._views._docseal``),
bound to its table and instance: nobody without the keys can write one that matches rows they
changed. On a plain store anyone who can write the database can recompute it; what such an
attacker can do to the views, and how ``verify`` catches it, is in ``docs/security.md``.

Checked on use. ``checked_rows`` checks the rows of an instance read whole against ``rows``
and ``digest``: every reader that trusts what a row says reads all of the instance's rows (the
``state``, ``history`` and ``blame`` views read them anyway; blame through the key index reads
the instance's index rows, positions only, rather than only the few it needs, since a row put
back from an older copy, sealed or not, keeps their number); ``check_count`` counts the rows of
an instance (an index range) for ``TimeTravel``, which reads a few snapshot rows, written once;
and ``check_anchor`` checks ``at`` and ``hash`` against the event hash the log holds at ``at`` (one
row read). A view that does not match is refused with ``LogIntegrityError`` (kind ``view
mismatch``), naming the view, the instance and what to do: rebuild the view from the log.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import orjson

from kernel import EventStore, LogIntegrityError
from projections._views._backends import Json, ViewBackend, ViewTx, decode_doc

__all__ = [
    "MANIFEST_KEY",
    "VIEW_MISMATCH",
    "Anchor",
    "check_anchor",
    "check_count",
    "check_written_at",
    "checked_rows",
    "update_manifests",
]

VIEW_MISMATCH = "view mismatch"
"""The ``kind`` of the ``LogIntegrityError`` of a view that does not match its rows or the log."""
MANIFEST_KEY = "#"
"""The row key of an instance's manifest in every view table (no other row key begins so)."""
_MODULUS = 1 << 256
Anchor = tuple[int, bytes | None]
"""An instance's last event folded: its stream position and its chain hash."""


def _row_digest(key: str, doc: Json) -> int:
    """A row's term of the digest: over its key and its document with sorted keys, so that two
    folds that built the same document in another order count it the same."""
    canonical = orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass") + b"\x00" + canonical).digest()
    return int.from_bytes(digest, "big")


def _empty() -> dict[str, Any]:
    return {"at": 0, "hash": None, "rows": 0, "digest": f"{0:064x}"}


def update_manifests(tx: ViewTx, table: str, anchors: Mapping[str, Anchor]) -> None:
    """Bring the manifests of the instances whose rows of ``table`` this transaction wrote up
    to date with those writes, and record each instance's ``anchors`` (its last event folded).
    Reads the rows' former documents in one batch (most are cached by the page's reads)."""
    written = {row: doc for row, doc in tx.written(table).items() if row[1] != MANIFEST_KEY}
    instances = sorted({instance for instance, _ in written} | set(anchors))
    before = tx.stored(table, [*written, *((i, MANIFEST_KEY) for i in instances)])
    manifests: dict[str, dict[str, Any]] = {}
    for instance in instances:
        stored = before.get((instance, MANIFEST_KEY))
        manifests[instance] = _empty() if stored is None else _decode(stored)
    sums = {i: int(m["digest"], 16) for i, m in manifests.items()}
    for (instance, key), doc in written.items():
        manifest = manifests[instance]
        old = before.get((instance, key))
        if old is not None:
            manifest["rows"] -= 1
            sums[instance] -= _row_digest(key, decode_doc(old))
        manifest["rows"] += 1
        sums[instance] += _row_digest(key, decode_doc(doc))
    for instance, manifest in manifests.items():
        manifest["digest"] = f"{sums[instance] % _MODULUS:064x}"
        if instance in anchors:
            at, digest = anchors[instance]
            manifest["at"], manifest["hash"] = at, None if digest is None else digest.hex()
        tx.put(table, instance, MANIFEST_KEY, manifest)


def _decode(stored: bytes) -> dict[str, Any]:
    manifest: dict[str, Any] = decode_doc(stored)
    return manifest


def _refused(view: str, instance_id: str, why: str, position: int = 0) -> LogIntegrityError:
    return LogIntegrityError(
        f"the {view} view of {instance_id!r} does not match the log: {why}; its answer is "
        f"refused. Rebuild the view from the log ('steplog rebuild {view}', or "
        f"Projector.rebuild({view!r})) and run 'steplog verify' to see what differed",
        instance_id=instance_id,
        position=position or None,
        kind=VIEW_MISMATCH,
    )


def checked_rows(view: str, instance_id: str, docs: Mapping[str, Json]) -> dict[str, Json]:
    """Every row of ``instance_id`` in a view (``docs``, as read, with its manifest), checked
    against the manifest; returned without it. No rows at all: the view has not seen the
    instance (an empty dict). Else ``LogIntegrityError`` when a row was deleted, added or
    changed, or the manifest is missing."""
    rows = {key: doc for key, doc in docs.items() if key != MANIFEST_KEY}
    manifest = docs.get(MANIFEST_KEY)
    if manifest is None:
        if rows:
            raise _refused(
                view,
                instance_id,
                "its rows have no manifest (it was deleted, or the view was built by an older "
                "steplog)",
            )
        return rows
    total = sum(_row_digest(key, doc) for key, doc in rows.items()) % _MODULUS
    if len(rows) != manifest["rows"] or f"{total:064x}" != manifest["digest"]:
        raise _refused(
            view,
            instance_id,
            f"it holds {len(rows)} rows where its manifest lists {manifest['rows']}"
            if len(rows) != manifest["rows"]
            else "a row was edited or replaced since the view wrote it",
            int(manifest["at"]),
        )
    return rows


def check_count(
    backend: ViewBackend, table: str, view: str, instance_id: str, manifest: Json | None
) -> None:
    """Check that ``instance_id`` has as many rows in ``table`` as its ``manifest`` lists
    (counted, not read), for readers that read only some rows, each written once and never
    rewritten, or whose older copy only makes the reader read more of the log (the snapshots
    view): a row deleted or added is seen, a row put back from an older copy is not."""
    counted = backend.count(table, instance_id)
    if manifest is None:
        if counted:
            raise _refused(
                view,
                instance_id,
                "its rows have no manifest (it was deleted, or the view was built by an older "
                "steplog)",
            )
        return
    if counted - 1 != manifest["rows"]:
        raise _refused(
            view,
            instance_id,
            f"it holds {counted - 1} rows where its manifest lists {manifest['rows']}: rows were "
            "deleted or added",
            int(manifest["at"]),
        )


def check_written_at(view: str, instance_id: str, manifest: Json | None, written_at: int) -> None:
    """Check that a row a view rewrites with every event it folds (its fold's own state, read
    by a catch-up to fold on from) was written at the ``at`` the ``manifest`` records: an older
    copy put back (sealed or not) would make the next catch-up build on a stale state."""
    if manifest is None or int(manifest["at"]) == written_at:
        return
    raise _refused(
        view,
        instance_id,
        f"its fold state was written at {instance_id!r}#{written_at} where its manifest says "
        f"#{manifest['at']} (an older copy was put back)",
        int(manifest["at"]),
    )


def check_anchor(store: EventStore, view: str, instance_id: str, manifest: Json | None) -> None:
    """Check that the event the ``manifest`` says its rows were folded up to is in the log, with
    the hash it recorded (one row read)."""
    if manifest is None or not manifest["at"]:
        return
    at = int(manifest["at"])
    found = store.event_hash(instance_id, at)
    recorded = manifest["hash"]
    if found is None and recorded is None:
        if store.version(instance_id) >= at:
            return  # an event from before the hash chain
        found_text = "no event there"
    elif found is not None and found.hex() == recorded:
        return
    else:
        found_text = "no event there" if found is None else "another event there"
    raise _refused(
        view,
        instance_id,
        f"it was folded from the log up to {instance_id!r}#{at}, and the log now holds "
        f"{found_text} (the log was cut or rewritten since, or the view was edited)",
        at,
    )
