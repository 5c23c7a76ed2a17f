"""Small timing helpers."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["timed", "timed_async", "timed_async_cpu", "timed_cpu"]


def timed_cpu(fn: Callable[[], T]) -> tuple[T, float, float]:
    """``(fn(), seconds, cpu seconds)``, after a full collection so earlier cases' garbage is not
    billed. CPU is the process's (``time.process_time``: user + system, every thread)."""
    gc.collect()
    start, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - start, time.process_time() - cpu


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    """``(fn(), seconds)``, as ``timed_cpu``."""
    result, seconds, _ = timed_cpu(fn)
    return result, seconds


def timed_async_cpu(make: Callable[[], Awaitable[T]]) -> tuple[T, float, float]:
    """Run ``make()`` in a fresh event loop; time the awaitable only (not loop start-up):
    ``(result, seconds, cpu seconds)`` as ``timed_cpu``."""

    async def main() -> tuple[Any, float, float]:
        gc.collect()
        start, cpu = time.perf_counter(), time.process_time()
        result = await make()
        return result, time.perf_counter() - start, time.process_time() - cpu

    return asyncio.run(main())


def timed_async(make: Callable[[], Awaitable[T]]) -> tuple[T, float]:
    """``(result, seconds)``, as ``timed_async_cpu``."""
    result, seconds, _ = timed_async_cpu(make)
    return result, seconds
