"""Fixtures for the ported Agent Framework samples."""

from pathlib import Path

import pytest

from kernel import DEFAULT_STORE_ENV


@pytest.fixture(params=["memory", "sqlite"])
def default_store(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> str:
    """The default store (``$STEPLOG_STORE``) of every workflow built without ``store=``: memory,
    then a SQLite file under ``tmp_path``.

    A sample builds its workflows as AF's do, with no store, so the store is chosen by the
    environment, as a user's would be, and the sample's code stays as it was.
    """
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'steplog.db'}"
    monkeypatch.setenv(DEFAULT_STORE_ENV, url)
    return url
