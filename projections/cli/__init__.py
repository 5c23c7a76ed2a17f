"""The ``steplog`` command: an application on top of ``kernel`` and ``projections``.

It uses only their public APIs, like any other program would; see ``docs/cli.md``.
"""

from projections.cli._json import schema_of
from projections.cli._main import COMMANDS, READING_COMMANDS, WRITING_COMMANDS, main
from projections.cli._status import (
    EXIT_BAD_INPUT,
    EXIT_BROKEN_CHAIN,
    EXIT_CLOSED_PIPE,
    EXIT_INTERNAL,
    EXIT_NEWER_SCHEMA,
    EXIT_PROBLEM,
    EXIT_STORE,
)

__all__ = [
    "COMMANDS",
    "EXIT_BAD_INPUT",
    "EXIT_BROKEN_CHAIN",
    "EXIT_CLOSED_PIPE",
    "EXIT_INTERNAL",
    "EXIT_NEWER_SCHEMA",
    "EXIT_PROBLEM",
    "EXIT_STORE",
    "READING_COMMANDS",
    "WRITING_COMMANDS",
    "main",
    "schema_of",
]
