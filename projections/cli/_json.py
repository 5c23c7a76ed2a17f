"""The ``--json`` output: one JSON document on standard output (JSON lines for streams), each
command's shape described by a JSON Schema shipped in ``projections/cli/schemas/COMMAND.json``.

With ``--json`` nothing else goes to standard output: the tables a command would print go to a
console that writes nowhere, and errors and warnings go to standard error, as always. Stored text
in a document is escaped as JSON escapes it: control characters by orjson, DEL, C1 controls and
bidi controls by ``json_text`` (``projections._frontend._safe``), so no raw one reaches a terminal.
"""

from __future__ import annotations

import io
import sys
from importlib import resources
from typing import Any

import orjson
from rich.console import Console

from projections._frontend._safe import SafeConsole, json_text

__all__ = ["emit", "emit_line", "quiet_console", "schema_of"]


def emit(document: Any) -> None:
    """Write ``document`` as one line of JSON on standard output (datetimes as ISO 8601)."""
    sys.stdout.write(json_text(document, orjson.OPT_NON_STR_KEYS) + "\n")


def emit_line(document: Any) -> None:
    """One line of a JSON-lines stream, flushed at once (a reader sees it as it comes)."""
    emit(document)
    sys.stdout.flush()


def quiet_console() -> Console:
    """A console that prints nowhere: what a command shows in tables is dropped under --json."""
    return SafeConsole(file=io.StringIO(), highlight=False)


def schema_of(command: str) -> dict[str, Any]:
    """The JSON Schema of ``command``'s ``--json`` output (for a stream: of each line)."""
    text = resources.files("projections.cli").joinpath("schemas", f"{command}.json").read_bytes()
    schema: dict[str, Any] = orjson.loads(text)
    return schema
