"""What a window computes: a built-in (``count``, ``sum``, ``min``, ``max``, ``mean`` of a numeric
column), a user's :class:`AggregateFunction`, ``reduce(fn)`` or ``process(fn)``; and the
vectorized kernels of the built-ins (records grouped by key and window with Arrow, sessions
cut with NumPy).
"""

from __future__ import annotations

import copy
import enum
from dataclasses import dataclass
from typing import Any, assert_never

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cutline.runtime.operators import RecordError, to_arrow

SAFE = 2**61
"""Integer sums stay in int64 while every value and sum is below this; beyond, Python ints."""


class AggregateFunction:
    """An incremental aggregation of a window's records (Flink's ``AggregateFunction``).
    Subclass it and pass an instance to ``.window(...).aggregate(fn)``.

    An accumulator may be changed in place and returned: cutline gives each call its own
    copy (a shallow ``copy.copy``) of what state holds."""

    def create_accumulator(self) -> Any:
        raise NotImplementedError

    def add(self, record: Any, accumulator: Any) -> Any:
        """The accumulator with ``record`` added."""
        raise NotImplementedError

    def merge(self, a: Any, b: Any) -> Any:
        """One accumulator of two (session windows merge)."""
        raise NotImplementedError

    def get_result(self, accumulator: Any) -> Any:
        """The window's result: a dict (its fields go into the output record, beside the key,
        ``window_start`` and ``window_end``) or a value (in a ``result`` field)."""
        raise NotImplementedError


class Kind(enum.StrEnum):
    """What an :class:`Aggregation` computes (equal to its name as a string)."""

    COUNT = "count"
    SUM = "sum"
    MIN = "min"
    MAX = "max"
    MEAN = "mean"
    AGGREGATE = "aggregate"
    """A user's :class:`AggregateFunction`."""
    REDUCE = "reduce"
    """A function of two records, giving one."""
    PROCESS = "process"
    """A function of the key, the window and its records."""
    PROCESS_BATCHES = "process_batches"
    """A function of the key, the window and its records as Arrow batches."""


BUILTINS = (Kind.COUNT, Kind.SUM, Kind.MIN, Kind.MAX, Kind.MEAN)

UFUNCS: dict[str, np.ufunc] = {
    "count": np.add,
    "sum": np.add,
    "mean": np.add,  # (its sum; its count is summed apart)
    "min": np.minimum,
    "max": np.maximum,
}
"""How a built-in's partial results combine, as the NumPy function every vectorized path
uses (``ufunc(a, b)`` for two arrays of them, ``ufunc.reduceat`` for runs of one)."""


def adds(kind: str) -> bool:
    """Whether built-in ``kind`` adds its partial results (integer sums may then outgrow
    int64: :data:`SAFE`)."""
    return UFUNCS[kind] is np.add


@dataclass(frozen=True)
class Aggregation:
    """What a window computes: a built-in (``kind`` in :data:`BUILTINS`, of ``field``), or a
    user's ``aggregate`` (an :class:`AggregateFunction`), ``reduce`` (a function of two
    records) or ``process`` (a function of the key, the window and its records)."""

    kind: Kind
    field: str | None = None
    fn: Any = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", Kind(self.kind))  # (a name given as a string)

    @property
    def builtin(self) -> bool:
        """A built-in (vectorized; the columnar layouts keep it)."""
        return self.kind in BUILTINS

    @property
    def mean(self) -> bool:
        """A mean: its accumulator is a sum and a count."""
        return self.kind is Kind.MEAN

    @property
    def takes_values(self) -> bool:
        """A built-in of a column's values (all but ``count``)."""
        return self.kind is not Kind.COUNT

    @property
    def collects(self) -> bool:
        """A window function given the window's records (``process``, ``process_batches``):
        a window keeps its records, in chunks."""
        return self.kind in (Kind.PROCESS, Kind.PROCESS_BATCHES)

    @property
    def output(self) -> str:
        """The output column of a built-in: ``count``, or the aggregated field."""
        return "count" if self.kind is Kind.COUNT else str(self.field)

    # the accumulator of one window, record by record

    def create(self) -> Any:
        match self.kind:
            case Kind.COUNT:
                return 0
            case Kind.MEAN:
                return (0, 0)
            case Kind.AGGREGATE:
                return self.fn.create_accumulator()
            case Kind.PROCESS | Kind.PROCESS_BATCHES:
                return ()  # (chunks: tuples of records, or Arrow batches)
            case Kind.SUM | Kind.MIN | Kind.MAX | Kind.REDUCE:
                return None  # (the first value)
            case _:
                assert_never(self.kind)

    def add(self, acc: Any, record: Any) -> Any:
        kind = self.kind
        match kind:
            case Kind.COUNT:
                return acc + 1
            case Kind.PROCESS:
                return (*acc, (record,))
            case Kind.PROCESS_BATCHES:  # (sessions, record by record)
                return (*acc, to_arrow([record], "process_batches"))
            case Kind.AGGREGATE:
                return self.fn.add(record, copy.copy(acc))
            case Kind.REDUCE:
                return record if acc is None else self.fn(copy.copy(acc), record)
            case Kind.MEAN:
                value = number(record, self.field, kind)
                return (acc[0] + value, acc[1] + 1)
            case Kind.SUM | Kind.MIN | Kind.MAX:
                return self.combine(acc, number(record, self.field, kind))
            case _:
                assert_never(kind)

    def combine(self, acc: Any, value: Any) -> Any:
        """A built-in's accumulator with ``value`` (a partial result of the same kind) in."""
        if acc is None:
            return value
        match self.kind:
            case Kind.SUM | Kind.COUNT:
                return acc + value
            case Kind.MIN:
                return value if value < acc else acc
            case Kind.MAX:
                return value if value > acc else acc
            case Kind.MEAN:
                return (acc[0] + value[0], acc[1] + value[1])
            case Kind.AGGREGATE | Kind.REDUCE | Kind.PROCESS | Kind.PROCESS_BATCHES:
                raise AssertionError(f"{self.kind} has no partial results to combine")
            case _:
                assert_never(self.kind)

    def merge(self, a: Any, b: Any) -> Any:
        """One accumulator of two windows' (sessions that merge)."""
        match self.kind:
            case Kind.PROCESS | Kind.PROCESS_BATCHES:
                return (*a, *b)
            case Kind.AGGREGATE:
                return self.fn.merge(copy.copy(a), copy.copy(b))
            case Kind.REDUCE:
                if a is None or b is None:
                    return b if a is None else a
                return self.fn(copy.copy(a), b)
            case Kind.COUNT | Kind.SUM | Kind.MIN | Kind.MAX | Kind.MEAN:
                return a if b is None else self.combine(a, b)
            case _:
                assert_never(self.kind)

    def result(self, acc: Any) -> Any:
        match self.kind:
            case Kind.MEAN:
                return acc[0] / acc[1] if acc[1] else None
            case Kind.AGGREGATE:
                return self.fn.get_result(acc)
            case (
                Kind.COUNT
                | Kind.SUM
                | Kind.MIN
                | Kind.MAX
                | Kind.REDUCE
                | Kind.PROCESS
                | Kind.PROCESS_BATCHES
            ):
                return acc
            case _:
                assert_never(self.kind)


def number(record: Any, field_name: str | None, kind: str) -> Any:
    try:
        value = record[field_name]
    except (KeyError, IndexError, TypeError):
        raise RecordError(f"the record has no field {field_name!r}: {record!r}") from None
    if isinstance(value, bool) or not isinstance(value, int | float | np.number):
        raise RecordError(
            f"{field_name!r} is {type(value).__name__} {value!r}, not a number ({kind} of a "
            "window needs numbers)"
        )
    return value


# ------------------------------------------------------------------------------- logic


def group_by_window(
    keys: Any, starts: np.ndarray, values: Any, kind: Kind
) -> tuple[pa.Array, np.ndarray, pa.ChunkedArray, pa.ChunkedArray | None]:
    """(key, window start[, value]) triples grouped by key and window with Arrow: per group its
    key, its start, its part of built-in ``kind`` (count, sum, least or greatest value; a
    mean's sum) and, for a mean, its count."""
    kind = Kind(kind)
    columns: dict[str, Any] = {"k": keys, "s": pa.array(starts, pa.int64())}
    if kind is Kind.COUNT:
        aggregations = [("s", "count")]
    else:
        columns["v"] = values
        aggregations = [("v", "sum"), ("v", "count")] if kind is Kind.MEAN else [("v", str(kind))]
    grouped = pa.table(columns).group_by(["k", "s"], use_threads=False).aggregate(aggregations)
    first = grouped.num_columns - len(aggregations)
    return (
        grouped.column("k").combine_chunks(),
        grouped.column("s").to_numpy(),
        grouped.column(first),
        grouped.column(first + 1) if kind is Kind.MEAN else None,
    )


def grouped_parts(
    keys: Any, starts: np.ndarray, values: Any, kind: str
) -> tuple[pa.Array, np.ndarray, np.ndarray, np.ndarray | None]:
    """:func:`group_by_window` of (key, window start[, value]) triples, the parts as NumPy
    arrays (ints as int64, floats as float64): per group its key, its start, its part, and a
    mean's count."""
    if values is not None and not isinstance(values, pa.Array | pa.ChunkedArray):
        values = pa.array(values)
    group_keys, group_starts, sums, counts = group_by_window(keys, starts, values, Kind(kind))
    parts = column_numbers(sums)
    return group_keys, group_starts, parts, None if counts is None else column_numbers(counts)


def cut_sessions(
    keys: Any, ts: np.ndarray, values: np.ndarray | None, kind: Kind, gap: int
) -> tuple[pa.Array, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Records cut into sessions per key (a new one where the next record of the key is more
    than ``gap`` after the one before): per session its key, first time, end (last time plus
    the gap), part of built-in ``kind`` (a mean's sum; integer sums that could overflow in
    Python ints) and count of records."""
    kind = Kind(kind)
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    encoded = pc.dictionary_encode(keys)
    codes = np.asarray(encoded.indices.to_numpy(zero_copy_only=False))
    order = np.lexsort((ts, codes))
    codes, ordered_ts = codes[order], ts[order]
    new = np.ones(len(order), dtype=bool)
    new[1:] = (codes[1:] != codes[:-1]) | (ordered_ts[1:] - ordered_ts[:-1] > gap)
    at = np.flatnonzero(new)
    counts = np.diff(np.r_[at, len(order)]).astype(np.int64)
    if kind is Kind.COUNT:
        acc = counts
    else:
        assert values is not None
        ordered = _numbers_of(values[order])
        if adds(kind) and ordered.dtype.kind in "iu" and largest(ordered) * len(ordered) >= SAFE:
            ordered = ordered.astype(object)
        acc = UFUNCS[kind].reduceat(ordered, at)
    ends = np.maximum.reduceat(ordered_ts, at) + gap
    return keys.take(pa.array(order[at])), ordered_ts[at], ends, acc, counts


def _numbers_of(values: np.ndarray) -> np.ndarray:
    if values.dtype.kind in "iu":
        return values.astype(np.int64, copy=False)
    if values.dtype.kind == "f":
        return values.astype(np.float64, copy=False)
    return values


def column_numbers(column: Any) -> np.ndarray:
    """An aggregate's column as a NumPy array (ints as int64, floats as float64)."""
    array = np.asarray(column.to_numpy())
    if array.dtype.kind in "iu":
        return array.astype(np.int64, copy=False)
    if array.dtype.kind == "f":
        return array.astype(np.float64, copy=False)
    return array


def largest(values: np.ndarray) -> int:
    if not len(values):
        return 0
    return int(max(abs(int(values.max())), abs(int(values.min()))))
