"""Which value classes a type annotation names: what ``ValueCodec.register`` puts on its allow-list.

The codec rebuilds enums, pydantic models and dataclasses; ``value_classes`` finds them inside an
annotation (``list[Order] | None``), as ``build()`` does for every handler's annotations.
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from typing import Any, get_args, get_origin

from pydantic import BaseModel

__all__ = ["value_classes"]


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


def _rebuildable(cls: type) -> bool:
    if issubclass(cls, enum.Enum):
        return cls.__module__ != "enum"
    if issubclass(cls, BaseModel):
        return cls is not BaseModel
    return dataclasses.is_dataclass(cls)


def _field_types(cls: type) -> list[Any]:
    if issubclass(cls, BaseModel):
        return [field.annotation for field in cls.model_fields.values()]
    if dataclasses.is_dataclass(cls):
        try:
            return list(typing.get_type_hints(cls).values())
        except (NameError, TypeError):  # a forward reference that cannot be resolved
            return [f.type for f in dataclasses.fields(cls) if not isinstance(f.type, str)]
    return []
