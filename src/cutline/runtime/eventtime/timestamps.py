"""Event time in the runtime: where a record's timestamp is (:class:`TimeColumn`).

A record's **event time** is a column (or field) of it: an Arrow timestamp (any unit, any time
zone) or integers of epoch milliseconds, as in Flink. Inside cutline every timestamp and
watermark is an integer of epoch milliseconds; what goes back into records (a window's
``window_start`` and ``window_end``) is given the column's own type again
(:meth:`TimeColumn.to_column`). Anything else in an event-time column is refused naming the
column and the type found.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias, get_args

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cutline.protocol.watermarks import (
    MAX_WATERMARK,
    MIN_WATERMARK,
)

__all__ = [
    "MAX_WATERMARK",
    "MIN_WATERMARK",
    "EventTimeError",
    "TimeColumn",
    "TimeUnit",
]

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)

TimeUnit: TypeAlias = Literal["s", "ms", "us", "ns"]
"""What integer times count since the epoch (seconds, milliseconds, micro- or nanoseconds)."""


class EventTimeError(ValueError):
    """An event-time setting or column that cannot be used (named in the message)."""


def _unit_of(type_: pa.DataType) -> str | None:
    """The unit of an Arrow timestamp type; ``None`` for integers (epoch ms)."""
    if pa.types.is_timestamp(type_):
        return str(type_.unit)
    return None


def check_time_type(column: str, type_: pa.DataType) -> None:
    """Refuse a column that is neither an Arrow timestamp nor integers (epoch ms)."""
    if not (pa.types.is_timestamp(type_) or pa.types.is_integer(type_)):
        hint = (
            f" (text: a file source reads it as timestamps with schema={{{column!r}: "
            "'timestamp[us]'}, ISO-8601 text with Z, an offset or none as UTC; a row whose "
            "text is no time is then rejected, to the dead letters with on_error='dead_letter')"
            if pa.types.is_string(type_) or pa.types.is_large_string(type_)
            else ""
        )
        raise EventTimeError(
            f"event_time={column!r}: the column is {type_}, but event time must be an Arrow "
            f"timestamp or integers of epoch milliseconds{hint}"
        )


UNITS: dict[TimeUnit, float] = {"s": 1000.0, "ms": 1.0, "us": 1 / 1000, "ns": 1 / 1_000_000}
"""The units integer times may count (``EventTime(..., unit=)``), in milliseconds each."""
assert set(UNITS) == set(get_args(TimeUnit))
SECONDS_LIKE = (10**8, 10**11)
"""Integers in this range read as epoch milliseconds fall in 1970-1973; as seconds, in 1973
to 5138: times that look like seconds (a warning says so when no unit was given)."""


@dataclass(frozen=True)
class TimeColumn:
    """Where a record's event time is: column ``column``, plus ``offset`` milliseconds (a
    window's results carry ``window_end - 1``: ``TimeColumn("window_end", -1)``); ``type`` is
    the column's Arrow type when known when the job is built (``None``: found from the
    records); ``unit`` what integer times count (``s``, ``ms``, ``us``, ``ns``; ``None``:
    milliseconds, as nobody said)."""

    column: str
    offset: int = 0
    type: pa.DataType | None = None
    unit: TimeUnit | None = None
    also: TimeColumn | None = None
    """(A join's results) a second column: a record's event time is the larger of the two,
    or the one it has when the other is null (an outer join's row without a partner)."""

    def __post_init__(self) -> None:
        if self.unit is not None and self.unit not in UNITS:
            raise EventTimeError(
                f"unit={self.unit!r}: use 's', 'ms', 'us' or 'ns' (what the integer "
                f"times of {self.column!r} count since the epoch)"
            )
        if self.type is not None:
            check_time_type(self.column, self.type)
            if self.unit is not None and not pa.types.is_integer(self.type):
                raise EventTimeError(
                    f"unit={self.unit!r} is for integer times: the column "
                    f"{self.column!r} is {self.type}, which says its unit itself"
                )

    @property
    def integers(self) -> bool:
        """Whether the column is known to hold integers (counting :attr:`unit`)."""
        return self.type is not None and pa.types.is_integer(self.type)

    @property
    def per_unit(self) -> float:
        """Milliseconds in one unit of the integer times."""
        return UNITS[self.unit or "ms"]

    def seconds_like(self, values: np.ndarray) -> str | None:
        """What to say when ``values`` (integer times read as milliseconds, no unit given)
        look like seconds (:data:`SECONDS_LIKE`): windows in 1970; else ``None``."""
        if self.unit is not None or not len(values):
            return None
        if self.type is not None and not pa.types.is_integer(self.type):
            return None
        highest = int(values.max()) - self.offset
        low, high = SECONDS_LIKE
        if not low <= highest < high:
            return None
        when = (_EPOCH + dt.timedelta(milliseconds=highest)).strftime("%Y-%m-%d %H:%M:%S UTC")
        return (
            f"event_time={self.column!r} holds integers like {highest}, read as epoch "
            f"milliseconds: {when}; if they count seconds, give EventTime({self.column!r}, "
            "unit='s') (or unit='ms' to say they are milliseconds)"
        )

    def timestamps(self, batch: Any) -> tuple[np.ndarray, np.ndarray | None]:
        """The timestamps of ``batch`` (epoch ms, int64), and a mask of the records without one
        (``None``: every record has one). A column of another type raises
        :class:`EventTimeError`; a record without the field is one without a timestamp."""
        if self.also is not None:
            return self._larger(batch, self.also)
        if isinstance(batch, pa.RecordBatch):
            index = batch.schema.get_field_index(self.column)
            if index < 0:
                raise EventTimeError(
                    f"event_time={self.column!r}: the records have no such column (columns: "
                    f"{', '.join(batch.schema.names)})"
                )
            return self._arrow(batch.column(index))
        values = np.zeros(len(batch), dtype=np.int64)
        missing = np.zeros(len(batch), dtype=bool)
        for i, record in enumerate(batch):
            try:
                value = record[self.column]
            except (KeyError, IndexError, TypeError):
                missing[i] = True
                continue
            ms = self.of_value(value)
            if ms is None:
                missing[i] = True
            else:
                values[i] = ms
        return values, (missing if missing.any() else None)

    def _larger(self, batch: Any, also: TimeColumn) -> tuple[np.ndarray, np.ndarray | None]:
        """The larger of this column's timestamps and ``also``'s, record by record."""
        one, one_missing = dataclasses.replace(self, also=None).timestamps(batch)
        other, other_missing = also.timestamps(batch)
        values = np.maximum(one, other)
        if one_missing is None and other_missing is None:
            return values, None
        if one_missing is not None:
            values = np.where(one_missing, other, values)
        if other_missing is not None:
            values = np.where(other_missing, one, values)
        if one_missing is None or other_missing is None:
            return values, None
        both = one_missing & other_missing
        return values, (both if both.any() else None)

    def present(self, batch: Any) -> np.ndarray:
        """The timestamps of ``batch``'s records that have one (epoch ms, int64)."""
        values, missing = self.timestamps(batch)
        return values if missing is None else values[~missing]

    def _arrow(self, column: pa.Array) -> tuple[np.ndarray, np.ndarray | None]:
        check_time_type(self.column, column.type)
        unit = _unit_of(column.type)
        missing = None
        if column.null_count:
            missing = np.asarray(column.is_null().to_numpy(zero_copy_only=False))
            column = pc.fill_null(column, pa.scalar(0, column.type))
        raw = column.cast(pa.int64()) if unit is not None else column
        values = np.asarray(raw.to_numpy(zero_copy_only=False)).astype(np.int64, copy=False)
        if unit is None and self.unit not in (None, "ms"):
            unit = self.unit  # (integers counting another unit)
        if unit == "s":
            values = values * 1000
        elif unit == "us":
            values = values // 1000
        elif unit == "ns":
            values = values // 1_000_000
        if self.offset:
            values = values + self.offset
        return values, missing

    def of_value(self, value: Any) -> int | None:
        """The timestamp of one field value (``None`` for a null)."""
        if value is None:
            return None
        if isinstance(value, bool):
            raise self._bad(type(value).__name__)
        if isinstance(value, int | np.integer):
            return int(int(value) * self.per_unit) + self.offset
        if isinstance(value, dt.datetime):
            aware = value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)
            return (aware - _EPOCH) // dt.timedelta(milliseconds=1) + self.offset
        raise self._bad(type(value).__name__)

    def _bad(self, found: str) -> EventTimeError:
        return EventTimeError(
            f"event_time={self.column!r}: a record's value is {found}, but event time must be "
            "a timestamp (datetime) or an integer of epoch milliseconds"
        )

    def to_column(self, values: Sequence[int] | np.ndarray) -> pa.Array:
        """Timestamps (epoch ms) as an Arrow array of the column's type (int64 when unknown)."""
        array = np.asarray(values, dtype=np.int64)
        type_ = self.type
        if type_ is None or pa.types.is_integer(type_):
            if self.unit not in (None, "ms"):
                array = _from_ms(array, str(self.unit))
            return pa.array(array, pa.int64()).cast(type_ or pa.int64())
        unit = str(type_.unit)
        if unit != "ms":
            array = _from_ms(array, unit)
        return pa.array(array, pa.int64()).cast(type_)

    def to_value(self, ms: int) -> Any:
        """One timestamp as a record's field: a ``datetime`` for a timestamp column, else ms."""
        type_ = self.type
        if type_ is None or pa.types.is_integer(type_):
            return ms if self.unit in (None, "ms") else int(_from_ms(np.array([ms]), self.unit)[0])
        stamp = _EPOCH + dt.timedelta(milliseconds=ms)
        return stamp if getattr(type_, "tz", None) else stamp.replace(tzinfo=None)


def _from_ms(array: np.ndarray, unit: str) -> np.ndarray:
    """Epoch milliseconds as integers of ``unit``."""
    if unit == "s":
        return array // 1000
    return array * (1000 if unit == "us" else 1_000_000)
