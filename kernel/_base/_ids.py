"""The limits on instance ids, run and superstep ids, and state keys: the same on every backend.

An id or a key is text that the stores and the materialized views keep in indexed columns, so it
must be storable everywhere as it is: a non-empty ``str``, valid Unicode (no lone surrogate: it is
written as UTF-8), without NUL (PostgreSQL's text cannot hold one), and at most a number of UTF-8
bytes small enough for PostgreSQL's B-tree index entries (about 2,700 bytes, for an instance id
and a view key together, uncompressed):

============  ===========  ====================================================================
what          at most      refused with
============  ===========  ====================================================================
instance id   200 bytes    ``DefinitionError`` (``WorkflowBuilder.build``, ``Workflow``),
                           ``ExecutionError`` (``fork``), ``InvalidBatchError`` (an append),
                           ``StoreConfigError`` (a read: ``read``, ``read_ranges``, ``version``;
                           any length is read, so that an instance written before these limits
                           stays readable)
state key     1,000 bytes  ``EncodingError`` (``set_state``, ``delete_state``)
============  ===========  ====================================================================

Run, superstep and request ids come from the workflow's ``id_factory`` (``uuid_ids`` by default:
36 ASCII characters). A factory of the application's own must keep to the instance id's limits;
its ids are not checked.

Each check costs one ``len`` for ASCII text, and one UTF-8 encoding otherwise.
"""

from __future__ import annotations

from typing import Any

from kernel._base._errors import StepLogError

__all__ = ["MAX_ID_BYTES", "MAX_KEY_BYTES", "check_id", "id_problem"]

MAX_ID_BYTES = 200
"""The most UTF-8 bytes an instance, run or superstep id may hold."""
MAX_KEY_BYTES = 1000
"""The most UTF-8 bytes a state key may hold."""


def id_problem(value: Any, limit: int | None) -> str | None:
    """What ``value`` must be, and is not, to serve as an id or key of at most ``limit`` UTF-8
    bytes (``None``: of any length); ``None`` when it is fit."""
    if type(value) is not str:
        if not isinstance(value, str):
            return f"must be a str, not {type(value).__name__}"
        value = str.__str__(value)  # a str subclass is stored as its text
    if not value:
        return "must be a non-empty str"
    if value.isascii():
        size = len(value)
    else:
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError as error:
            return (
                f"must be valid Unicode text (it holds a lone surrogate {value[error.start]!r} at "
                f"index {error.start})"
            )
    if "\x00" in value:
        return f"must not hold a NUL character (it holds one at index {value.index(chr(0))})"
    if limit is not None and size > limit:
        return f"must be at most {limit} bytes in UTF-8 (it is {size})"
    return None


def check_id(
    value: Any, what: str, error: type[StepLogError], *, limit: int | None = MAX_ID_BYTES
) -> str:
    """Return ``value`` if it is fit as an id (or key) of at most ``limit`` bytes (``None``: of
    any length); otherwise raise ``error`` naming ``what``, the value (shortened) and the
    problem."""
    problem = id_problem(value, limit)
    if problem is not None:
        raise error(f"{what} {problem}, got {_shown(value)}")
    return value  # type: ignore[no-any-return]


def _shown(value: Any) -> str:
    text = repr(value)
    if len(text) <= 60:
        return text
    size = f" ({len(value)} characters)" if isinstance(value, str) else ""
    return f"{text[:40]}...{text[-12:]}{size}"
