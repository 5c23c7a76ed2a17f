"""``steplog runs`` and ``steplog log`` on one instance of about 1M events: time to the first
byte on standard output, total time, and the peak memory (max RSS) of the command's process.

    python -m bench.cli_stream [--supersteps 142858] [--only TEXT]

The log (``bench._logs``: 7 events per superstep, runs of 100 supersteps, every fifth failing)
is generated once into ``bench/.cache/``. Each command runs as its own process, its standard
output read through a pipe (so ``log`` streams JSON lines, as a script reading it would see it);
``log --limit`` shows that the first page needs no full read (with the default redaction too:
the run starts are found by their rows' bytes); ``show`` reads one run's window. Nothing here is
asserted.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from bench._logs import LogSpec, ensure_log
from kernel import open_store

__all__ = ["main", "measure"]

CACHE = Path(__file__).resolve().parent / ".cache"
_MAIN = "import sys; from projections.cli import main; raise SystemExit(main(sys.argv[1:]))"


def measure(argv: list[str]) -> tuple[float, float, int, float]:
    """Run ``steplog ARGV``: (seconds to its first byte of output, seconds in all, bytes of
    output, peak RSS of the child in MiB)."""
    started = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-c", _MAIN, *argv],
        stdout=subprocess.PIPE,
        env={**os.environ, "COLUMNS": "120"},
    )
    assert child.stdout is not None
    first = child.stdout.read(1)
    first_at = time.perf_counter() - started
    size = len(first)
    while chunk := child.stdout.read(1 << 16):
        size += len(chunk)
    _, _, usage = os.wait4(child.pid, 0)
    total = time.perf_counter() - started
    return first_at, total, size, usage.ru_maxrss / 1024


def _middle_run(url: str, instance: str) -> str:
    """The id of a run in the middle of ``instance`` (read from one window, so that this
    process stays small: a child's peak RSS counts what it was forked with)."""
    with open_store(url, create=False) as store:
        middle = store.version(instance) // 2
        starts = store.read(instance, after=middle, upto=middle + 5000, types=["run_started"])
    return getattr(starts[0], "run_id", "")


def main(args: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.cli_stream")
    parser.add_argument("--supersteps", type=int, default=142_858, help="7 events each")
    parser.add_argument("--only", default=None, help="only the cases whose command has this")
    options = parser.parse_args(args)
    spec = LogSpec(name="cli", instances=1, supersteps=options.supersteps, run_length=100)
    path, meta, generated = ensure_log(spec, CACHE)
    url = f"sqlite:///{path}"
    instance = f"{spec.name}-0000"
    print(f"log: {path.name} ({meta.get('events', '?')} events; generated now: {generated})")
    middle = _middle_run(url, instance)
    cases = [
        ["instances"],  # the baseline: starting Python, importing steplog, opening the store
        ["runs", instance, "--json"],
        ["runs", instance],
        ["log", instance, "--json", "--limit", "1000"],  # the default redaction
        ["log", instance, "--limit", "1000"],
        ["log", instance, "--json", "--limit", "1000", "--reveal"],
        ["log", instance, "--limit", "1000", "--reveal"],
        ["log", instance, "--json", "--reveal"],
        ["log", instance, "--json"],
        ["show", middle],
        ["show", middle, "--json"],
        ["history", instance, "--json"],
        ["history", instance],
    ]
    for case in cases:
        if options.only is not None and options.only not in " ".join(case):
            continue
        first, total, size, peak = measure(["--store", url, *case])
        print(
            f"steplog {' '.join(case):<40} first byte {first:6.2f} s  all {total:7.2f} s  "
            f"{size / 1e6:8.1f} MB out  peak RSS {peak:6.0f} MiB"
        )


if __name__ == "__main__":
    main()
