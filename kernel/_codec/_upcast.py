"""Old schema versions: how their events were stored, and how they are brought up to date.

When an event type's schema version changes, the log keeps the events written in the old one.
Two things read them:

* the **frozen field list** of the old version (``FROZEN_FIELDS``): a batch row stores an event's
  fields by position (``_codec._rows``), so the old code of a type keeps the names and defaults
  its fields had, in stored order; a code whose version has no frozen list is refused, never
  misread;
* the **upcasters** (``KERNEL_UPCASTERS``, and the user's own passed to ``RowMapper``): each maps
  ``(type, from_version)`` to a function that rewrites a payload of that version into the next
  version's shape; ``upcast`` chains them until the payload reaches the current version.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from kernel._base._errors import DecodeError
from kernel._log._events import EVENT_TYPES

__all__ = ["FROZEN_FIELDS", "KERNEL_UPCASTERS", "REQUIRED", "Upcaster", "upcast"]

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]
"""Rewrites a payload (the event's fields, no envelope) into the next schema version's shape."""


class _Required:
    """The default of a field that has none (``REQUIRED``)."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Final = _Required()
"""The default of a stored field that has none: a row without it is refused."""

FROZEN_FIELDS: dict[tuple[str, int], tuple[tuple[str, Any], ...]] = {
    ("run_started", 1): (
        ("run_id", REQUIRED),
        ("workflow_name", REQUIRED),
        ("input", None),
        ("kwargs", {}),
        ("owner", ""),
        ("durability", "superstep"),
        ("continues", None),
        ("checkpoint", None),
    ),
}
"""The stored fields (name, default) of every old schema version still read, in stored order."""


def _run_started_1(payload: dict[str, Any]) -> dict[str, Any]:
    """run_started 1 -> 2: runs before sensitive keys declared none."""
    payload.setdefault("sensitive_keys", [])
    return payload


KERNEL_UPCASTERS: dict[tuple[str, int], Upcaster] = {
    ("run_started", 1): _run_started_1,
}
"""steplog's own upcasters: ``(type, from_version)`` -> the payload in the next version's shape."""


def upcast(
    upcasters: Mapping[tuple[str, int], Upcaster],
    where: str,
    type_name: str,
    version: int,
    payload: dict[str, Any],
) -> dict[str, Any]:
    """``payload`` of ``type_name`` at ``version`` brought up to the type's current version by
    ``upcasters``. Raises ``DecodeError`` naming ``where`` when an upcaster is missing, fails or
    returns something other than a dict."""
    current = EVENT_TYPES[type_name].SCHEMA_VERSION
    while version < current:
        step = upcasters.get((type_name, version))
        if step is None:
            raise DecodeError(f"{where}: no upcaster for {type_name} from schema version {version}")
        try:
            payload = step(payload)
        except Exception as error:  # an old payload its upcaster cannot read
            raise DecodeError(
                f"{where}: the upcaster of {type_name} from schema version {version} failed: "
                f"{type(error).__name__}: {error}"
            ) from error
        if type(payload) is not dict:
            raise DecodeError(
                f"{where}: the upcaster of {type_name} from schema version {version} returned "
                f"a {type(payload).__name__}, not a dict"
            )
        version += 1
    return payload
