"""The agents tests need ``agent_framework`` (the ``agents`` extra, which the ``test`` extra
installs). Without it each module is skipped with the reason; with ``CI=true`` its absence fails
the run instead: a CI run must not pass by skipping them."""

from __future__ import annotations

import importlib.util
import os

import pytest

if (
    importlib.util.find_spec("agent_framework") is None
    and os.environ.get("CI", "").lower() == "true"
):
    raise pytest.UsageError(
        "agent_framework is not installed and CI=true: install steplog[agents] (the test extra "
        "does), the tests under tests/agents must run"
    )
