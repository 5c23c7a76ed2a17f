"""Stored text made safe to show: the log is untrusted input, and what it holds reaches the
terminal of whoever reads it.

An instance id, a key, an executor id or an error message may hold terminal escapes (``ESC[2J``
clears the screen, ``ESC]0;...BEL`` retitles the window), other control characters (a newline
forges a line of output; rich drops ``\\r`` and ``\\b`` silently), or bidi controls (``U+202E``
shows text backwards). ``visible`` is the one place they are escaped: every command prints
stored text through it (``cell`` for a rich markup string, which also escapes markup), and
``SafeConsole`` passes every string it renders through it as well, keeping only its own line
breaks. ``--json`` output escapes the same characters as JSON ``\\uXXXX`` escapes
(``json_safe``), so a JSON document stays the same document and is safe on a terminal too.
"""

from __future__ import annotations

import re
from typing import Any

import orjson
from rich.console import Console
from rich.markup import escape
from rich.text import Text

__all__ = ["UNSAFE", "SafeConsole", "cell", "json_safe", "json_text", "visible"]

UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
"""The characters never shown as they are: C0 controls (newline and tab too), DEL, C1 controls,
the bidi marks, embeddings, overrides and isolates, and the line and paragraph separators."""


def visible(text: str, *, keep: str = "", as_json: bool = False) -> str:
    """``text`` with each character of ``UNSAFE`` (but those in ``keep``) escaped visibly:
    ``\\x1b``, ``\\n``, ``\\u202e`` (as Python writes them); with ``as_json``, as JSON writes
    them (``\\u001b``), for JSON text."""

    def escaped(found: re.Match[str]) -> str:
        code = ord(found[0])
        if found[0] in keep:
            return found[0]
        if as_json or code > 0xFF:
            return f"\\u{code:04x}"
        return _NAMED.get(found[0], f"\\x{code:02x}")

    return UNSAFE.sub(escaped, text)


_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def cell(text: str) -> str:
    """Stored text as a piece of a rich markup string (a table cell, a title): made
    ``visible``, and its markup escaped (``[bold]`` in a key is shown, never applied)."""
    return escape(visible(text))


def json_safe(text: str) -> str:
    """JSON text (orjson's, which escapes C0 controls in strings) with every other ``UNSAFE``
    character escaped as ``\\uXXXX``: the same JSON value, safe on a terminal. (Outside its
    strings JSON text is ASCII, whose only controls are the whitespace between tokens: kept.)"""
    return visible(text, keep="\n\r\t", as_json=True)


class SafeConsole(Console):
    """A rich console that shows every string it renders ``visible`` but for line breaks:
    stored text a command did not escape itself never reaches the terminal raw. Emoji codes are
    not replaced (``:warning:`` in a key is shown as it is). A closed standard output raises
    ``BrokenPipeError`` (rich's own handler would exit 1): the command ends quietly, as ``main``
    decides."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("emoji", False)
        super().__init__(*args, **kwargs)

    def render_str(self, text: str, **options: Any) -> Text:
        return super().render_str(visible(text, keep="\n"), **options)

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


def json_text(document: Any, option: int = 0) -> str:
    """``document`` as JSON text (orjson ``option``s; datetimes as ISO 8601), safe on a
    terminal: every control or bidi character of its strings escaped (``\\uXXXX``)."""
    return json_safe(orjson.dumps(document, option=option).decode())
