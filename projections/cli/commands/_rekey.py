"""Encryption at rest: ``steplog keygen`` (a new key) and ``steplog rekey`` (every row, then every
view document, re-sealed with the first key; then the store compacted). Where the commands find
the keys is ``projections.cli._keys``'s."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson
from rich.console import Console

from kernel import KEYS_ENV, EventStore, Keyring, StoreConfigError, compact_store, rekey
from projections import backend_for, reseal_views
from projections.cli.commands import Command

__all__ = ["COMMANDS", "add_commands", "keygen"]


def add_commands(commands: Any) -> None:
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


COMMANDS: dict[str, Command] = {
    "keygen": lambda store, args, console: keygen(console, as_json=args.json),
    "rekey": rekey_command,
}
