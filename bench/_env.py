"""What the report header says about the run: command line, versions, machine."""

from __future__ import annotations

import datetime as dt
import os
import platform
import shlex
import sqlite3
import subprocess
import sys
from importlib import metadata

from bench._core import Config
from bench._db import pg_server_version, pg_settings

__all__ = ["environment"]

PACKAGES = (
    "steplog",
    "eventsourcing",
    "agent-framework-core",
    "langgraph",
    "langgraph-checkpoint",
    "langgraph-checkpoint-sqlite",
    "langgraph-checkpoint-postgres",
    "psycopg",
    "pydantic",
    "orjson",
)


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def _git() -> str:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", root, *args], capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + (" (with uncommitted changes)" if dirty else "")


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def environment(cfg: Config) -> list[tuple[str, str]]:
    pg = pg_server_version(cfg.pg_url)
    settings = pg_settings(cfg.pg_url, ("fsync", "synchronous_commit", "wal_sync_method"))
    rows = [
        (
            "command",
            " ".join(shlex.quote(a) for a in [sys.executable, "-m", "bench", *sys.argv[1:]]),
        ),
        ("date (UTC)", dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S")),
        ("git", _git()),
        ("python", f"{platform.python_implementation()} {platform.python_version()}"),
        ("machine", f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores, {_cpu()}"),
        ("sqlite", sqlite3.sqlite_version),
        (
            "postgresql",
            f"{pg} ({', '.join(f'{k}={v}' for k, v in settings.items())})" if pg else "unreachable",
        ),
    ]
    rows += [(name, _version(name)) for name in PACKAGES]
    rows.append(("repeat", f"median of {cfg.repeat} run(s) per case (some benchmarks cap it)"))
    return rows
