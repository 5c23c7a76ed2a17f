"""The ``steplog`` command: an application on top of ``kernel`` and ``projections``.

It uses only their public APIs, like any other program would; see ``docs/cli.md``.
"""

from projections.cli._commands import main

__all__ = ["main"]
