"""What a column holds: each value of the checkpoint converted to its column's type.

This is the executors' half of the types (:mod:`~cutline.spark.datasource.schema` is the
driver's): with the type of a column settled, :func:`converter` builds, once per partition,
a function that turns each stored value into what Spark expects of that column (a NumPy
scalar into the Python value it holds, a value of no narrower type into its ``repr``, ...).
A value the sample did not foresee raises :class:`Misfit`, which the reader turns, with
:func:`misfit`, into a :class:`StateTypeError` that names the entry and the way out
(``types="string"``). :func:`record_text` is the same for the channel state's one column of
text.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from cutline.runtime.checkpoint.reader import InspectError, KeyedEntry
from cutline.spark.datasource.schema import LONG_MAX, LONG_MIN, Kind, Shape, plain


class StateTypeError(InspectError):
    """An entry of the keyed state does not fit the column type inferred from the sample
    (read with ``types="string"``)."""


class Misfit(Exception):
    """A value does not fit its column's type."""


def converter(shape: Shape) -> Callable[[Any], Any]:
    """A function of a value to what its column holds; :class:`Misfit` if it does not fit."""
    kind = shape.kind
    if kind is Kind.ARRAY:
        assert shape.element is not None
        element = converter(shape.element)

        def array(value: Any) -> Any:
            if value is None:
                return None
            if type(value) is not list:
                raise Misfit
            return [element(v) for v in value]

        return array
    if kind is Kind.MAP:
        assert shape.key is not None and shape.value is not None
        key, item = converter(shape.key), converter(shape.value)

        def mapping(value: Any) -> Any:
            if value is None:
                return None
            if type(value) is not dict:
                raise Misfit
            converted = {}
            for k, v in value.items():
                k = key(k)
                if k is None:
                    raise Misfit
                converted[k] = item(v)
            return converted

        return mapping
    return _SCALARS[kind]


def _boolean(value: Any) -> Any:
    value = plain(value)
    if value is None or isinstance(value, bool):
        return value
    raise Misfit


def _long(value: Any) -> Any:
    value = plain(value)
    if value is None or (
        isinstance(value, int) and not isinstance(value, bool) and LONG_MIN <= value <= LONG_MAX
    ):
        return value
    raise Misfit


def _double(value: Any) -> Any:
    value = plain(value)
    if value is None:
        return None
    if isinstance(value, float | int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            raise Misfit from None
    raise Misfit


def _string(value: Any) -> Any:
    if value is None or isinstance(value, str):
        return None if value is None else str(value)
    raise Misfit


def _binary(value: Any) -> Any:
    value = plain(value)
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise Misfit


def _repr(value: Any) -> Any:
    value = plain(value)
    return None if value is None else repr(value)


def _text(value: Any) -> Any:
    value = plain(value)
    if value is None or isinstance(value, str):
        return value
    return repr(value)


_SCALARS: dict[Kind, Callable[[Any], Any]] = {
    Kind.BOOLEAN: _boolean,
    Kind.LONG: _long,
    Kind.DOUBLE: _double,
    Kind.STRING: _string,
    Kind.BINARY: _binary,
    Kind.REPR: _repr,
    Kind.UNKNOWN: _repr,
    Kind.TEXT: _text,
    Kind.ANY: lambda value: value,
}
"""The conversion of each kind of scalar (an array or a map is converted by its parts')."""


def misfit(
    entry: KeyedEntry, column: str, value: Any, shape: Shape, state: str | None
) -> StateTypeError:
    """The error of an ``entry`` whose ``column`` (``key`` or ``value``) holds a ``value``
    that does not fit the column's type ``shape``; ``state``, the state read (if only one)."""
    hint = "" if state is not None else ", or read one state with the option state"
    return StateTypeError(
        f"the {column} of key {_short(entry.key)} in state {entry.state!r} ({entry.subtask}) is "
        f"{_short(value)} ({type(value).__name__}), which does not fit the column type "
        f"{shape.describe()} inferred from a sample of the checkpoint: read it with "
        f'types="string" (every key and value as its repr){hint}'
    )


def _short(value: Any, limit: int = 200) -> str:
    """``repr(value)``, cut to ``limit`` characters (an error message quotes it)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def record_text(record: Any) -> str | None:
    """A record of the channel state as text: a dict as JSON, anything else as its repr."""
    record = plain(record)
    if record is None:
        return None
    if isinstance(record, dict):
        try:
            return json.dumps(record, default=str, ensure_ascii=False)
        except (TypeError, ValueError):
            pass  # keys JSON cannot hold (tuples...), or values that refer to themselves
    return repr(record)
