"""Injectable clock and id factories.

The defaults read ``datetime.now(UTC)`` and ``os.urandom`` at call time (never at import time), so
freezegun controls the clock and tests can swap either for a deterministic factory.
"""

from __future__ import annotations

import base64
import itertools
import os
from collections.abc import Callable
from datetime import UTC, datetime

__all__ = ["Clock", "IdFactory", "counter_ids", "system_clock", "uuid_ids"]

Clock = Callable[[], datetime]
IdFactory = Callable[[], str]


def system_clock() -> datetime:
    """The current time, timezone-aware in UTC."""
    return datetime.now(UTC)


def uuid_ids() -> str:
    """A fresh random identifier: 22 URL-safe characters (base64url, no padding), never beginning
    with ``-``, so that it can be given to a command line as it is (``steplog respond RUN REQ``)
    without being read as an option. An id drawn with a leading ``-`` is drawn again: that keeps
    every id uniform over the others, at 127.9 random bits."""
    while True:
        text = base64.urlsafe_b64encode(os.urandom(16))[:22].decode("ascii")
        if not text.startswith("-"):
            return text


def counter_ids(prefix: str = "id") -> IdFactory:
    """A deterministic id factory for tests: ``prefix-1``, ``prefix-2``, ..."""
    counter = itertools.count(1)
    return lambda: f"{prefix}-{next(counter)}"
