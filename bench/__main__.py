"""``python -m bench``: run steplog's benchmarks and write docs/benchmarks-results.md.

    python -m bench                    # every benchmark, real sizes, median of 5
    python -m bench --smoke            # tiny sizes, asserts results, < 60 s
    python -m bench --smoke --strict   # and a skipped case fails too (CI: baselines must run)
    python -m bench --only loop        # one benchmark (loop, fanout, rebuild, timetravel, scaleout,
                                       # concurrent, resume, chain)
    python -m bench --only loop --case sqlite   # and only the cases whose name contains "sqlite"
    python -m bench --repeat 3

Exit status: 0 when every case that ran produced the right result; 1 when any case computed a
wrong result or raised (or, with ``--strict``, was skipped); 2 for bad arguments. Timings never
fail a run.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

from bench import benchmarks
from bench._core import DEFAULT_PG_URL, Config, Sizes
from bench._env import environment
from bench._rows import parse_shape
from bench._runner import render_markdown, render_rich, run_benchmark, summary_counts

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks-results.md"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    names = list(dict.fromkeys(b.name for b in benchmarks()))  # resume: two of one name
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes; assert results only")
    parser.add_argument(
        "--strict",
        action="store_true",
        help="a skipped case (bench extra or PostgreSQL missing) fails the run",
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="NAME",
        help=f"run only this benchmark (repeatable; one of {', '.join(names)})",
    )
    parser.add_argument("--case", metavar="TEXT", help="run only cases whose name contains TEXT")
    parser.add_argument(
        "--repeat", type=int, help="runs per case, median taken (default 5; smoke 1)"
    )
    parser.add_argument("--pg", default=DEFAULT_PG_URL, metavar="URL", help="PostgreSQL server")
    parser.add_argument(
        "--raw-shape",
        metavar="ROWSxBYTES",
        help="rows/superstep and state bytes/row of the raw loop baselines (default: steplog's)",
    )
    parser.add_argument(
        "--out", type=Path, help=f"markdown report (default {RESULTS} on full runs)"
    )
    parser.add_argument("--no-write", action="store_true", help="write no markdown report")
    parser.add_argument("--list", action="store_true", help="list benchmarks and cases, then exit")
    args = parser.parse_args(argv)
    for name in args.only:
        if name not in names:
            parser.error(f"unknown benchmark {name!r}; choose from {', '.join(names)}")
    if args.repeat is not None and args.repeat < 1:
        parser.error("--repeat must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)  # logs and CI: do not wrap the tables at 80 columns
    chosen = [b for b in benchmarks() if not args.only or b.name in args.only]
    if args.list:
        for b in chosen:
            console.print(f"[bold]{b.name}[/bold]: {b.title} (baseline: {b.baseline})")
            for c in b.cases:
                console.print(f"   {'steplog ' if c.steplog else 'baseline'}  {c.name}")
        return 0
    sizes = Sizes.smoke() if args.smoke else Sizes()
    repeat = args.repeat or (1 if args.smoke else 5)
    workdir = Path(tempfile.mkdtemp(prefix="steplog-bench-"))
    cfg = Config(sizes=sizes, smoke=args.smoke, repeat=repeat, workdir=workdir, pg_url=args.pg)
    if args.smoke:
        cfg.cache_dir = workdir / "cache"  # smoke logs are always generated afresh
    if args.raw_shape:
        cfg.shared["loop_shape_override"] = parse_shape(args.raw_shape)
    started = time.perf_counter()
    try:
        env = environment(cfg)
        for key, value in env:
            console.print(f"[dim]{key}:[/dim] {value}")
        results = [run_benchmark(b, cfg, console, args.case) for b in chosen]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    render_rich(console, env, results)
    out = args.out
    if out is None and not args.smoke and not args.only and not args.case:
        out = RESULTS
    if out is not None and not args.no_write:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(render_markdown(env, results, args.smoke))
        console.print(f"wrote {out}")
    counts = summary_counts(results)
    failed = [f"{r.benchmark.name}: {c.case.name}" for r in results for c in r.failed]
    if args.strict:
        failed += [
            f"{r.benchmark.name}: {c.case.name} (skipped under --strict)"
            for r in results
            for c in r.skipped
        ]
    console.print(
        f"{len(chosen)} benchmark(s) in {time.perf_counter() - started:.1f} s: "
        + ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    )
    if failed:
        console.print("[bold red]failed:[/bold red] " + "; ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
