"""The checks of a decoded event's fields against its type, without pydantic's validator.

**Why this is not ``cls.model_validate``.** Every event read from a log passes here (a replay, a
resume, a rebuild decode every event), and a row read back is checked as strictly as pydantic's
strict mode would (a tampered row must be a ``DecodeError`` naming its position, never a
malformed event). pydantic does the same checks more slowly, so the checks are derived from the
event models' own annotations (``_field``: a type this module cannot check is refused when the
checks are first built, never skipped) and the event is then built without re-validation
(``kernel._log._events.complete_event``/``trusted_event``). A row that fails the fast check is
looked at again field by field to say what is wrong (``_describe``); a payload with fields
missing or unknown is handed to pydantic (``build``), which names them.

**Measured** (issue 22; CPU time, median of 15 to 25 runs, on the rows of ``python -m bench
--only chain``'s log without their hashes; 2-core AMD EPYC, CPython 3.11, pydantic 2.14.4): on
the 14,004 events of its first 2,000 rows, the checks and construction here cost 1.4 µs an
event, pydantic's ``model_validate(payload, strict=True)`` on the same payloads 2.1 µs; the whole
``RowMapper.decode_row`` of its first 6,000 rows went from 4.5 to 5.2 µs an event (+15%) with
pydantic in place of this module. Earlier (``docs/benchmarks.md``, "Decoding a stored row"):
3.9 µs unchecked, 6.4 µs with a per-field check, 4.4 µs with the lookup here.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Callable
from datetime import datetime
from types import UnionType
from typing import Any, Literal, NamedTuple, Union, get_args, get_origin

import annotated_types
from pydantic import ValidationError

from kernel._base._errors import DecodeError
from kernel._log._events import ErrorInfo, EventBase, trusted_event

__all__ = ["build", "error_info", "error_problem", "problem"]


class _Field(NamedTuple):
    """What a stored field must be: one of ``types``, and one of ``values`` or ``>= minimum``
    when those are set; ``items``, the type of every item of a list."""

    name: str
    types: frozenset[type]
    values: frozenset[Any] | None = None
    minimum: int | None = None
    items: type | None = None


_NONE = type(None)


def _field(name: str, annotation: Any, metadata: list[Any]) -> _Field | None:
    """The check for one field, None when any JSON value fits it (``Json`` fields)."""
    if annotation is Any:
        return None
    args = get_args(annotation)
    origin = get_origin(annotation)
    minimum = None
    for constraint in metadata:
        if isinstance(constraint, annotated_types.Ge) and isinstance(constraint.ge, int):
            minimum = constraint.ge
    if origin is Literal:
        return _Field(name, frozenset(type(a) for a in args), values=frozenset(args))
    if origin in (Union, UnionType) and len(args) == 2 and _NONE in args:
        inner = _field(name, next(a for a in args if a is not _NONE), metadata)
        if inner is None:
            return None
        values = None if inner.values is None else inner.values | {None}
        return inner._replace(types=inner.types | {_NONE}, values=values)
    if origin is list and args and args[0] in (str, int):
        return _Field(name, frozenset({list}), items=args[0])
    if origin is list and args and get_origin(args[0]) is dict:
        return _Field(name, frozenset({list}), items=dict)
    if origin is dict and args[:1] == (str,):
        return _Field(name, frozenset({dict}))
    if annotation is ErrorInfo:
        return _Field(name, frozenset({dict}))
    if annotation in (str, int, bool, float):
        return _Field(name, frozenset({annotation}), minimum=minimum)
    raise TypeError(f"the mapper cannot check field {name!r} of type {annotation!r}")


@functools.cache
def _checks(cls: type[EventBase]) -> tuple[_Field, ...]:
    """The checks of ``cls``'s stored fields (all but ``timestamp``, parsed apart)."""
    checks = []
    for name, info in cls.model_fields.items():
        if name == "timestamp":
            continue
        check = _field(name, info.annotation, info.metadata)
        if check is not None:
            checks.append(check)
    return tuple(checks)


@functools.cache
def _fast_checks(
    cls: type[EventBase],
) -> tuple[
    Callable[[dict[str, Any]], Any],
    frozenset[tuple[type, ...]],
    tuple[tuple[str, frozenset[Any]], ...],
    tuple[tuple[str, int], ...],
    tuple[tuple[str, type], ...],
]:
    """``_checks(cls)`` arranged for ``problem``'s pass over every decoded event: a getter of the
    checked fields, every allowed combination of their types, then allowed values, lower bounds
    and list item types. Every event type has at least two checked fields, so the getter always
    returns a tuple."""
    checks = [c for c in _checks(cls) if c.name != "type"]  # the topic says the type
    return (
        operator.itemgetter(*(c.name for c in checks)),
        frozenset(itertools.product(*(c.types for c in checks))),
        tuple((c.name, c.values) for c in checks if c.values is not None),
        tuple((c.name, c.minimum) for c in checks if c.minimum is not None),
        tuple((c.name, c.items) for c in checks if c.items is not None),
    )


@functools.cache
def _type_of(cls: type[EventBase]) -> str:
    """The ``type`` every event of ``cls`` carries."""
    name: str = cls.model_fields["type"].default
    return name


def problem(cls: type[EventBase], payload: dict[str, Any]) -> str | None:
    """What is wrong with the fields of ``payload`` (the first problem), or None.

    Runs for every event read, so the common case (every field present and right) costs one
    lookup of the fields' types among the allowed combinations, and a few comparisons; anything
    else is looked at again, field by field, to say what is wrong (or that a field is just
    missing, which its default fills).
    """
    if "type" in payload:  # the mapper never stores it (the topic says it): a tampered row
        return _describe(cls, payload)
    fields, combinations, values, minimums, items = _fast_checks(cls)
    try:
        if tuple(map(type, fields(payload))) not in combinations:
            return _describe(cls, payload)
    except KeyError:  # a field is missing: its default may fill it
        return _describe(cls, payload)
    get = payload.get
    for name, allowed in values:  # the types are right, so the values are hashable
        if get(name) not in allowed:
            return _describe(cls, payload)
    for name, minimum in minimums:
        number = get(name)
        if number is not None and number < minimum:
            return _describe(cls, payload)
    for name, item in items:
        if any(type(one) is not item for one in get(name) or ()):
            return _describe(cls, payload)
    return None


def _describe(cls: type[EventBase], payload: dict[str, Any]) -> str | None:
    """The first problem with the fields of ``payload``, in words."""
    for name, types, values, minimum, items in _checks(cls):
        if name not in payload:
            continue  # a default fills it; a required one missing is reported by the caller
        value = payload[name]
        if type(value) not in types:
            return f"field {name!r} is a {type(value).__name__}: {value!r:.80}"
        if values is not None and value not in values:
            return f"field {name!r} is {value!r:.80}, not one of {sorted(map(repr, values))}"
        if minimum is not None and value < minimum:
            return f"field {name!r} is {value!r}, less than {minimum}"
        if items is not None and any(type(item) is not items for item in value):
            return f"field {name!r} holds an item that is not a {items.__name__}"
    return None


def error_problem(error: Any) -> str | None:
    """What is wrong with a stored ``error`` field (an ``ErrorInfo`` as an object), or None."""
    if (
        type(error) is not dict
        or error.keys() != {"type", "message"}
        or not all(type(v) is str for v in error.values())
    ):
        return f"field 'error' is {error!r:.80}, not {{'type': str, 'message': str}}"
    return None


def error_info(where: str, error: Any) -> ErrorInfo:
    """A stored ``error`` field as an ``ErrorInfo``, its shape checked (``DecodeError`` naming
    ``where`` otherwise)."""
    wrong = error_problem(error)
    if wrong is not None:
        raise DecodeError(f"{where}: {wrong}")
    return ErrorInfo(type=str(error["type"]), message=str(error["message"]))


def _construct(cls: type[EventBase], payload: dict[str, Any]) -> EventBase | str | None:
    """Build an event from a stored payload: the event, or what is wrong with a field (a
    string), or None when fields are missing or unknown (the caller validates, to name them).

    Every field is checked against its declared type (exactly: JSON has no ``"5"`` for 5), the
    timestamp parsed and the nested errors rebuilt; then the event is built without pydantic's
    validation, which would check the same things more slowly.
    """
    if "timestamp" not in payload:
        return None
    stamp = payload["timestamp"]
    if type(stamp) is not str:
        return f"timestamp is {stamp!r:.80}, not an ISO 8601 string"
    try:
        when = datetime.fromisoformat(stamp)
    except ValueError:
        return f"timestamp {stamp!r:.80} is not an ISO 8601 date and time"
    if when.tzinfo is None:
        return f"timestamp {stamp!r:.80} has no time zone"
    wrong = problem(cls, payload)
    if wrong is not None:
        return wrong
    payload["timestamp"] = when
    payload["type"] = _type_of(cls)  # every field present: the event is built without merging
    error = payload.get("error")
    if error is not None:
        wrong = error_problem(error)
        if wrong is not None:
            return wrong
        payload["error"] = ErrorInfo(type=error["type"], message=error["message"])
    return trusted_event(cls, payload)


def build(cls: type[EventBase], payload: dict[str, Any], where: str) -> EventBase:
    """The event of ``cls`` whose fields are ``payload`` (as an event row stores them, the
    envelope added; taken over). Raises ``DecodeError`` naming ``where`` (the event) and what is
    wrong: a field's type or value, the timestamp, or (pydantic's words) fields missing or
    unknown."""
    built = _construct(cls, payload)
    if type(built) is cls:  # (not isinstance: pydantic's metaclass makes that slow, per event)
        return built
    if built is not None:
        raise DecodeError(f"{where} does not fit its schema: {built}")
    try:  # fields missing or unknown: pydantic names them
        return cls.model_validate(payload, strict=True)
    except ValidationError as error:
        raise DecodeError(f"{where} does not fit its schema: {error}") from error
