"""The columns' types: the schema of each kind of read, and inferring it from a sample.

A checkpoint stores keys and values as pickled Python objects, with no declared type; a
DataFrame needs one type per column before any row is read. This module settles that on the
driver: :func:`infer_shapes` reads the first entries of every subtask, gives each value the
:class:`Shape` it asks for (:func:`shape_of`), and merges them (:func:`unify`) into the
narrowest type that holds them all, falling back to a string of ``repr`` when nothing
narrower does. A :class:`Shape` turns into a Spark type (:meth:`Shape.spark_type`) and, as
JSON, into an option (:class:`KeyedShapes`), so that :func:`read_state` infers once and Spark
does not sample again.

What happens to a value in an executor, once the type is settled, is
:mod:`cutline.spark.datasource.convert`'s.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, assert_never

import numpy as np
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
)

from cutline.runtime.checkpoint.reader import CheckpointReader, InspectError
from cutline.spark.datasource.options import SHAPES_OPTION, ReadOptions
from cutline.spark.datasource.pinned import keyed_subtasks, readable

KEYED_COLUMNS = ("subtask", "key_group", "key", "state", "value")
"""The columns of the keyed state, in the order the readers build a row."""

CHANNEL_COLUMNS = ("subtask", "side", "channel", "position", "record")
"""The columns of the channel state, in the order the readers build a row."""

CHANNEL_SCHEMA = StructType(
    [
        StructField("subtask", StringType(), False),
        StructField("side", StringType(), False),
        StructField("channel", StringType(), False),
        StructField("position", LongType(), False),
        StructField("record", StringType(), True),
    ]
)
"""The channel state's schema: fixed, as every record becomes text."""

LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1
"""The ints a Spark ``long`` holds; a larger one is a string of its ``repr``."""


class Kind(StrEnum):
    """What a :class:`Shape` is: a scalar, or a container of shapes (``array``, ``map``)."""

    BOOLEAN = "boolean"
    LONG = "long"
    DOUBLE = "double"
    STRING = "string"
    BINARY = "binary"
    ARRAY = "array"
    """Of ``element`` s."""
    MAP = "map"
    """From ``key`` s to ``value`` s."""
    REPR = "repr"
    """A string holding ``repr(value)``."""
    UNKNOWN = "unknown"
    """Only nulls or empty containers seen."""
    TEXT = "text"
    """(A schema the user gave) a string: strings as they are, anything else as its
    ``repr``."""
    ANY = "any"
    """(A schema the user gave) handed to Spark as it is."""


@dataclass(frozen=True)
class Shape:
    """The type of a column (or of the elements, keys or values inside one): its
    :class:`Kind` (given as its name, it is made the :class:`Kind`), and for an ``array`` its
    ``element``, for a ``map`` its ``key`` and ``value``."""

    kind: Kind
    element: Shape | None = None
    key: Shape | None = None
    value: Shape | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.kind, Kind):
            object.__setattr__(self, "kind", Kind(self.kind))

    def to_json(self) -> Any:
        """The shape as JSON: its kind, or ``["array", ELEMENT]``, ``["map", KEY, VALUE]``."""
        match self.kind:
            case Kind.ARRAY:
                assert self.element is not None
                return [str(Kind.ARRAY), self.element.to_json()]
            case Kind.MAP:
                assert self.key is not None and self.value is not None
                return [str(Kind.MAP), self.key.to_json(), self.value.to_json()]
            case _:
                return str(self.kind)

    @classmethod
    def from_json(cls, data: Any) -> Shape:
        """The shape :meth:`to_json` wrote; :class:`ValueError` if ``data`` is none."""
        if isinstance(data, str) and data in _PLAIN:
            return _PLAIN[data]
        if isinstance(data, list) and len(data) == 2 and data[0] == Kind.ARRAY:
            return cls(Kind.ARRAY, element=cls.from_json(data[1]))
        if isinstance(data, list) and len(data) == 3 and data[0] == Kind.MAP:
            return cls(Kind.MAP, key=cls.from_json(data[1]), value=cls.from_json(data[2]))
        raise ValueError(f"{data!r} is not a column type")

    def spark_type(self) -> DataType:
        """The Spark type of the column."""
        match self.kind:
            case Kind.ARRAY:
                assert self.element is not None
                return ArrayType(self.element.spark_type(), True)
            case Kind.MAP:
                assert self.key is not None and self.value is not None
                return MapType(self.key.spark_type(), self.value.spark_type(), True)
            case Kind.BOOLEAN:
                return BooleanType()
            case Kind.LONG:
                return LongType()
            case Kind.DOUBLE:
                return DoubleType()
            case Kind.BINARY:
                return BinaryType()
            case Kind.STRING | Kind.REPR | Kind.UNKNOWN | Kind.TEXT:
                return StringType()
            case Kind.ANY:
                raise KeyError(Kind.ANY)  # (a column the user typed: its own Spark type)
            case unknown:
                assert_never(unknown)

    def describe(self) -> str:
        """The type as an error message names it (``bigint``, ``string (repr)``)."""
        text: str = self.spark_type().simpleString()
        return f"{text} (repr)" if self.kind is Kind.REPR else text


BOOLEAN, LONG, DOUBLE = Shape(Kind.BOOLEAN), Shape(Kind.LONG), Shape(Kind.DOUBLE)
STRING, BINARY = Shape(Kind.STRING), Shape(Kind.BINARY)
REPR, UNKNOWN = Shape(Kind.REPR), Shape(Kind.UNKNOWN)
TEXT, ANY = Shape(Kind.TEXT), Shape(Kind.ANY)
_PLAIN: dict[str, Shape] = {
    str(s.kind): s for s in (BOOLEAN, LONG, DOUBLE, STRING, BINARY, REPR, UNKNOWN, TEXT, ANY)
}


def plain(value: Any) -> Any:
    """``value``, a NumPy scalar as the Python value it holds."""
    return value.item() if isinstance(value, np.generic) else value


def shape_of(value: Any) -> Shape:
    """The column type one value asks for (``repr`` if it fits no other)."""
    value = plain(value)
    if value is None:
        return UNKNOWN
    if isinstance(value, bool):
        return BOOLEAN
    if isinstance(value, int):
        return LONG if LONG_MIN <= value <= LONG_MAX else REPR
    if isinstance(value, float):
        return DOUBLE
    if isinstance(value, str):
        return STRING
    if isinstance(value, bytes | bytearray):
        return BINARY
    if type(value) is list:
        element = UNKNOWN
        for item in value:
            element = unify(element, shape_of(item))
            if element == REPR:
                return REPR
        return Shape(Kind.ARRAY, element=element)
    if type(value) is dict:
        key, item = UNKNOWN, UNKNOWN
        for k, v in value.items():
            if plain(k) is None:
                return REPR  # Spark's maps have no null keys
            key, item = unify(key, shape_of(k)), unify(item, shape_of(v))
            if REPR in (key, item):
                return REPR
        return Shape(Kind.MAP, key=key, value=item)
    return REPR


def unify(a: Shape, b: Shape) -> Shape:
    """The type of a column holding values of types ``a`` and ``b`` (``repr`` if none but a
    string fits both)."""
    if a == b:
        return a
    if a == UNKNOWN:
        return b
    if b == UNKNOWN:
        return a
    match a.kind, b.kind:
        case (Kind.LONG, Kind.DOUBLE) | (Kind.DOUBLE, Kind.LONG):
            return DOUBLE
        case Kind.ARRAY, Kind.ARRAY:
            assert a.element is not None and b.element is not None
            element = unify(a.element, b.element)
            return REPR if element == REPR else Shape(Kind.ARRAY, element=element)
        case Kind.MAP, Kind.MAP:
            assert a.key and a.value and b.key and b.value
            key, value = unify(a.key, b.key), unify(a.value, b.value)
            return REPR if REPR in (key, value) else Shape(Kind.MAP, key=key, value=value)
        case _:
            return REPR


def finish(shape: Shape) -> Shape:
    """``shape`` as a column type: what was never seen (only nulls, empty lists or dicts)
    becomes a string of ``repr``."""
    match shape.kind:
        case Kind.UNKNOWN:
            return REPR
        case Kind.ARRAY:
            assert shape.element is not None
            return Shape(Kind.ARRAY, element=finish(shape.element))
        case Kind.MAP:
            assert shape.key is not None and shape.value is not None
            return Shape(Kind.MAP, key=finish(shape.key), value=finish(shape.value))
        case _:
            return shape


def shape_of_type(data_type: DataType) -> Shape:
    """The column type of a Spark type (of a schema the user gave)."""
    if isinstance(data_type, BooleanType):
        return BOOLEAN
    if isinstance(data_type, ByteType | ShortType | IntegerType | LongType):
        return LONG
    if isinstance(data_type, FloatType | DoubleType):
        return DOUBLE
    if isinstance(data_type, StringType):
        return TEXT
    if isinstance(data_type, BinaryType):
        return BINARY
    if isinstance(data_type, ArrayType):
        return Shape(Kind.ARRAY, element=shape_of_type(data_type.elementType))
    if isinstance(data_type, MapType):
        return Shape(
            Kind.MAP,
            key=shape_of_type(data_type.keyType),
            value=shape_of_type(data_type.valueType),
        )
    return ANY


@dataclass(frozen=True)
class KeyedShapes:
    """The types of the ``key`` and ``value`` columns."""

    key: Shape
    value: Shape

    def schema(self) -> StructType:
        """The keyed state's schema with these types."""
        return StructType(
            [
                StructField("subtask", StringType(), False),
                StructField("key_group", IntegerType(), False),
                StructField("key", self.key.spark_type(), True),
                StructField("state", StringType(), False),
                StructField("value", self.value.spark_type(), True),
            ]
        )

    def to_json(self) -> str:
        """The types as the text of the internal option that hands them on to Spark."""
        return json.dumps({"key": self.key.to_json(), "value": self.value.to_json()})

    @classmethod
    def from_json(cls, text: str) -> KeyedShapes:
        """The types :meth:`to_json` wrote; :class:`InspectError` naming the option if not."""
        try:
            data = json.loads(text)
            return cls(Shape.from_json(data["key"]), Shape.from_json(data["value"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise InspectError(f"option {SHAPES_OPTION} is not valid: {exc}") from None


def infer_shapes(reader: CheckpointReader, uid: str, options: ReadOptions) -> KeyedShapes:
    """The column types of operator ``uid``'s keyed state: from the first
    ``options.sample_size`` entries (of ``options.state``) of every subtask, or strings with
    ``types="string"``. :class:`InspectError` if ``options.state`` names no state."""
    if options.types == "string" and options.state is None:
        return KeyedShapes(REPR, REPR)
    key, value = UNKNOWN, UNKNOWN
    names: set[str] = set()
    found = False
    for subtask in keyed_subtasks(reader, uid):
        if found and key == value == REPR:
            break
        taken = 0
        with readable(f"{reader.location.url} ({subtask})"):
            for entry in reader.keyed_entries_of(subtask, uid):
                names.add(entry.state)
                if options.state is not None and entry.state != options.state:
                    continue
                found = True
                key = unify(key, shape_of(entry.key)) if key != REPR else REPR
                value = unify(value, shape_of(entry.value)) if value != REPR else REPR
                taken += 1
                if taken >= options.sample_size or (key == value == REPR):
                    break
    if options.state is not None and not found:
        raise InspectError(
            f"operator {options.operator or uid!r} has no state {options.state!r} in checkpoint "
            f"{reader.checkpoint_id} (its states there: "
            f"{', '.join(map(repr, sorted(names))) or 'none'})"
        )
    if options.types == "string":
        return KeyedShapes(REPR, REPR)
    return KeyedShapes(finish(key), finish(value))
