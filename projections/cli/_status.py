"""The ``steplog`` command's exit statuses, and how an error becomes one: said in one line on
standard error (never a traceback, unless ``--debug``).

Every command returns one of these (``EXIT_PROBLEM`` when it found a problem); the errors it
raises are turned into the others by ``failed``.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence

from kernel import (
    ChainProblem,
    DecodeError,
    LogIntegrityError,
    SchemaVersionError,
    StepLogError,
    StoreUnavailableError,
)
from projections._frontend._render import broken_chain_text, read_error_text
from projections._frontend._safe import SafeConsole, cell

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_BROKEN_CHAIN",
    "EXIT_CLOSED_PIPE",
    "EXIT_INTERNAL",
    "EXIT_NEWER_SCHEMA",
    "EXIT_PROBLEM",
    "EXIT_STORE",
    "complain",
    "complain_broken",
    "failed",
    "label_broken",
    "unexpected",
]

EXIT_PROBLEM = 1
"""A command found a problem: the demo found a leak, ``verify`` a difference, ``bisect`` nothing."""
EXIT_BAD_INPUT = 2
"""Bad input: an unknown instance, key, view or point, a bad store URL, a log it cannot read."""
EXIT_STORE = 3
"""The store does not exist (a reading command never creates one) or cannot be reached."""
EXIT_BROKEN_CHAIN = 4
"""The log's hash chain is broken: ``verify`` found a problem (or a saved head's signature does
not match), or a command met one while reading without ``--allow-broken-chain``."""
EXIT_NEWER_SCHEMA = 5
"""The store (its database, or a row) was written by a newer steplog: upgrade steplog."""
EXIT_INTERNAL = 70
"""An unexpected error (a bug): one line on standard error; ``--debug`` shows the traceback."""
EXIT_CLOSED_PIPE = 128 + signal.SIGPIPE
"""Standard output was closed by its reader (``steplog log X | head -1``): the command stopped
quietly, with the status of a Unix tool killed by SIGPIPE (141), and printed nothing more."""


def failed(error: StepLogError) -> int:
    """Say what went wrong in one line on standard error; return the exit status for it."""
    if isinstance(error, LogIntegrityError):
        complain_broken(error)
        return EXIT_BROKEN_CHAIN
    if isinstance(error, StoreUnavailableError):
        complain(error)  # (the store's errors show its URL masked)
        return EXIT_STORE
    if isinstance(error, SchemaVersionError):
        complain(error)  # (its message says to upgrade steplog)
        return EXIT_NEWER_SCHEMA
    if isinstance(error, DecodeError):  # (a missing key's says which key to give, and how)
        complain(DecodeError(read_error_text(error)))
        return EXIT_BAD_INPUT
    complain(error)  # bad input
    return EXIT_BAD_INPUT


def unexpected(error: Exception, *, debug: bool) -> int:
    if debug:
        raise error
    complain(StepLogError(f"unexpected {type(error).__name__}: {error} (--debug shows where)"))
    return EXIT_INTERNAL


def complain(error: StepLogError) -> None:
    """One line on standard error (never wrapped: scripts grep it)."""
    text = " ".join(str(error).split())
    SafeConsole(stderr=True, highlight=False).print(
        f"[bold red]steplog:[/] {cell(text)}", soft_wrap=True
    )


def complain_broken(error: LogIntegrityError) -> None:
    """The one line a command that met a broken chain prints (no traceback)."""
    complain(
        LogIntegrityError(
            broken_chain_text(error, also="--allow-broken-chain reads the log anyway")
        )
    )


def label_broken(problems: Sequence[ChainProblem]) -> None:
    """After a command run with ``--allow-broken-chain``: say on standard error (never on
    standard output, which may be one JSON document) that what it showed may have been altered."""
    if not problems:
        return
    first = problems[0]
    more = f" and {len(problems) - 1} more place(s)" if len(problems) > 1 else ""
    where = f"{first.instance_id!r}#{first.position}" if first.instance_id else "its meta table"
    SafeConsole(stderr=True, highlight=False).print(
        f"WARNING: this log's hash chain is broken at {where} "
        f"({first.kind}){more}; what was shown may have been altered ('steplog verify' lists "
        "every problem)",
        markup=False,
        soft_wrap=True,
    )
