"""Which value classes a type annotation names: what ``ValueCodec.register`` puts on its allow-list.

The codec rebuilds enums, pydantic models, dataclasses, named tuples and classes that serialize
themselves (``is_serializable``: a ``to_dict()`` method and a ``from_dict`` classmethod);
``value_classes`` finds them inside an annotation (``list[Order] | None``), as ``build()`` does for
every handler's annotations. ``unstorable_class`` finds a class an annotation names whose values can
never be stored, and ``storable_hint`` says how to make such a class storable: ``build()`` refuses a
handler that declares one, and the codec names the hint when it refuses a value.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import inspect
import pathlib
import types
import typing
import uuid
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any, get_args, get_origin

from pydantic import BaseModel

__all__ = [
    "is_namedtuple",
    "is_serializable",
    "storable_hint",
    "unstorable_class",
    "value_classes",
]

_STORED_AS_THEMSELVES: tuple[type, ...] = (
    str, int, float, bool, type(None), list, dict, tuple, set, frozenset,
    datetime, date, time, timedelta, uuid.UUID, Decimal, bytes,
)  # fmt: skip
"""The classes the codec stores without a class name (the simple tagged ones with subclasses,
which are stored as their base class)."""

_SIMPLE_BASES: tuple[type, ...] = (datetime, date, time, timedelta, uuid.UUID, Decimal, bytes)


def value_classes(*annotations: Any) -> list[type]:
    """The enums, pydantic models and dataclasses that ``annotations`` name, in order.

    Looks inside generics, unions, ``Annotated``, ``Literal`` (the classes of enum members) and
    tuples of annotations, and into the field types of every model and dataclass found. Anything
    else (``Any``, type variables, unresolvable forward references) names nothing.

    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class Item:
    ...     sku: str
    >>> [cls.__name__ for cls in value_classes(list[Item] | None)]
    ['Item']
    """
    found: dict[type, None] = {}
    for annotation in annotations:
        _walk(annotation, found)
    return list(found)


def _walk(annotation: Any, found: dict[type, None]) -> None:
    if isinstance(annotation, type) and get_origin(annotation) is None:
        if annotation in found or not _rebuildable(annotation):
            return
        found[annotation] = None
        for field_type in _field_types(annotation):
            _walk(field_type, found)
        return
    if isinstance(annotation, tuple):
        for item in annotation:
            _walk(item, found)
        return
    if isinstance(annotation, enum.Enum):  # a Literal's member
        _walk(type(annotation), found)
        return
    origin = get_origin(annotation)
    if origin is not None:
        if isinstance(origin, type):
            _walk(origin, found)  # a parametrized generic model or dataclass
        for arg in get_args(annotation):
            _walk(arg, found)


def is_namedtuple(cls: type) -> bool:
    """Whether ``cls`` is a named tuple class (``typing.NamedTuple``, ``namedtuple(...)``)."""
    return (
        issubclass(cls, tuple)
        and cls is not tuple
        and isinstance(getattr(cls, "_fields", None), tuple)
        and callable(getattr(cls, "_make", None))
    )


def is_serializable(cls: type) -> bool:
    """Whether ``cls`` serializes itself: it has a ``to_dict()`` method giving its data as a
    ``dict`` and a ``from_dict(mapping)`` classmethod rebuilding an instance from it (Agent
    Framework's ``SerializationProtocol``: ``Message``, ``Content``, ``AgentResponse``,
    ``AgentSession``). The codec stores such a value as what ``to_dict()`` returns and, once the
    class is registered, rebuilds it with ``from_dict``. Enums, pydantic models, dataclasses and
    named tuples are stored as such, whatever methods they have."""
    return callable(getattr(cls, "to_dict", None)) and isinstance(
        inspect.getattr_static(cls, "from_dict", None), classmethod
    )


def _rebuildable(cls: type) -> bool:
    if issubclass(cls, enum.Enum):
        return cls.__module__ != "enum"
    if issubclass(cls, BaseModel):
        return cls is not BaseModel
    return dataclasses.is_dataclass(cls) or is_namedtuple(cls) or is_serializable(cls)


def _field_types(cls: type) -> list[Any]:
    if issubclass(cls, BaseModel):
        return [field.annotation for field in cls.model_fields.values()]
    if dataclasses.is_dataclass(cls) or is_namedtuple(cls):
        try:
            return list(typing.get_type_hints(cls).values())
        except (NameError, TypeError):  # a forward reference that cannot be resolved
            if is_namedtuple(cls):
                return []
            fields = dataclasses.fields(cls)  # type: ignore[arg-type]
            return [f.type for f in fields if not isinstance(f.type, str)]
    return []


# -- what can never be stored ------------------------------------------------------------------


def unstorable_class(*annotations: Any) -> type | None:
    """The first class that ``annotations`` name whose values the codec can never store, or None.

    Looks where ``value_classes`` looks (generics, unions, ``Annotated``, the fields of models,
    dataclasses and named tuples). A class counts as storable when the codec stores its values (JSON
    types, datetimes, UUIDs, Decimals, bytes, tuples, sets, enums, pydantic models, dataclasses,
    named tuples, classes that serialize themselves), when one of those is a subclass of it
    (``Sequence``, ``Mapping``, ``numbers.Number``, a protocol), or when one of its own subclasses
    is storable (a plain base class of dataclasses). What cannot be judged (type variables, forward
    references as text, special forms) is taken as storable: the value is still checked when it is
    written.

    >>> class Plain:
    ...     pass
    >>> unstorable_class(list[Plain] | None).__name__
    'Plain'
    >>> unstorable_class(dict[str, int], Any) is None
    True
    """
    seen: set[type] = set()
    for annotation in annotations:
        found = _first_unstorable(annotation, seen)
        if found is not None:
            return found
    return None


def _first_unstorable(annotation: Any, seen: set[type]) -> type | None:
    if isinstance(annotation, tuple):
        for item in annotation:
            found = _first_unstorable(item, seen)
            if found is not None:
                return found
        return None
    origin = get_origin(annotation)
    if origin is not None:
        if origin is typing.Literal:
            return None  # its members are values, checked when written
        args = get_args(annotation)
        if origin is typing.Annotated:
            return _first_unstorable(args[0], seen)
        if isinstance(origin, type) and origin is not types.UnionType:
            found = _first_unstorable(origin, seen)
            if found is not None:
                return found
        return _first_unstorable(tuple(a for a in args if a is not Ellipsis), seen)
    if annotation is Any or not isinstance(annotation, type) or annotation in seen:
        return None
    seen.add(annotation)
    if annotation.__module__.split(".")[0] == "kernel":
        return None  # the kernel's own message classes (a sub-workflow's), tested to round-trip
    if not _storable(annotation, set()):
        return annotation
    if _rebuildable(annotation):
        return _first_unstorable(tuple(_field_types(annotation)), seen)
    return None


def _storable(cls: type, visited: set[type]) -> bool:
    if cls is object or cls in _STORED_AS_THEMSELVES or _rebuildable(cls):
        return True
    if issubclass(cls, enum.Enum | BaseModel) or issubclass(cls, _SIMPLE_BASES):
        return True  # the bare bases (enum.Enum, BaseModel) name any member or model
    try:
        if any(issubclass(leaf, cls) for leaf in _STORED_AS_THEMSELVES):
            return True  # an abstract base some stored class satisfies (Sequence, Number)
    except TypeError:  # a protocol that is not runtime-checkable: cannot judge
        return True
    if getattr(cls, "_is_protocol", False):
        return True
    visited.add(cls)
    try:
        subclasses = type.__subclasses__(cls)
    except TypeError:
        return True
    return any(sub not in visited and _storable(sub, visited) for sub in subclasses)


def storable_hint(cls: type) -> str:
    """How to store values of ``cls``, which the codec cannot store: a short instruction."""
    model = "make it a @dataclass or a pydantic BaseModel"
    if hasattr(cls, "__attrs_attrs__"):
        return f"attrs classes are not storable: {model}, or store attrs.asdict(value)"
    for base, convert in _CONVERSIONS:
        if issubclass(cls, base):
            return f"store {convert}(value) instead"
    if issubclass(cls, pathlib.PurePath):
        return "store str(value) instead"
    if "__slots__" in vars(cls):
        return f"{model} (@dataclass(slots=True) keeps the slots)"
    return (
        f"{model} (rebuilt when read, once registered: build() registers the classes the "
        "handlers declare), give it a to_dict() method and a from_dict classmethod, or store "
        "its data as JSON types"
    )


_CONVERSIONS: tuple[tuple[type, str], ...] = (
    (collections.deque, "list"),
    (bytearray, "bytes"),
    (memoryview, "bytes"),
    (dict, "dict"),
    (list, "list"),
    (str, "str"),
    (bool, "bool"),
    (int, "int"),
    (float, "float"),
    (tuple, "tuple"),
    (set, "set"),
    (frozenset, "frozenset"),
)
