"""The harness's vocabulary: sizes, configuration, cases, targets and what a case returns.

A *case* is a plain function ``fn(cfg) -> Measurement``. It builds what it needs, times only the
work being compared, checks that the work produced the right result (raising ``WrongResult``
otherwise), and cleans up. It raises ``Skipped`` when an optional dependency (the bench extra, a
PostgreSQL server) is missing.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = [
    "DEFAULT_PG_URL",
    "Benchmark",
    "Case",
    "Config",
    "Measurement",
    "Sizes",
    "Skipped",
    "Target",
    "WrongResult",
    "bench_extra",
    "expect",
]

DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
BENCH_DIR = Path(__file__).resolve().parent
CACHE_DIR = BENCH_DIR / ".cache"


class Skipped(Exception):
    """An optional dependency of this case is missing (shown as a visible note)."""


class WrongResult(AssertionError):
    """A case computed a wrong result: the run fails, whatever the timings."""


def expect(actual: Any, expected: Any, what: str) -> None:
    """Raise ``WrongResult`` unless ``actual == expected``."""
    if actual != expected:
        a, e = repr(actual), repr(expected)
        raise WrongResult(f"{what}: got {a[:300]}, expected {e[:300]}")


def bench_extra(module: str) -> ModuleType:
    """``bench.<module>``, whose imports need the bench extra; ``Skipped`` when they fail."""
    try:
        return importlib.import_module(f"bench.{module}")
    except ImportError as error:
        raise Skipped(f"bench extra not installed (pip install -e '.[bench]'): {error}") from None


@dataclass(frozen=True)
class Sizes:
    """Problem sizes. ``Sizes()`` are the real ones the issue names; ``Sizes.smoke()`` tiny ones."""

    loop_n: int = 2000
    fanout_rounds: int = 150
    fanout_width: int = 16
    fanout_keys: int = 4
    rebuild_events: int = 1_000_000
    rebuild_instances: int = 10
    tt_supersteps: int = 100_000
    tt_samples: int = 15
    tt_fold_samples: int = 2
    scale_supersteps: int = 1000
    scale_workers: tuple[int, ...] = (1, 2, 4)
    concurrent_supersteps: int = 2560
    """All instances' supersteps together, split evenly (64 instances: 40 each)."""
    floor_syncs: int = 1000
    chain_events: int = 100_000
    chain_instances: int = 4
    steps_n: int = 1000
    """Recorded steps per case of the steps benchmark (loop supersteps, or calls in a handler)."""

    @classmethod
    def smoke(cls) -> Sizes:
        return cls(
            loop_n=20,
            fanout_rounds=5,
            rebuild_events=3000,
            rebuild_instances=3,
            tt_supersteps=200,
            tt_samples=3,
            tt_fold_samples=1,
            scale_supersteps=20,
            concurrent_supersteps=128,
            floor_syncs=30,
            chain_events=3000,
            chain_instances=2,
            steps_n=20,
        )


@dataclass
class Config:
    """Everything a case may read. One per ``python -m bench`` invocation."""

    sizes: Sizes
    smoke: bool
    repeat: int
    workdir: Path
    cache_dir: Path = CACHE_DIR
    pg_url: str = DEFAULT_PG_URL
    ci: bool = field(default_factory=lambda: os.environ.get("CI", "").lower() == "true")
    # Filled by benchmark ``prepare`` hooks (e.g. the raw baselines' row shape, cached log paths).
    shared: dict[str, Any] = field(default_factory=dict)


@dataclass
class Measurement:
    """One run of one case.

    ``value`` is the benchmark's headline metric (a rate, or a latency in ms). ``bytes_per_step``
    is the growth on disk per superstep for durable stores. ``extra`` holds further columns
    (peak memory, lag, events/s ...), keyed by the names in ``Benchmark.extra_columns``.
    """

    value: float
    bytes_per_step: float | None = None
    extra: dict[str, float] = field(default_factory=dict)
    note: str = ""


CaseFn = Callable[[Config], Measurement]


@dataclass(frozen=True)
class Case:
    name: str
    fn: CaseFn
    steplog: bool = False
    """True for the cases that measure steplog itself (the others are baselines)."""


@dataclass(frozen=True)
class Target:
    """A goal from the issue, checked (and reported, never asserted) on the medians.

    With ``baseline`` set, the ratio ``case / baseline`` of ``metric`` must satisfy ``op value``;
    without it, the case's own ``metric`` must. ``metric`` is ``"value"``, ``"bytes"`` or an
    ``extra`` key.
    """

    text: str
    case: str
    op: str  # ">=" or "<="
    value: float
    baseline: str | None = None
    metric: str = "value"


@dataclass
class Benchmark:
    name: str
    title: str
    description: str
    metric: str  # the headline column, e.g. "supersteps/s" or "median ms"
    higher_is_better: bool
    baseline: str
    """The case every other case's ratio column is computed against."""
    cases: list[Case]
    targets: list[Target] = field(default_factory=list)
    extra_columns: list[tuple[str, str]] = field(default_factory=list)
    """(key in Measurement.extra, column header)."""
    show_bytes: bool = False
    bytes_header: str = "bytes/superstep"
    warmup: bool = False
    """Run every case once at smoke sizes, untimed, before the timed runs."""
    max_repeat: int | None = None
    """Caps ``--repeat`` for benchmarks whose single run is long."""
    prepare: Callable[[Config], str | None] | None = None
    """Runs once before the cases (builds cached logs, calibrates row shapes); may return a note."""
