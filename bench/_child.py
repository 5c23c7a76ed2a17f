"""Runs one measurement in a fresh interpreter, for its peak memory.

``python -m bench._child '{"fn": "bench.rebuild:steplog_fold", "args": {...}}'`` imports the
function, calls it with ``args``, and prints one JSON line: the function's result plus
``peak_rss_mb`` (``VmHWM`` from ``/proc/self/status`` at the end: the high-water mark of the
process's resident memory, C allocations such as SQLite's page cache included) and
``base_rss_mb`` (the resident set after imports, before the function runs).

Why not ``getrusage``: Linux carries ``ru_maxrss`` across ``execve``, so a child's reading is at
least the parent's size when it forked (the harness's own ~70 MB would mask every case), and
``RUSAGE_CHILDREN`` in the parent is the largest child ever waited for. ``VmHWM`` belongs to the
child's own address space. Why not tracemalloc: it sees only Python's allocator, misses SQLite's
and orjson's C buffers, and slows the fold.
"""

from __future__ import annotations

import importlib
import json
import os
import resource
import subprocess
import sys
from typing import Any

__all__ = ["run_in_child"]


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mb() -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # not Linux: upper bound


def run_in_child(fn: str, args: dict[str, Any], timeout: float = 600) -> dict[str, Any]:
    """Call ``module:function(**args)`` in a new interpreter; its JSON result with memory."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run(
        [sys.executable, "-m", "bench._child", json.dumps({"fn": fn, "args": args})],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=root,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"child {fn} exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    if "error" in result:
        kind, message = result["error"]
        if kind in ("Skipped", "WrongResult"):
            from bench import _core

            raise getattr(_core, kind)(message)
        raise RuntimeError(f"child {fn}: {kind}: {message}")
    return result


def main() -> None:
    spec = json.loads(sys.argv[1])
    module_name, _, name = spec["fn"].partition(":")
    fn = getattr(importlib.import_module(module_name), name)
    import kernel  # noqa: F401 - import cost is not the function's memory

    base = _rss_mb()
    try:
        result = fn(**spec["args"])
    except Exception as error:
        result = {"error": [type(error).__name__, str(error)]}
    result["base_rss_mb"] = base
    result["peak_rss_mb"] = _peak_mb()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
