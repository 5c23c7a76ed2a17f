"""Small timing helpers."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["timed", "timed_async"]


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    """``(fn(), seconds)``, after a full collection so earlier cases' garbage is not billed."""
    gc.collect()
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def timed_async(make: Callable[[], Awaitable[T]]) -> tuple[T, float]:
    """Run ``make()`` in a fresh event loop; time the awaitable only (not loop start-up)."""

    async def main() -> tuple[Any, float]:
        gc.collect()
        start = time.perf_counter()
        result = await make()
        return result, time.perf_counter() - start

    return asyncio.run(main())
