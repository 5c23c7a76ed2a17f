"""steplog's benchmarks: ``python -m bench`` (see ``bench/README.md``).

Each benchmark module exposes ``BENCHMARK``: a list of cases (plain functions returning a
``Measurement``) with a named baseline; ``benchmarks()`` lists them in report order.
``resume`` is two benchmarks of one name (1,000 and 100,000 supersteps of history), so that
each size has its own ratios; ``--only resume`` runs both. ``steps`` likewise: its rates, and
its crash counts.
"""

from __future__ import annotations

from bench._core import Benchmark

__all__ = ["benchmarks"]


def benchmarks() -> list[Benchmark]:
    from bench import (
        chain,
        concurrent,
        fanout,
        loop,
        rebuild,
        reopen,
        resume,
        scaleout,
        steps,
        timetravel,
        ui,
    )

    return [
        loop.BENCHMARK,
        fanout.BENCHMARK,
        rebuild.BENCHMARK,
        timetravel.BENCHMARK,
        scaleout.BENCHMARK,
        concurrent.BENCHMARK,
        resume.BENCHMARK_SMALL,
        resume.BENCHMARK_LARGE,
        reopen.BENCHMARK,
        chain.BENCHMARK,
        ui.BENCHMARK,
        steps.BENCHMARK,
        steps.BENCHMARK_CRASH,
    ]
