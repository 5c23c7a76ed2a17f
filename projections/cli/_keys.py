"""The CLI's keys: where commands find them (``keygen`` and ``rekey`` are ``commands._rekey``).

Every command opens the store with the keys in ``--keys-file FILE`` (a file holding the same
text as ``STEPLOG_KEYS``: base64 keys separated by commas, spaces or lines, the sealing one
first; ``Keyring.from_text`` reads both), else in ``$STEPLOG_KEYS``, else none. There is no
option that takes a key itself: a command line is visible to every user of the machine (``ps``),
a file readable only by its owner is not.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Literal

from rich.console import Console

from kernel import FROM_ENV, KEYS_ENV, EventStore, Keyring, StoreConfigError

__all__ = ["add_keys_option", "keyring_of", "warn_if_plain"]


def add_keys_option(parser: argparse.ArgumentParser) -> None:
    """The global ``--keys-file`` option."""
    parser.add_argument(
        "--keys-file",
        default=None,
        metavar="FILE",
        help=f"a file holding the store's keys, as ${KEYS_ENV} does (default: ${KEYS_ENV})",
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
