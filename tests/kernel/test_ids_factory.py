"""The default id factory: ids a command line takes as they are."""

from __future__ import annotations

import re

import pytest

from kernel import uuid_ids
from kernel._base import _clock


def test_an_id_never_begins_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 22 review: base64url ids began with ``-`` one time in 64, and ``steplog respond RUN
    -xyz JSON`` then read the request id as an option (a CI run failed on it). An id drawn with a
    leading ``-`` is drawn again."""
    draws = iter([b"\xf8" + bytes(15), b"\x04" + bytes(15)])  # 0xf8 encodes as "-", 0x04 as "B"
    monkeypatch.setattr(_clock.os, "urandom", lambda n: next(draws))
    assert _clock.uuid_ids() == "BA" + "A" * 20


def test_ids_are_22_url_safe_characters_and_distinct() -> None:
    ids = {uuid_ids() for _ in range(2000)}
    assert len(ids) == 2000
    assert all(re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_-]{21}", i) for i in ids)
