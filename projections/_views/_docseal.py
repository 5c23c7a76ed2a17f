"""Encryption at rest of view documents: how a store's keyring seals what views keep.

Materialized views keep copies of state values, inputs, outputs, messages and error texts in the
event store's own database, so on a store opened with a keyring (``open_store(keyring=...)``)
the SQL view backends seal every document they write with the store's ``Keyring``, and open it
when they read it. Without a keyring nothing changes: documents are plain JSON text.

A sealed document is stored as ``~`` followed by the standard base64 of the sealed bytes (no JSON
text begins with ``~``). The seal is bound to its place: the view's table (without the
``__shadow`` or ``__verify`` suffix of a rebuild's or a verify's scratch table, which is renamed
into place), the instance id and the row key, so a document copied to another row does not open
(``LogIntegrityError``). The instance id and the row key (run ids, superstep ids, state key
names, positions) stay plain: readers look rows up by them.

Re-sealing a store's view documents with a newer key (``steplog rekey``) is
``_views._reseal``'s job.
"""

from __future__ import annotations

import base64
import binascii

from kernel import (
    KEYS_ENV,
    Keyring,
    LogIntegrityError,
    MissingKeyError,
)

__all__ = ["MAGIC_AND_KEY", "SEALED_DOC", "doc_place", "open_doc", "seal_doc", "sealed_bytes"]

SEALED_DOC = "~"
"""How a sealed document's stored text begins."""
_SCRATCH = ("__shadow", "__verify")
MAGIC_AND_KEY = 12
"""The sealed value's magic (4 bytes) and key fingerprint (8 bytes), before its nonce."""


def doc_place(table: str, instance_id: str, key: str) -> bytes:
    """What a sealed document is bound to: its view's table (a scratch table's suffix left
    out), its instance and its row key."""
    for suffix in _SCRATCH:
        if table.endswith(suffix):
            table = table[: -len(suffix)]
            break
    return b"\x00".join(
        (
            b"view",
            table.encode(),
            instance_id.encode("utf-8", "surrogatepass"),
            key.encode("utf-8", "surrogatepass"),
        )
    )


def seal_doc(keyring: Keyring, plain: bytes, table: str, instance_id: str, key: str) -> str:
    """The stored text of a document (its JSON bytes ``plain``) sealed with the current key."""
    sealed = keyring.seal(plain, doc_place(table, instance_id, key))
    return SEALED_DOC + base64.b64encode(sealed).decode("ascii")


def sealed_bytes(stored: str, where: str) -> bytes:
    """The sealed bytes of a stored sealed document (``LogIntegrityError`` if not base64)."""
    try:
        return base64.b64decode(stored[len(SEALED_DOC) :], validate=True)
    except (binascii.Error, ValueError):
        raise LogIntegrityError(f"{where} is not a whole encrypted document") from None


def open_doc(
    keyring: Keyring | None, stored: str, table: str, instance_id: str, key: str
) -> str | bytes:
    """The JSON text of a stored document: ``stored`` itself when it is plain, else opened with
    ``keyring``. A sealed document read without keys, or sealed with a key not in the keyring,
    is a ``MissingKeyError`` (a ``DecodeError``); one altered or moved to another row, a
    ``LogIntegrityError``."""
    if not stored.startswith(SEALED_DOC):
        return stored
    where = f"view document {table} {instance_id!r}/{key!r}"
    sealed = sealed_bytes(stored, where)
    if keyring is None:
        raise MissingKeyError(
            f"{where} is encrypted; open the store with its keys ({KEYS_ENV}=... or "
            "open_store(url, keyring=Keyring.from_text(...)))",
            where=where,
            key=Keyring.fingerprint_of(sealed),
        )
    return keyring.open(sealed, doc_place(table, instance_id, key), where)
