"""Which process owns a run, and what became of it: ``host:pid`` owners and probing them.

A run records its owner in ``RunStarted.owner``. When a later run finds it unfinished in the log,
``presumed_reason`` says whether its process is provably gone (``crashed``) or not (``abandoned``).
Leases and recovery are to join it here.
"""

from __future__ import annotations

import os
import socket
import sys

from kernel._log._events import AbortReason

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
    if host != socket.gethostname() or not (pid_text.isascii() and pid_text.isdigit()):
        return "abandoned"
    pid = int(pid_text)
    if pid == os.getpid() or sys.platform == "win32":  # os.kill(pid, 0) is no probe on Windows
        return "abandoned"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "crashed"
    except (OSError, OverflowError, ValueError):  # not ours to signal, or not a possible pid
        return "abandoned"
    return "abandoned"
