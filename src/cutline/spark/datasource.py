"""Checkpoint state as Spark DataFrames: the ``cutline`` Python data source.

What a checkpoint or savepoint holds becomes a DataFrame, read by Spark's executors one
subtask at a time (one input partition per subtask holding state; the driver only reads the
metadata and a bounded sample to infer the column types)::

    from cutline.spark.datasource import read_state, read_channel_state

    counts = read_state(spark, "ck/", "sum")          # ck/'s newest complete checkpoint
    counts.createOrReplaceTempView("state")
    spark.sql("select key, value from state where value > 100 order by value desc").show()

    in_flight = read_channel_state(spark, "ck/", checkpoint_id=7)

or, once the source is registered (:func:`register`, or any call of the functions above)::

    spark.read.format("cutline").option("operator", "sum").load("ck/chk-7")
    spark.read.format("cutline").option("channelState", "true").load("ck/")

**Keyed state** (one row per key of every keyed state of one operator):

==============  ==========  ==================================================================
``subtask``     string      the subtask whose part of the checkpoint holds the entry
``key_group``   int         the key's key group
``key``         (inferred)  the key
``state``       string      the state's name (``ValueState`` / ``ListState`` / ``MapState``;
                            a rolling aggregation's is ``sum``, ``count``, ...)
``value``       (inferred)  the value (a list for list state, a dict for map state)
==============  ==========  ==================================================================

The types of ``key`` and ``value`` are inferred from a bounded sample (the first
``sampleSize`` entries of every subtask, 2,000 by default), value by value:

* ``bool`` -> boolean; ``int`` -> long (when every one fits in 64 bits); ``float``, or ints
  and floats together -> double; ``str`` -> string; ``bytes`` -> binary; NumPy scalars count as
  the Python value they hold (``numpy.int64`` is an int);
* a ``list`` whose elements all have one such type -> array of it; a ``dict`` whose keys
  have one type and whose values have one type -> map;
* ``None`` is null in any column;
* anything else (tuples, objects, ...), and types that differ within a column (say ints and
  strings, or lists and dicts) -> string, holding ``repr(value)`` of every value.

Option ``types="string"`` makes both columns such strings, without sampling. When an entry
beyond the sample does not fit the inferred type, the read fails with a
:class:`StateTypeError` that names the key and the value and points to ``types="string"``.
Option ``state`` keeps one state of the operator: its values usually have one type, whereas
an operator with value, list and map state has a ``value`` column of strings.

**Channel state** (option ``channelState``; one row per record in flight that an unaligned
checkpoint, or a loop, recorded):

==============  ==========  ==================================================================
``subtask``     string      the subtask that recorded it
``side``        string      ``input`` (recorded by the receiver) or ``output`` (overtaken at
                            the sender)
``channel``     string      the channel
``position``    long        its place among the records recorded on that side of the channel
``record``      string      a record that is a dict (every row of a columnar batch is one) as
                            JSON (values JSON cannot hold, such as timestamps or bytes, as
                            their ``str``); any other record as its ``repr``
==============  ==========  ==================================================================

**Options** of ``spark.read.format("cutline")`` (names are case-insensitive):

* ``path`` (the argument of ``load``): a checkpoint or savepoint folder (with ``_metadata``),
  or a checkpoint directory (its newest complete checkpoint, or ``chk-ID`` with
  ``checkpoint``); a local path or any fsspec URL;
* ``checkpoint``: a checkpoint id of the directory ``path``;
* ``operator``: the keyed operator (its name, as given with ``name=``, or its uid); without
  it, the checkpoint's only keyed operator;
* ``state``: only this state of the operator;
* ``types``: ``infer`` (the default) or ``string``;
* ``sampleSize``: entries per subtask to infer the types from;
* ``channelState``: ``true`` for the channel state instead of keyed state;
* ``storageOptions``: a JSON object of fsspec storage options (credentials, endpoints...).

**Errors**: whatever stops a read (a missing directory, a folder that is not a checkpoint, a
damaged file, an unknown operator or state, a checkpoint without keyed state) is an
:class:`~cutline.runtime.checkpoint.reader.InspectError` whose message names the problem.
:func:`read_state` and :func:`read_channel_state` check the checkpoint, and infer the types,
in the calling process before Spark plans anything, so that is what they raise. Through
``spark.read.format("cutline")`` the same error comes wrapped by Spark (an
``AnalysisException`` whose message holds it); an error in an executor (a file damaged
after the DataFrame was made, a :class:`StateTypeError`) comes as Spark's
``PythonException`` with the message in it.

Every executor reads the checkpoint the DataFrame was made from (pinned when it is made),
even if a newer one completes meanwhile; a checkpoint discarded in between fails the read.
"""

from __future__ import annotations

import contextlib
import json
import os
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
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

from cutline.runtime.checkpoint.reader import (
    CheckpointReader,
    InspectError,
    KeyedEntry,
    open_checkpoint,
)
from cutline.runtime.checkpoint.storage import StorageError

FORMAT = "cutline"
"""The data source's name: ``spark.read.format("cutline")``."""

SAMPLE_SIZE = 2000
"""Entries per subtask the types of ``key`` and ``value`` are inferred from (by default)."""

KEYED_COLUMNS = ("subtask", "key_group", "key", "state", "value")
CHANNEL_COLUMNS = ("subtask", "side", "channel", "position", "record")

CHANNEL_SCHEMA = StructType(
    [
        StructField("subtask", StringType(), False),
        StructField("side", StringType(), False),
        StructField("channel", StringType(), False),
        StructField("position", LongType(), False),
        StructField("record", StringType(), True),
    ]
)

TYPES = ("infer", "string")
_SHAPES_OPTION = "cutline.shapes"
"""Internal: the types :func:`read_state` inferred, so that Spark does not sample again."""
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1


class StateTypeError(InspectError):
    """An entry of the keyed state does not fit the column type inferred from the sample
    (read with ``types="string"``)."""


# ---------------------------------------------------------------------------------- options


@dataclass(frozen=True)
class ReadOptions:
    """The options of one read, checked."""

    path: str
    checkpoint_id: int | None = None
    operator: str | None = None
    state: str | None = None
    channel_state: bool = False
    types: str = "infer"
    sample_size: int = SAMPLE_SIZE
    storage_options: dict[str, Any] | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        """The options of ``spark.read.format("cutline").option(...)`` (case-insensitive keys,
        text values); :class:`InspectError` if one is wrong."""
        lowered = {str(k).lower(): v for k, v in options.items()}
        path = lowered.get("path")
        if not path:
            raise InspectError(
                'name the checkpoint to read: spark.read.format("cutline").load(PATH), with a '
                "checkpoint or savepoint folder, or a checkpoint directory"
            )
        checkpoint_id = None
        if lowered.get("checkpoint") not in (None, ""):
            text = str(lowered["checkpoint"]).strip()
            if not text.isdigit():
                raise InspectError(f"option checkpoint: {text!r} is not a checkpoint id")
            checkpoint_id = int(text)
        channel = str(lowered.get("channelstate") or "false").strip().lower()
        if channel not in ("true", "false"):
            raise InspectError(f"option channelState: {channel!r} is neither true nor false")
        types = str(lowered.get("types") or "infer").strip().lower()
        if types not in TYPES:
            raise InspectError(
                f"option types: {types!r} is not one of {', '.join(map(repr, TYPES))}"
            )
        sample = str(lowered.get("samplesize") or SAMPLE_SIZE).strip()
        if not sample.isdigit() or int(sample) < 1:
            raise InspectError(f"option sampleSize: {sample!r} is not a positive integer")
        storage_options = None
        if lowered.get("storageoptions"):
            try:
                storage_options = json.loads(lowered["storageoptions"])
            except ValueError as exc:
                raise InspectError(f"option storageOptions is not JSON: {exc}") from None
            if not isinstance(storage_options, dict):
                raise InspectError("option storageOptions must be a JSON object")
        result = cls(
            path=str(path),
            checkpoint_id=checkpoint_id,
            operator=lowered.get("operator") or None,
            state=lowered.get("state") or None,
            channel_state=channel == "true",
            types=types,
            sample_size=int(sample),
            storage_options=storage_options,
        )
        if result.channel_state and (result.operator or result.state):
            raise InspectError(
                "the channel state is every subtask's, not an operator's: drop the option "
                f"{'operator' if result.operator else 'state'} (or channelState)"
            )
        return result

    def open(self) -> CheckpointReader:
        """The checkpoint these options name."""
        with _readable(self.path):
            return open_checkpoint(
                self.path, self.checkpoint_id, storage_options=self.storage_options
            )


@contextlib.contextmanager
def _readable(what: str) -> Iterator[None]:
    """Turn storage errors (a damaged or unreadable file) into :class:`InspectError`."""
    try:
        yield
    except InspectError:
        raise
    except StorageError as exc:
        raise InspectError(f"cannot read the checkpoint {what}: {exc}") from None


@dataclass(frozen=True)
class _Pinned:
    """One checkpoint, as the executors find it again: its folder and its id."""

    folder: str
    checkpoint_id: int
    storage_options: dict[str, Any] | None

    @classmethod
    def of(cls, reader: CheckpointReader, options: ReadOptions) -> _Pinned:
        return cls(reader.location.url, reader.checkpoint_id, options.storage_options)

    def open(self) -> CheckpointReader:
        with _readable(self.folder):
            reader = open_checkpoint(self.folder, storage_options=self.storage_options)
        if reader.checkpoint_id != self.checkpoint_id:
            raise InspectError(
                f"{self.folder} now holds checkpoint {reader.checkpoint_id}, not checkpoint "
                f"{self.checkpoint_id} the DataFrame was made from"
            )
        return reader


# ------------------------------------------------------------------------------------ types


@dataclass(frozen=True)
class Shape:
    """The type of a column (or of the elements, keys or values inside one).

    ``kind``: ``boolean``, ``long``, ``double``, ``string``, ``binary``, ``array``
    (``element``), ``map`` (``key``, ``value``), ``repr`` (a string holding ``repr(value)``),
    ``unknown`` (only nulls or empty containers seen); and, for a schema the user gave,
    ``text`` (a string: strings as they are, anything else as its ``repr``) and ``any``
    (handed to Spark as it is)."""

    kind: str
    element: Shape | None = None
    key: Shape | None = None
    value: Shape | None = None

    def to_json(self) -> Any:
        if self.kind == "array":
            assert self.element is not None
            return ["array", self.element.to_json()]
        if self.kind == "map":
            assert self.key is not None and self.value is not None
            return ["map", self.key.to_json(), self.value.to_json()]
        return self.kind

    @classmethod
    def from_json(cls, data: Any) -> Shape:
        if isinstance(data, str) and data in _PLAIN:
            return _PLAIN[data]
        if isinstance(data, list) and len(data) == 2 and data[0] == "array":
            return cls("array", element=cls.from_json(data[1]))
        if isinstance(data, list) and len(data) == 3 and data[0] == "map":
            return cls("map", key=cls.from_json(data[1]), value=cls.from_json(data[2]))
        raise ValueError(f"{data!r} is not a column type")

    def spark_type(self) -> DataType:
        """The Spark type of the column."""
        if self.kind == "array":
            assert self.element is not None
            return ArrayType(self.element.spark_type(), True)
        if self.kind == "map":
            assert self.key is not None and self.value is not None
            return MapType(self.key.spark_type(), self.value.spark_type(), True)
        return _SPARK_TYPES[self.kind]()

    def describe(self) -> str:
        text: str = self.spark_type().simpleString()
        return f"{text} (repr)" if self.kind == "repr" else text


BOOLEAN, LONG, DOUBLE = Shape("boolean"), Shape("long"), Shape("double")
STRING, BINARY, REPR, UNKNOWN = Shape("string"), Shape("binary"), Shape("repr"), Shape("unknown")
TEXT, ANY = Shape("text"), Shape("any")
_PLAIN = {s.kind: s for s in (BOOLEAN, LONG, DOUBLE, STRING, BINARY, REPR, UNKNOWN, TEXT, ANY)}
_SPARK_TYPES: dict[str, Callable[[], DataType]] = {
    "boolean": BooleanType,
    "long": LongType,
    "double": DoubleType,
    "string": StringType,
    "binary": BinaryType,
    "repr": StringType,
    "unknown": StringType,
    "text": StringType,
}


def _plain(value: Any) -> Any:
    """``value``, a NumPy scalar as the Python value it holds."""
    return value.item() if isinstance(value, np.generic) else value


def shape_of(value: Any) -> Shape:
    """The column type one value asks for (``repr`` if it fits no other)."""
    value = _plain(value)
    if value is None:
        return UNKNOWN
    if isinstance(value, bool):
        return BOOLEAN
    if isinstance(value, int):
        return LONG if _LONG_MIN <= value <= _LONG_MAX else REPR
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
        return Shape("array", element=element)
    if type(value) is dict:
        key, item = UNKNOWN, UNKNOWN
        for k, v in value.items():
            if _plain(k) is None:
                return REPR  # Spark's maps have no null keys
            key, item = unify(key, shape_of(k)), unify(item, shape_of(v))
            if REPR in (key, item):
                return REPR
        return Shape("map", key=key, value=item)
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
    if {a.kind, b.kind} == {"long", "double"}:
        return DOUBLE
    if a.kind == b.kind == "array":
        assert a.element is not None and b.element is not None
        element = unify(a.element, b.element)
        return REPR if element == REPR else Shape("array", element=element)
    if a.kind == b.kind == "map":
        assert a.key and a.value and b.key and b.value
        key, value = unify(a.key, b.key), unify(a.value, b.value)
        return REPR if REPR in (key, value) else Shape("map", key=key, value=value)
    return REPR


def finish(shape: Shape) -> Shape:
    """``shape`` as a column type: what was never seen (only nulls, empty lists or dicts)
    becomes a string of ``repr``."""
    if shape.kind == "unknown":
        return REPR
    if shape.kind == "array":
        assert shape.element is not None
        return Shape("array", element=finish(shape.element))
    if shape.kind == "map":
        assert shape.key is not None and shape.value is not None
        return Shape("map", key=finish(shape.key), value=finish(shape.value))
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
        return Shape("array", element=shape_of_type(data_type.elementType))
    if isinstance(data_type, MapType):
        return Shape(
            "map", key=shape_of_type(data_type.keyType), value=shape_of_type(data_type.valueType)
        )
    return ANY


class _Misfit(Exception):
    """A value does not fit its column's type."""


def converter(shape: Shape) -> Callable[[Any], Any]:
    """A function of a value to what its column holds; :class:`_Misfit` if it does not fit."""
    kind = shape.kind
    if kind == "array":
        assert shape.element is not None
        element = converter(shape.element)

        def array(value: Any) -> Any:
            if value is None:
                return None
            if type(value) is not list:
                raise _Misfit
            return [element(v) for v in value]

        return array
    if kind == "map":
        assert shape.key is not None and shape.value is not None
        key, item = converter(shape.key), converter(shape.value)

        def mapping(value: Any) -> Any:
            if value is None:
                return None
            if type(value) is not dict:
                raise _Misfit
            converted = {}
            for k, v in value.items():
                k = key(k)
                if k is None:
                    raise _Misfit
                converted[k] = item(v)
            return converted

        return mapping
    return _SCALARS[kind]


def _boolean(value: Any) -> Any:
    value = _plain(value)
    if value is None or isinstance(value, bool):
        return value
    raise _Misfit


def _long(value: Any) -> Any:
    value = _plain(value)
    if value is None or (
        isinstance(value, int) and not isinstance(value, bool) and _LONG_MIN <= value <= _LONG_MAX
    ):
        return value
    raise _Misfit


def _double(value: Any) -> Any:
    value = _plain(value)
    if value is None:
        return None
    if isinstance(value, float | int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            raise _Misfit from None
    raise _Misfit


def _string(value: Any) -> Any:
    if value is None or isinstance(value, str):
        return None if value is None else str(value)
    raise _Misfit


def _binary(value: Any) -> Any:
    value = _plain(value)
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise _Misfit


def _repr(value: Any) -> Any:
    value = _plain(value)
    return None if value is None else repr(value)


def _text(value: Any) -> Any:
    value = _plain(value)
    if value is None or isinstance(value, str):
        return value
    return repr(value)


_SCALARS: dict[str, Callable[[Any], Any]] = {
    "boolean": _boolean,
    "long": _long,
    "double": _double,
    "string": _string,
    "binary": _binary,
    "repr": _repr,
    "unknown": _repr,
    "text": _text,
    "any": lambda value: value,
}


@dataclass(frozen=True)
class KeyedShapes:
    """The types of the ``key`` and ``value`` columns."""

    key: Shape
    value: Shape

    def schema(self) -> StructType:
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
        return json.dumps({"key": self.key.to_json(), "value": self.value.to_json()})

    @classmethod
    def from_json(cls, text: str) -> KeyedShapes:
        try:
            data = json.loads(text)
            return cls(Shape.from_json(data["key"]), Shape.from_json(data["value"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise InspectError(f"option {_SHAPES_OPTION} is not valid: {exc}") from None


# ------------------------------------------------------------------------------ keyed state


def _keyed_subtasks(reader: CheckpointReader, uid: str) -> list[str]:
    """The subtasks holding part of operator ``uid``'s state (from the metadata)."""
    return sorted(s for s, handle in reader.handles.items() if uid in handle.operators)


def infer_shapes(reader: CheckpointReader, uid: str, options: ReadOptions) -> KeyedShapes:
    """The column types of operator ``uid``'s keyed state: from the first
    ``options.sample_size`` entries (of ``options.state``) of every subtask, or strings with
    ``types="string"``. :class:`InspectError` if ``options.state`` names no state."""
    if options.types == "string" and options.state is None:
        return KeyedShapes(REPR, REPR)
    key, value = UNKNOWN, UNKNOWN
    names: set[str] = set()
    found = False
    for subtask in _keyed_subtasks(reader, uid):
        if found and key == value == REPR:
            break
        taken = 0
        with _readable(f"{reader.location.url} ({subtask})"):
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


@dataclass(frozen=True)
class _Plan:
    """What the executors read: the checkpoint, the operator, and the columns' types."""

    checkpoint: _Pinned
    uid: str
    state: str | None
    subtasks: tuple[str, ...]
    shapes: KeyedShapes


def _plan_keyed(options: ReadOptions, shapes: KeyedShapes | None = None) -> _Plan:
    """Open the checkpoint, find the operator, infer the types (unless given)."""
    reader = options.open()
    with _readable(reader.location.url):
        uid = reader.resolve_operator(options.operator)
    if shapes is None:
        shapes = infer_shapes(reader, uid, options)
    return _Plan(
        _Pinned.of(reader, options),
        uid,
        options.state,
        tuple(_keyed_subtasks(reader, uid)),
        shapes,
    )


class KeyedStateReader(DataSourceReader):
    """Reads one operator's keyed state: one partition per subtask holding part of it."""

    def __init__(self, plan: _Plan, schema: StructType, shapes: KeyedShapes) -> None:
        self.plan = plan
        self.columns = _order(schema, KEYED_COLUMNS)
        self.shapes = shapes

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(subtask) for subtask in self.plan.subtasks]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        subtask = partition.value
        if subtask is None:
            return  # Spark's single partition of a source without any
        plan = self.plan
        reader = plan.checkpoint.open()
        to_key, to_value = converter(self.shapes.key), converter(self.shapes.value)
        columns = self.columns
        with _readable(f"{plan.checkpoint.folder} ({subtask})"):
            for entry in reader.keyed_entries_of(subtask, plan.uid):
                if plan.state is not None and entry.state != plan.state:
                    continue
                try:
                    key = to_key(entry.key)
                except _Misfit:
                    raise _misfit(entry, "key", entry.key, self.shapes.key, plan.state) from None
                try:
                    value = to_value(entry.value)
                except _Misfit:
                    raise _misfit(
                        entry, "value", entry.value, self.shapes.value, plan.state
                    ) from None
                row = (entry.subtask, entry.key_group, key, entry.state, value)
                yield tuple(row[i] for i in columns)


def _misfit(
    entry: KeyedEntry, column: str, value: Any, shape: Shape, state: str | None
) -> StateTypeError:
    hint = "" if state is not None else ", or read one state with the option state"
    return StateTypeError(
        f"the {column} of key {_short(entry.key)} in state {entry.state!r} ({entry.subtask}) is "
        f"{_short(value)} ({type(value).__name__}), which does not fit the column type "
        f"{shape.describe()} inferred from a sample of the checkpoint: read it with "
        f'types="string" (every key and value as its repr){hint}'
    )


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def _order(schema: StructType, columns: tuple[str, ...]) -> tuple[int, ...]:
    """For every field of ``schema``, the index of its column in ``columns``."""
    names = list(schema.fieldNames())
    if sorted(names) != sorted(columns):
        raise InspectError(
            f"the schema's columns ({', '.join(names)}) are not the source's: {', '.join(columns)}"
        )
    return tuple(columns.index(name) for name in names)


# ---------------------------------------------------------------------------- channel state


def record_text(record: Any) -> str | None:
    """A record of the channel state as text: a dict as JSON, anything else as its repr."""
    record = _plain(record)
    if record is None:
        return None
    if isinstance(record, dict):
        try:
            return json.dumps(record, default=str, ensure_ascii=False)
        except (TypeError, ValueError):
            pass  # keys JSON cannot hold (tuples...), or values that refer to themselves
    return repr(record)


class ChannelStateReader(DataSourceReader):
    """Reads the recorded channel state: one partition per subtask that recorded some."""

    def __init__(self, checkpoint: _Pinned, subtasks: tuple[str, ...], schema: StructType) -> None:
        self.checkpoint = checkpoint
        self.subtasks = subtasks
        self.columns = _order(schema, CHANNEL_COLUMNS)

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(subtask) for subtask in self.subtasks]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        subtask = partition.value
        if subtask is None:
            return
        reader = self.checkpoint.open()
        columns = self.columns
        with _readable(f"{self.checkpoint.folder} ({subtask})"):
            for found in reader.channel_state(subtask):
                row = (
                    found.subtask,
                    found.side,
                    found.channel,
                    found.position,
                    record_text(found.record),
                )
                yield tuple(row[i] for i in columns)


def _channel_subtasks(reader: CheckpointReader) -> tuple[str, ...]:
    return tuple(sorted(s for s, handle in reader.handles.items() if handle.channel_state))


# ------------------------------------------------------------------------------ data source


class CutlineDataSource(DataSource):
    """``spark.read.format("cutline")``: the keyed state or the channel state of a checkpoint
    (the module's docstring lists the options and columns)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def _read_options(self) -> ReadOptions:
        return ReadOptions.parse(self.options)

    def schema(self) -> StructType:
        options = self._read_options()
        if options.channel_state:
            reader = options.open()
            self._pinned = (_Pinned.of(reader, options), _channel_subtasks(reader))
            return CHANNEL_SCHEMA
        given = self.options.get(_SHAPES_OPTION)
        plan = _plan_keyed(options, KeyedShapes.from_json(given) if given else None)
        self._plan = plan
        return plan.shapes.schema()

    def reader(self, schema: StructType) -> DataSourceReader:
        options = self._read_options()
        if options.channel_state:
            pinned = getattr(self, "_pinned", None)
            if pinned is None:  # the user gave the schema: schema() was not called
                reader = options.open()
                pinned = (_Pinned.of(reader, options), _channel_subtasks(reader))
            return ChannelStateReader(pinned[0], pinned[1], schema)
        plan: _Plan | None = getattr(self, "_plan", None)
        if plan is None:  # the user gave the schema: its types rule
            plan = _plan_keyed(options, KeyedShapes(ANY, ANY))
            fields = {field.name: field.dataType for field in schema.fields}
            shapes = KeyedShapes(
                shape_of_type(fields.get("key", StringType())),
                shape_of_type(fields.get("value", StringType())),
            )
            return KeyedStateReader(plan, schema, shapes)
        return KeyedStateReader(plan, schema, plan.shapes)


# -------------------------------------------------------------------------------- functions

_REGISTERED: weakref.WeakSet[SparkSession] = weakref.WeakSet()


def register(spark: SparkSession) -> None:
    """Make ``spark.read.format("cutline")`` available in the session ``spark`` (once; again
    is a no-op)."""
    if spark in _REGISTERED:
        return
    spark.dataSource.register(CutlineDataSource)
    _REGISTERED.add(spark)


def read_state(
    spark: SparkSession,
    checkpoint: str | os.PathLike[str],
    operator: str | None = None,
    *,
    checkpoint_id: int | None = None,
    state: str | None = None,
    types: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    sample_size: int = SAMPLE_SIZE,
) -> DataFrame:
    """The keyed state of one operator in a checkpoint, as a DataFrame with the columns
    ``subtask``, ``key_group``, ``key``, ``state``, ``value`` (the module's docstring has the
    types).

    :param checkpoint: a checkpoint or savepoint folder, or a checkpoint directory (its newest
        complete checkpoint, or ``checkpoint_id``); a local path or an fsspec URL.
    :param operator: the keyed operator's name (``name=``) or uid; by default the only one.
    :param state: only the entries of this state (say ``"count"`` of a process function).
    :param types: ``"string"``: ``key`` and ``value`` as ``repr`` strings, not inferred.
    :param storage_options: fsspec options of the checkpoint's storage.
    :param sample_size: entries per subtask the types are inferred from.
    :raises InspectError: the checkpoint, the operator or the state cannot be read (the
        message says why); raised here, before Spark plans the read.
    """
    options = ReadOptions.parse(
        _text_options(
            path=os.fspath(checkpoint),
            checkpoint=checkpoint_id,
            operator=operator,
            state=state,
            types=types,
            sampleSize=sample_size,
            storageOptions=storage_options,
        )
    )
    plan = _plan_keyed(options)  # every error is raised here, cleanly, not inside Spark
    register(spark)
    pinned = _text_options(
        operator=plan.uid,
        state=state,
        types=options.types,
        sampleSize=sample_size,
        storageOptions=storage_options,
    )
    pinned[_SHAPES_OPTION] = plan.shapes.to_json()
    return spark.read.format(FORMAT).options(**pinned).load(plan.checkpoint.folder)


def read_channel_state(
    spark: SparkSession,
    checkpoint: str | os.PathLike[str],
    *,
    checkpoint_id: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> DataFrame:
    """The records in flight that a checkpoint recorded (unaligned checkpoints, loops), as a
    DataFrame with the columns ``subtask``, ``side``, ``channel``, ``position``, ``record``
    (empty for a checkpoint without channel state).

    :raises InspectError: the checkpoint cannot be read (the message says why)."""
    options = ReadOptions.parse(
        _text_options(
            path=os.fspath(checkpoint),
            checkpoint=checkpoint_id,
            channelState=True,
            storageOptions=storage_options,
        )
    )
    reader = options.open()
    for subtask in _channel_subtasks(reader):  # read them here: a damaged one fails cleanly
        with _readable(f"{reader.location.url} ({subtask})"):
            reader.state_file(subtask)
    register(spark)
    return (
        spark.read.format(FORMAT)
        .options(**_text_options(channelState=True, storageOptions=storage_options))
        .load(reader.location.url)
    )


def _text_options(**options: Any) -> dict[str, str]:
    """Options as the data source gets them (text; ``None`` left out)."""
    text = {}
    for name, value in options.items():
        if value is None:
            continue
        if isinstance(value, bool):
            text[name] = "true" if value else "false"
        elif isinstance(value, Mapping):
            try:
                text[name] = json.dumps(dict(value))
            except (TypeError, ValueError) as exc:
                raise InspectError(
                    f"{name}: the options reach Spark's executors as JSON, and these cannot "
                    f"be: {exc}"
                ) from None
        else:
            text[name] = str(value)
    return text


__all__ = [
    "CHANNEL_COLUMNS",
    "FORMAT",
    "KEYED_COLUMNS",
    "SAMPLE_SIZE",
    "ChannelStateReader",
    "CutlineDataSource",
    "InspectError",
    "KeyedStateReader",
    "ReadOptions",
    "StateTypeError",
    "read_channel_state",
    "read_state",
    "register",
]
