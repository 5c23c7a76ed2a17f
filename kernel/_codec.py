"""Values and messages as JSON trees.

A value is stored as a JSON tree that ``orjson`` can write. JSON types stand for themselves; every
other supported type becomes a small tagged object ``{"$t": tag, ...}`` that stays readable as plain
JSON by any tool:

========================  ======================================================================
Python                    stored as
========================  ======================================================================
None, bool, str           itself
int (64-bit)              itself; larger ints as ``{"$t": "int", "v": "<decimal digits>"}``
float                     itself; NaN and infinities as ``{"$t": "float", "v": "nan"}``
list                      a list; tuple, set and frozenset tagged with their items
dict with str keys        an object; a dict with other keys (or a ``"$t"`` key) is tagged:
                          ``{"$t": "dict", "v": [[k, v], ...]}``
datetime, date, time      ISO 8601 text, the zone name kept for ``zoneinfo`` zones
timedelta, UUID, Decimal  tagged text or numbers; bytes as base64
Enum members              ``{"$t": "enum", "cls": "module:Qualname", "v": value}``
pydantic models           ``{"$t": "model", "cls": ..., "v": fields}``, rebuilt by
                          ``model_validate``
dataclasses               ``{"$t": "dataclass", "cls": ..., "v": fields}``
========================  ======================================================================

Models, dataclasses and enums are rebuilt when their class can be imported (or was seen by this
codec already); otherwise they decode to their plain field values.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import importlib
import math
import uuid
from collections.abc import Callable, Mapping
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from pydantic import BaseModel

from kernel._errors import EncodingError

__all__ = ["ValueCodec"]

TAG = "$t"
_INT_MIN = -(2**63)
_INT_MAX = 2**64 - 1

Json = Any


def _class_path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


class ValueCodec:
    """Encodes Python values to JSON trees and back, exactly.

    One codec belongs to one store; it remembers the classes it has encoded, so values of classes
    that cannot be imported by path (defined inside a function, say) still round-trip within the
    process.
    """

    def __init__(self) -> None:
        self._classes: dict[str, type] = {}

    # -- encoding -----------------------------------------------------------------------------

    def encode(self, value: Any, *, what: str = "value") -> Json:
        """Return ``value`` as a JSON tree.

        Raises ``EncodingError`` naming ``what``, the path inside the value and the type.
        """
        kind = type(value)
        if kind is str or kind is bool or value is None:
            return value
        if kind is int and _INT_MIN <= value <= _INT_MAX:
            return value
        if kind is float and math.isfinite(value):
            return value
        return self._encode(value, what, "")

    def _encode(self, value: Any, what: str, path: str) -> Json:
        kind = type(value)
        if value is None or kind is str or kind is bool:
            return value
        if kind is int:
            if _INT_MIN <= value <= _INT_MAX:
                return value
            return {TAG: "int", "v": str(value)}
        if kind is float:
            if math.isfinite(value):
                return value
            return {TAG: "float", "v": repr(value)}
        if kind is list:
            return [self._encode(item, what, f"{path}[{i}]") for i, item in enumerate(value)]
        if kind is dict:
            if TAG not in value and all(type(k) is str for k in value):
                return {k: self._encode(v, what, f"{path}[{k!r}]") for k, v in value.items()}
            return {
                TAG: "dict",
                "v": [
                    [self._encode(k, what, f"{path}<key>"), self._encode(v, what, f"{path}[{k!r}]")]
                    for k, v in value.items()
                ],
            }
        encoder = _SIMPLE_ENCODERS.get(kind)
        if encoder is not None:
            return encoder(value)
        if kind is tuple or kind is set or kind is frozenset:
            items = value if kind is tuple else sorted(value, key=repr)
            return {
                TAG: kind.__name__,
                "v": [self._encode(item, what, f"{path}[{i}]") for i, item in enumerate(items)],
            }
        if isinstance(value, enum.Enum):
            return {
                TAG: "enum",
                "cls": self._remember(kind),
                "v": self._encode(value.value, what, path),
            }
        if isinstance(value, BaseModel):
            dumped = value.model_dump(round_trip=True)
            return {
                TAG: "model",
                "cls": self._remember(kind),
                "v": self._encode(dumped, what, path),
            }
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            fields = {
                f.name: self._encode(getattr(value, f.name), what, f"{path}.{f.name}")
                for f in dataclasses.fields(value)
            }
            return {TAG: "dataclass", "cls": self._remember(kind), "v": fields}
        if isinstance(value, datetime | date | time | timedelta | uuid.UUID | Decimal | bytes):
            # A subclass of a supported type: store it as its base type.
            for base, base_encoder in _SIMPLE_ENCODERS.items():
                if isinstance(value, base):
                    return base_encoder(value)
        where = f"{what}{path}" if path else what
        raise EncodingError(
            f"cannot encode {where}: a value of type {kind.__module__}.{kind.__qualname__} is not "
            "storable; use JSON types, datetimes, UUIDs, Decimals, bytes, tuples, sets, enums, "
            "pydantic models or dataclasses"
        )

    def _remember(self, cls: type) -> str:
        path = _class_path(cls)
        self._classes[path] = cls
        return path

    # -- decoding -----------------------------------------------------------------------------

    def decode(self, tree: Json) -> Any:
        """Rebuild the Python value from a JSON tree written by ``encode``."""
        kind = type(tree)
        if kind is list:
            return [self.decode(item) for item in tree]
        if kind is dict:
            tag = tree.get(TAG)
            if tag is None:
                return {k: self.decode(v) for k, v in tree.items()}
            return self._decode_tagged(tag, tree)
        return tree

    def _decode_tagged(self, tag: str, tree: Mapping[str, Any]) -> Any:
        simple = _SIMPLE_DECODERS.get(tag)
        if simple is not None:
            return simple(tree)
        if tag == "dict":
            return {self.decode(k): self.decode(v) for k, v in tree["v"]}
        if tag in ("tuple", "set", "frozenset"):
            items = [self.decode(item) for item in tree["v"]]
            return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](items)
        if tag in ("enum", "model", "dataclass"):
            cls = self._resolve(tree["cls"])
            inner = self.decode(tree["v"])
            if cls is None:
                return inner
            if tag == "enum":
                return cls(inner)
            if tag == "model":
                return cls.model_validate(inner)  # type: ignore[attr-defined]
            return _build_dataclass(cls, inner)
        raise EncodingError(f"unknown value tag {tag!r}: written by a newer steplog?")

    def _resolve(self, path: str) -> type | None:
        cls = self._classes.get(path)
        if cls is not None:
            return cls
        module_name, _, qualname = path.partition(":")
        try:
            obj: Any = importlib.import_module(module_name)
            for part in qualname.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError, ValueError):
            return None
        if not isinstance(obj, type):
            return None
        self._classes[path] = obj
        return obj


def _build_dataclass(cls: type, fields: dict[str, Any]) -> Any:
    init = {f.name: fields[f.name] for f in dataclasses.fields(cls) if f.init and f.name in fields}
    obj = cls(**init)
    for f in dataclasses.fields(cls):
        if not f.init and f.name in fields:
            object.__setattr__(obj, f.name, fields[f.name])
    return obj


def _encode_datetime(value: datetime) -> Json:
    tree: dict[str, Any] = {TAG: "datetime", "v": value.isoformat()}
    if isinstance(value.tzinfo, ZoneInfo):
        tree["tz"] = value.tzinfo.key
    return tree


def _decode_datetime(tree: Mapping[str, Any]) -> datetime:
    value = datetime.fromisoformat(tree["v"])
    zone = tree.get("tz")
    if zone is not None:
        value = value.astimezone(ZoneInfo(zone))
    return value


_SIMPLE_ENCODERS: dict[type, Callable[[Any], Json]] = {
    datetime: _encode_datetime,
    date: lambda v: {TAG: "date", "v": v.isoformat()},
    time: lambda v: {TAG: "time", "v": v.isoformat()},
    timedelta: lambda v: {TAG: "timedelta", "v": [v.days, v.seconds, v.microseconds]},
    uuid.UUID: lambda v: {TAG: "uuid", "v": str(v)},
    Decimal: lambda v: {TAG: "decimal", "v": str(v)},
    bytes: lambda v: {TAG: "bytes", "v": base64.b64encode(v).decode("ascii")},
}

_SIMPLE_DECODERS: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "int": lambda t: int(t["v"]),
    "float": lambda t: float(t["v"]),
    "datetime": _decode_datetime,
    "date": lambda t: date.fromisoformat(t["v"]),
    "time": lambda t: time.fromisoformat(t["v"]),
    "timedelta": lambda t: timedelta(days=t["v"][0], seconds=t["v"][1], microseconds=t["v"][2]),
    "uuid": lambda t: uuid.UUID(t["v"]),
    "decimal": lambda t: Decimal(t["v"]),
    "bytes": lambda t: base64.b64decode(t["v"]),
}
