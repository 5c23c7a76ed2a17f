"""Values and messages as JSON trees, decoded as data only.

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
pydantic models           ``{"$t": "model", "cls": ..., "v": fields}``
dataclasses               ``{"$t": "dataclass", "cls": ..., "v": fields}``
named tuples              ``{"$t": "namedtuple", "cls": ..., "v": fields}``
self-serializing objects  ``{"$t": "object", "cls": ..., "v": value.to_dict()}``: a class with a
                          ``to_dict()`` method and a ``from_dict`` classmethod (Agent Framework's
                          ``Message``, ``Content``, ``AgentResponse``, ``AgentSession``)
========================  ======================================================================

Nothing else is stored, and nothing is ever pickled. A value of any other class (a plain class,
one with ``__slots__``, an attrs class, a subclass of ``dict``, ``list`` or ``str``, a
``deque``, a ``Path``) is refused by ``encode`` with an ``EncodingError`` that names its type and
how to make it storable (``storable_hint``).

**Encoding refuses what cannot be written.** ``encode`` raises ``EncodingError`` (naming ``what``
and the path inside the value) for a type it does not support, for text that is not valid Unicode
(a lone surrogate, in a value or a key) and for a tree nested more than ``MAX_DEPTH`` containers
deep (or one that contains itself). So whatever ``encode`` returns can be written by orjson, even
where an event or a materialized view puts it a few levels down inside its own document.

**Decoding is data only: it never imports a module or calls a class it was not given.** A tagged
enum, model, dataclass, named tuple or self-serializing object names its class as
``"module:qualname"``; that name is looked up in the codec's allow-list, never imported. A class is
on the allow-list only if the application put it there: with ``ValueCodec.register``
(``codec.register(Order, list[Item] | None)``), with ``WorkflowBuilder.register_types``, or by
declaring it in a handler's annotations (the types a handler accepts, sends and yields, looked into
through generics and unions, and the field types of the models and dataclasses found) when the
workflow is built. A registered class is rebuilt from the stored fields (``model_validate`` for
models, the constructor for dataclasses, named tuples and enums, ``from_dict`` for a
self-serializing class); a class that is not registered decodes to its stored fields as plain data
(a dict of fields for a model, dataclass, named tuple or self-serializing object; the value for an
enum).

Encoding a class does **not** register it: what ``decode`` returns depends only on the allow-list,
never on what this process happened to write before, so a reader process and a writer process see
the same values. A value of a class that no handler declares reads back as plain data until it is
registered.

A tree that is malformed (an unknown tag, a missing or wrongly typed part, a registered class that
refuses the stored fields, nesting deeper than ``MAX_DEPTH``) raises ``DecodeError`` naming what is
wrong; decoding raises nothing else.

The module is longer than most on purpose: ``encode`` and ``decode`` are inverses whose tag formats
and depth rules must agree line by line, so they are kept side by side. Finding the classes an
annotation names is apart, in ``_valuetypes``.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import math
import sys
import uuid
from collections.abc import Callable, Mapping
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from types import MappingProxyType
from typing import Any
from zoneinfo import ZoneInfo

from pydantic import BaseModel

from kernel._base._errors import DecodeError, DefinitionError, EncodingError
from kernel._codec._renamed import FORMER_NAMES
from kernel._codec._valuetypes import is_namedtuple, is_serializable, storable_hint, value_classes

__all__ = ["MAX_DEPTH", "ValueCodec"]

TAG = "$t"
MAX_DEPTH = 200
"""The deepest a stored value may nest, in JSON containers. orjson writes at most 255, and events
and materialized views keep values up to about ten levels down inside their own documents."""

_SCALARS = frozenset({str, int, float, bool, type(None)})  # JSON leaves: decoded as themselves
_INT_MIN = -(2**63)
_INT_MAX = 2**64 - 1
_SHOWN = 80  # characters of a malformed tree quoted in a DecodeError
_PATH_STEPS = 8  # steps of the path inside a value that an EncodingError shows, at most

Json = Any


def _class_path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


class _Refused(Exception):
    """An encoding failure on its way up; each container adds its step to ``path``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.path: list[str] = []  # innermost step first


class _Malformed(Exception):
    """A decoding failure on its way up to ``ValueCodec.decode``."""


_TOO_DEEP = (
    f"it nests more than {MAX_DEPTH} levels deep (or contains itself); stored values nest at "
    f"most {MAX_DEPTH} levels"
)


class ValueCodec:
    """Encodes Python values to JSON trees and back, exactly, for the registered classes.

    One codec belongs to one store (``store.codec``); building a workflow registers the value
    classes its handlers declare. ``decode`` rebuilds only registered classes and never imports
    anything (see the module docstring).

    >>> import enum
    >>> class Size(enum.Enum):
    ...     S = "s"
    >>> codec = ValueCodec()
    >>> tree = codec.encode(Size.S)
    >>> codec.decode(tree)  # not registered: the stored value, as data
    's'
    >>> codec.register(Size)
    >>> codec.decode(tree)
    <Size.S: 's'>
    """

    def __init__(self) -> None:
        self._classes: dict[str, type] = {}
        self._paths: dict[type, str] = {}  # a cache of class paths for encoding, not an allow-list

    # -- the allow-list -------------------------------------------------------------------------

    def register(self, *types: Any) -> None:
        """Allow values of these classes to be rebuilt by ``decode``.

        Each argument is a class or a type annotation (``list[Order] | None``); every enum,
        pydantic model, dataclass and named tuple in it is registered, with the classes their
        fields declare.
        A class registered under the ``"module:qualname"`` of an earlier one replaces it. Raises
        ``DefinitionError`` for an argument that holds no such class.
        """
        for annotation in types:
            found = value_classes(annotation)
            if not found:
                raise DefinitionError(
                    f"cannot register {annotation!r}: it holds no enum, pydantic model, "
                    "dataclass or named tuple (other values decode as themselves without "
                    "registering)"
                )
            for cls in found:
                self._classes[_class_path(cls)] = cls

    @property
    def registered(self) -> Mapping[str, type]:
        """The allow-list: registered classes by their ``"module:qualname"`` (read-only)."""
        return MappingProxyType(self._classes)

    # -- encoding -----------------------------------------------------------------------------

    def encode(self, value: Any, *, what: str = "value") -> Json:
        """Return ``value`` as a JSON tree that orjson can write.

        Raises ``EncodingError`` naming ``what``, the path inside the value and what is wrong: an
        unsupported type, text that is not valid Unicode, or nesting deeper than ``MAX_DEPTH``.
        """
        kind = type(value)
        if kind is str:
            if value.isascii() or _is_unicode(value):
                return value
        elif kind is bool or value is None:
            return value
        elif kind is int:
            if _INT_MIN <= value <= _INT_MAX:
                return value
        elif kind is float and math.isfinite(value):
            return value
        try:
            return self._encode(value, 0)
        except _Refused as refused:
            where = what + _path_text(refused.path[::-1])
            raise EncodingError(f"cannot encode {where}: {refused.reason}") from refused.__cause__

    def _encode(self, value: Any, depth: int) -> Json:
        """Encode ``value``, found inside ``depth`` containers of the tree being written."""
        kind = type(value)
        if kind is str:
            if not value.isascii():
                _check_text(value)
            return value
        if value is None or kind is bool:
            return value
        if kind is int:
            if _INT_MIN <= value <= _INT_MAX:
                return value
            if depth >= MAX_DEPTH:  # the tag is a container, which decode counts as one
                raise _Refused(_TOO_DEEP)
            return {TAG: "int", "v": _digits(value)}
        if kind is float:
            if math.isfinite(value):
                return value
            if depth >= MAX_DEPTH:
                raise _Refused(_TOO_DEEP)
            return {TAG: "float", "v": repr(value)}
        if kind is list:
            if depth >= MAX_DEPTH:
                raise _Refused(_TOO_DEEP)
            return self._encode_items(value, depth + 1)
        if kind is dict:
            return self._encode_dict(value, depth)
        encoder = _SIMPLE_ENCODERS.get(kind)
        if encoder is not None:
            if depth + 2 > MAX_DEPTH:
                raise _Refused(_TOO_DEEP)
            return encoder(value)
        if kind is tuple or kind is set or kind is frozenset:
            if depth + 2 > MAX_DEPTH:
                raise _Refused(_TOO_DEEP)
            items = value if kind is tuple else sorted(value, key=repr)
            return {TAG: kind.__name__, "v": self._encode_items(items, depth + 2)}
        return self._encode_object(value, kind, depth)

    def _encode_items(self, items: Any, depth: int) -> list[Json]:
        out: list[Json] = []
        try:
            for item in items:
                out.append(self._encode(item, depth))
        except _Refused as refused:
            refused.path.append(f"[{len(out)}]")
            raise
        return out

    def _encode_dict(self, value: dict[Any, Any], depth: int) -> Json:
        if TAG not in value and all(type(k) is str for k in value):
            if depth >= MAX_DEPTH:
                raise _Refused(_TOO_DEEP)
            out: dict[str, Json] = {}
            key: Any = None
            try:
                for key, item in value.items():
                    if not key.isascii():
                        _check_text(key, "the key")
                    out[key] = self._encode(item, depth + 1)
            except _Refused as refused:
                refused.path.append(f"[{key!r}]")
                raise
            return out
        if depth + 3 > MAX_DEPTH:
            raise _Refused(_TOO_DEEP)
        pairs: list[Json] = []
        step = "<key>"
        try:
            for key, item in value.items():
                step = "<key>"
                encoded_key = self._encode(key, depth + 3)
                step = f"[{key!r}]"
                pairs.append([encoded_key, self._encode(item, depth + 3)])
        except _Refused as refused:
            refused.path.append(step)
            raise
        return {TAG: "dict", "v": pairs}

    def _encode_object(self, value: Any, kind: type, depth: int) -> Json:
        if isinstance(value, enum.Enum):
            if depth >= MAX_DEPTH:
                raise _Refused(_TOO_DEEP)
            return {TAG: "enum", "cls": self._path(kind), "v": self._encode(value.value, depth + 1)}
        if isinstance(value, BaseModel):
            if depth >= MAX_DEPTH:
                raise _Refused(_TOO_DEEP)
            dumped = value.model_dump(round_trip=True)
            return {TAG: "model", "cls": self._path(kind), "v": self._encode(dumped, depth + 1)}
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            if depth + 2 > MAX_DEPTH:
                raise _Refused(_TOO_DEEP)
            fields: dict[str, Json] = {}
            for f in dataclasses.fields(value):
                try:
                    fields[f.name] = self._encode(getattr(value, f.name), depth + 2)
                except _Refused as refused:
                    refused.path.append(f".{f.name}")
                    raise
            return {TAG: "dataclass", "cls": self._path(kind), "v": fields}
        if isinstance(value, tuple) and is_namedtuple(kind):
            if depth + 2 > MAX_DEPTH:
                raise _Refused(_TOO_DEEP)
            items: dict[str, Json] = {}
            for name, item in zip(kind._fields, value, strict=True):  # type: ignore[attr-defined]
                try:
                    items[name] = self._encode(item, depth + 2)
                except _Refused as refused:
                    refused.path.append(f".{name}")
                    raise
            return {TAG: "namedtuple", "cls": self._path(kind), "v": items}
        if isinstance(value, datetime | date | time | timedelta | uuid.UUID | Decimal | bytes):
            # A subclass of a supported type: store it as its base type.
            if depth + 2 > MAX_DEPTH:
                raise _Refused(_TOO_DEEP)
            for base, base_encoder in _SIMPLE_ENCODERS.items():
                if isinstance(value, base):
                    return base_encoder(value)
        if is_serializable(kind):
            if depth >= MAX_DEPTH:
                raise _Refused(_TOO_DEEP)
            return {TAG: "object", "cls": self._path(kind), "v": self._encode_own(value, depth)}
        raise _Refused(
            f"a value of type {kind.__module__}.{kind.__qualname__} is not storable: "
            f"{storable_hint(kind)} (storable: JSON types, datetimes, UUIDs, Decimals, bytes, "
            "tuples, sets, enums, pydantic models, dataclasses, named tuples and classes with "
            "to_dict() and a from_dict classmethod; nothing is pickled)"
        )

    def _encode_own(self, value: Any, depth: int) -> Json:
        """What a self-serializing ``value``'s ``to_dict()`` gives, encoded (it must be a dict)."""
        try:
            data = value.to_dict()
        except Exception as error:
            raise _Refused(f"its to_dict() raised {type(error).__name__}: {error}") from error
        if not isinstance(data, dict):
            raise _Refused(f"its to_dict() returned a {type(data).__name__}, not a dict")
        return self._encode(data if type(data) is dict else dict(data), depth + 1)

    def _path(self, cls: type) -> str:
        path = self._paths.get(cls)
        if path is None:
            path = self._paths[cls] = _class_path(cls)
        return path

    # -- decoding -----------------------------------------------------------------------------

    def decode(self, tree: Json, *, what: str = "value") -> Any:
        """Rebuild a value from a JSON tree written by ``encode``, as data only.

        Registered classes are rebuilt; any other class decodes to its stored fields. Raises
        ``DecodeError`` naming ``what`` and the problem when the tree is malformed.
        """
        try:
            return self._decode(tree, 0)
        except _Malformed as error:
            raise DecodeError(f"cannot decode {what}: {error}") from error.__cause__

    def _decode(self, tree: Json, depth: int) -> Any:
        """Decode ``tree``, found inside ``depth`` containers."""
        kind = type(tree)
        if kind is list:
            if depth >= MAX_DEPTH:
                raise _Malformed(_DECODE_TOO_DEEP)
            depth += 1
            return [item if type(item) in _SCALARS else self._decode(item, depth) for item in tree]
        if kind is dict:
            if depth >= MAX_DEPTH:
                raise _Malformed(_DECODE_TOO_DEEP)
            if TAG in tree:
                return self._decode_tagged(tree, depth)
            depth += 1
            return {
                k: v if type(v) in _SCALARS else self._decode(v, depth) for k, v in tree.items()
            }
        return tree

    def _decode_tagged(self, tree: dict[str, Any], depth: int) -> Any:
        tag = tree[TAG]
        simple = _SIMPLE_DECODERS.get(tag) if type(tag) is str else None
        if simple is not None:
            if "v" not in tree:
                raise _Malformed(f"{_show(tree)} has no 'v'")
            try:
                return simple(tree["v"], tree)
            except Exception as error:
                raise _Malformed(f"{_show(tree)} is not a valid {tag}: {error}") from error
        if tag == "dict":
            pairs = self._items(tree, depth)
            try:
                out = {}
                for pair in pairs:
                    if type(pair) is not list or len(pair) != 2:
                        raise _Malformed(f"{_show(tree)}: each item must be a [key, value] pair")
                    out[self._decode(pair[0], depth + 3)] = self._decode(pair[1], depth + 3)
            except TypeError as error:  # an unhashable key
                raise _Malformed(f"{_show(tree)} has a key that cannot be one: {error}") from error
            return out
        if tag == "tuple":
            return tuple(self._decode(item, depth + 2) for item in self._items(tree, depth))
        if tag == "set" or tag == "frozenset":
            items = [self._decode(item, depth + 2) for item in self._items(tree, depth)]
            try:
                return set(items) if tag == "set" else frozenset(items)
            except TypeError as error:
                reason = f"{_show(tree)} has an item that cannot be one: {error}"
                raise _Malformed(reason) from error
        if type(tag) is str and tag in _OBJECT_TAGS:
            return self._decode_object(tag, tree, depth)
        raise _Malformed(f"unknown value tag {tag!r} in {_show(tree)}: written by a newer steplog?")

    def _items(self, tree: dict[str, Any], depth: int) -> list[Any]:
        items = tree.get("v")
        if type(items) is not list:
            raise _Malformed(f"{_show(tree)}: 'v' must be a list")
        if depth + 1 >= MAX_DEPTH:
            raise _Malformed(_DECODE_TOO_DEEP)
        return items

    def _decode_object(self, tag: str, tree: dict[str, Any], depth: int) -> Any:
        name = tree.get("cls")
        if type(name) is not str or "v" not in tree:
            raise _Malformed(f"{_show(tree)}: a {tag} needs 'cls' (text) and 'v'")
        inner = self._decode(tree["v"], depth + 1)
        if tag != "enum" and type(inner) is not dict:
            raise _Malformed(f"{_show(tree)}: the fields of a {tag} must be an object")
        cls = self._classes.get(name) or self._classes.get(FORMER_NAMES.get(name, ""))
        if cls is None:
            return inner
        try:
            if tag == "enum" and issubclass(cls, enum.Enum):
                return cls(inner)
            if tag == "model" and issubclass(cls, BaseModel):
                return cls.model_validate(inner)
            if tag == "dataclass" and dataclasses.is_dataclass(cls):
                return _build_dataclass(cls, inner)
            if tag == "namedtuple" and is_namedtuple(cls):
                return cls(**inner)
            if tag == "object" and is_serializable(cls):
                return cls.from_dict(inner)  # type: ignore[attr-defined]
        except Exception as error:
            raise _Malformed(
                f"the stored {tag} does not fit the registered class {name}: {error}"
            ) from error
        raise _Malformed(f"{_show(tree)}: the registered class {name} is not a {tag}")


_DECODE_TOO_DEEP = f"it nests more than {MAX_DEPTH} levels deep, deeper than encode ever writes"
_OBJECT_TAGS = frozenset({"enum", "model", "dataclass", "namedtuple", "object"})


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_text(text: str, what: str = "the text") -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise _Refused(
            f"{what} {_short(text)} is not valid Unicode (a lone surrogate "
            f"{text[error.start]!r} at index {error.start}); only valid Unicode text can be stored"
        ) from None


def _path_text(steps: list[str]) -> str:
    """Where in a value a problem is, as the steps down to it (``[0]['k'].field``): each step cut
    to 40 characters, and a long path (a value nested too deep) shown by its first and last few
    steps, so that an error message stays short whatever the value."""
    shown = [step if len(step) <= 40 else step[:36] + "...]" for step in steps]
    if len(shown) <= _PATH_STEPS:
        return "".join(shown)
    skipped = len(shown) - _PATH_STEPS
    return f"{''.join(shown[:4])}<{skipped} more steps>{''.join(shown[-(_PATH_STEPS - 4) :])}"


def _digits(value: int) -> str:
    try:
        return str(value)
    except ValueError as error:  # more digits than sys.get_int_max_str_digits()
        raise _Refused(
            f"an int of more than {sys.get_int_max_str_digits()} digits is not storable"
        ) from error


def _short(text: str) -> str:
    shown = repr(text)
    return shown if len(shown) <= 40 else shown[:37] + "..."


def _show(tree: Any) -> str:
    shown = repr(tree)
    return shown if len(shown) <= _SHOWN else shown[: _SHOWN - 3] + "..."


def _build_dataclass(cls: Any, fields: dict[str, Any]) -> Any:
    init = {f.name: fields[f.name] for f in dataclasses.fields(cls) if f.init and f.name in fields}
    obj = cls(**init)
    for f in dataclasses.fields(cls):
        if not f.init and f.name in fields:
            object.__setattr__(obj, f.name, fields[f.name])
    return obj


# -- simple tagged types -----------------------------------------------------------------------


def _encode_datetime(value: datetime) -> Json:
    tree: dict[str, Any] = {TAG: "datetime", "v": value.isoformat()}
    if isinstance(value.tzinfo, ZoneInfo):
        tree["tz"] = value.tzinfo.key
    return tree


def _text(part: Any) -> str:
    if type(part) is not str:
        raise TypeError(f"'v' must be text, got {type(part).__name__}")
    return part


def _decode_datetime(part: Any, tree: Mapping[str, Any]) -> datetime:
    value = datetime.fromisoformat(_text(part))
    zone = tree.get("tz")
    if zone is not None:
        value = value.astimezone(ZoneInfo(_text(zone)))
    return value


def _decode_timedelta(part: Any, tree: Mapping[str, Any]) -> timedelta:
    if type(part) is not list or len(part) != 3 or any(type(n) is not int for n in part):
        raise TypeError("'v' must be a list of days, seconds and microseconds")
    return timedelta(days=part[0], seconds=part[1], microseconds=part[2])


_SIMPLE_ENCODERS: dict[type, Callable[[Any], Json]] = {
    datetime: _encode_datetime,
    date: lambda v: {TAG: "date", "v": v.isoformat()},
    time: lambda v: {TAG: "time", "v": v.isoformat()},
    timedelta: lambda v: {TAG: "timedelta", "v": [v.days, v.seconds, v.microseconds]},
    uuid.UUID: lambda v: {TAG: "uuid", "v": str(v)},
    Decimal: lambda v: {TAG: "decimal", "v": str(v)},
    bytes: lambda v: {TAG: "bytes", "v": base64.b64encode(v).decode("ascii")},
}

_SIMPLE_DECODERS: dict[str, Callable[[Any, Mapping[str, Any]], Any]] = {
    "int": lambda v, _: int(_text(v)),
    "float": lambda v, _: float(_text(v)),
    "datetime": _decode_datetime,
    "date": lambda v, _: date.fromisoformat(_text(v)),
    "time": lambda v, _: time.fromisoformat(_text(v)),
    "timedelta": _decode_timedelta,
    "uuid": lambda v, _: uuid.UUID(_text(v)),
    "decimal": lambda v, _: Decimal(_text(v)),
    "bytes": lambda v, _: base64.b64decode(_text(v), validate=True),
}
