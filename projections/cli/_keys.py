"""The CLI's keys: where commands find them, ``steplog keygen`` and ``steplog rekey``.

Every command opens the store with the keys in ``--keys-file FILE`` (a file holding the same
text as ``STEPLOG_KEYS``: base64 keys separated by commas, spaces or lines, the sealing one
first; ``Keyring.from_text`` reads both), else in ``$STEPLOG_KEYS``, else none. There is no
option that takes a key itself: a command line is visible to every user of the machine (``ps``),
a file readable only by its owner is not.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Literal

import orjson
from rich.console import Console

from kernel import (
    FROM_ENV,
    KEYS_ENV,
    EventStore,
    Keyring,
    StoreConfigError,
    compact_store,
    rekey,
)
from projections._views._backend_for import backend_for
from projections._views._reseal import reseal_views

__all__ = [
    "add_key_commands",
    "add_keys_option",
    "keygen",
    "keyring_of",
    "rekey_command",
    "warn_if_plain",
]


def add_keys_option(parser: argparse.ArgumentParser) -> None:
    """The global ``--keys-file`` option."""
    parser.add_argument(
        "--keys-file",
        default=None,
        metavar="FILE",
        help=f"a file holding the store's keys, as ${KEYS_ENV} does (default: ${KEYS_ENV})",
    )


def add_key_commands(commands: Any) -> None:
    """The ``keygen`` and ``rekey`` subcommands."""
    commands.add_parser("keygen", help="print a new random key (base64) for encryption at rest")
    rekeying = commands.add_parser(
        "rekey", help="re-seal every row and view document with the first key"
    )
    rekeying.add_argument(
        "--rows-per-transaction",
        type=int,
        default=500,
        metavar="N",
        help="rows (and documents) read per page, rewritten in one transaction (default 500)",
    )
    rekeying.add_argument(
        "--no-compact",
        action="store_true",
        help="do not VACUUM afterwards (old row versions stay in the files until then)",
    )


def keyring_of(args: argparse.Namespace) -> Keyring | Literal["env"]:
    """The keys ``--keys-file`` gives; without it ``FROM_ENV``, for ``open_store`` to take the
    keys of ``$STEPLOG_KEYS`` by its own rule. A file that cannot be read, or text that is not
    keys, is a ``StoreConfigError`` that shows neither the text nor the file's name (which could
    be a key typed in its place)."""
    path = getattr(args, "keys_file", None)
    if path is None:
        return FROM_ENV
    try:
        text = Path(path).read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) else "it is not ASCII text"
        raise StoreConfigError(
            f"cannot read the keys file given with --keys-file: {reason or error}"
        ) from None
    if not text.strip():
        raise StoreConfigError("the keys file given with --keys-file holds no key")
    return Keyring.from_text(text, source="the keys file given with --keys-file")


def warn_if_plain(store: EventStore) -> None:
    """One line on standard error when keys were given for a store that holds rows in plain
    text (never encrypted, or written before its first key): the keys protect nothing there, and
    a wrong key would otherwise pass unnoticed. Cheap: the store's mark and its first row."""
    if store.keyring is None or not store.holds_plain_rows():
        return
    Console(stderr=True, highlight=False).print(
        f"WARNING: keys were given, but {store.url} holds rows in plain text (it was never "
        "encrypted, or they were written before its first key): the keys protect nothing there; "
        "'steplog rekey' seals them",
        markup=False,
        soft_wrap=True,
    )


def keygen(console: Console, *, as_json: bool = False) -> int:
    """Print a new key (with ``as_json``: as ``{"key": KEY}``)."""
    key = Keyring.generate()
    if as_json:
        sys.stdout.write(orjson.dumps({"key": key}).decode() + "\n")
        return 0
    console.print(key, markup=False, highlight=False)
    return 0


def rekey_command(store: EventStore, args: argparse.Namespace, console: Console) -> int:
    """Re-seal every event row, then every view document, with the first key; then compact."""
    if store.keyring is None:
        raise StoreConfigError(
            f"rekey needs the keys: the new key first, then the old ones, in --keys-file or "
            f"${KEYS_ENV}"
        )
    rows = rekey(store, rows_per_transaction=args.rows_per_transaction)
    console.print(
        f"event rows: {rows.rows} read, {rows.resealed} re-sealed from an older key, "
        f"{rows.sealed} plain rows sealed ({rows.converted} of them one-event rows of the first "
        f"format), {rows.current} already sealed with key {rows.key}, "
        f"{rows.changed_meanwhile} changed by another process meanwhile; "
        f"{rows.transactions} write transactions",
        markup=False,
    )
    if rows.marked:
        console.print("the store is now marked encrypted: writers without keys are refused")
    docs = reseal_views(
        backend_for(store), store.keyring, rows_per_transaction=args.rows_per_transaction
    )
    console.print(
        f"view documents: {docs.documents} read in {docs.tables} tables, {docs.rewritten} "
        f"sealed with key {rows.key}, {docs.changed_meanwhile} changed by another process "
        f"meanwhile; {docs.transactions} write transactions",
        markup=False,
    )
    compacted = bool((rows.written or docs.rewritten) and not args.no_compact)
    if compacted:
        compact_store(store, tables=docs.table_names)
        console.print("compacted: the old rows' bytes are gone from the store's files")
    if getattr(args, "json", False):
        document = {
            "rows": {
                "read": rows.rows,
                "resealed": rows.resealed,
                "sealed": rows.sealed,
                "current": rows.current,
                "changed_meanwhile": rows.changed_meanwhile,
                "transactions": rows.transactions,
            },
            "documents": {
                "read": docs.documents,
                "rewritten": docs.rewritten,
                "changed_meanwhile": docs.changed_meanwhile,
                "transactions": docs.transactions,
            },
            "key": rows.key,
            "compacted": compacted,
        }
        sys.stdout.write(orjson.dumps(document).decode() + "\n")
    return 0
