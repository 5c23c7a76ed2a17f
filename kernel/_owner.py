"""Which process owns a run, and what became of it: ``host:pid`` owners and probing them.

A run records its owner in ``RunStarted.owner``. When a later run finds it unfinished in the log,
``presumed_reason`` says whether its process is provably gone (``crashed``) or not (``abandoned``).
Leases and recovery build on this module.
"""

from __future__ import annotations

import os
import socket

from kernel._events import AbortReason

__all__ = ["presumed_reason", "process_owner"]


def process_owner() -> str:
    """``host:pid`` of this process, recorded in ``RunStarted.owner``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def presumed_reason(owner: str) -> AbortReason:
    """Presume why a run stopped: crashed if its process is provably gone, else abandoned.

    Provably gone means: the owner is a process of this host, not this process, and no process
    with its pid exists. Any other owner (another host, an unreadable one, a live pid) is
    ``abandoned``.
    """
    host, _, pid_text = owner.rpartition(":")
    if host != socket.gethostname() or not pid_text.isdigit():
        return "abandoned"
    pid = int(pid_text)
    if pid == os.getpid():
        return "abandoned"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "crashed"
    except PermissionError:
        return "abandoned"
    return "abandoned"
