"""steplog's benchmarks: ``python -m bench`` (see ``bench/README.md``).

Each benchmark module exposes ``BENCHMARK``: a list of cases (plain functions returning a
``Measurement``) with a named baseline; ``benchmarks()`` lists them in report order.
"""

from __future__ import annotations

from bench._core import Benchmark

__all__ = ["benchmarks"]


def benchmarks() -> list[Benchmark]:
    from bench import fanout, loop, rebuild, scaleout, timetravel

    return [
        loop.BENCHMARK,
        fanout.BENCHMARK,
        rebuild.BENCHMARK,
        timetravel.BENCHMARK,
        scaleout.BENCHMARK,
    ]
