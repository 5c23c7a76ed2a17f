"""The store adapters load on first use: ``import kernel`` does not load every driver, whether or
not its backend is used (issue 22: this must not change as the modules move)."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import sys
import kernel
{use}
print(sorted(m for m in ("psycopg", "psycopg_pool", "filelock") if m in sys.modules))
"""


@pytest.mark.parametrize(
    ("use", "loaded"),
    [
        ("", []),
        ("import kernel.testing", []),
        ("kernel.open_store('memory://').close(); kernel.MemoryStore", []),
        ("kernel.SQLiteStore", ["filelock"]),
        ("kernel.PostgresStore", ["psycopg", "psycopg_pool"]),
    ],
    ids=["import", "testing", "memory", "sqlite", "postgres"],
)
def test_a_driver_is_loaded_only_by_the_adapter_that_uses_it(use: str, loaded: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(use=use)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == repr(loaded)
