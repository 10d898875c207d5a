"""How a window store reads a batch's records: their keys and values, as columns
(:class:`RecordColumns`). The operator makes it; stores of every layout ask it."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import numpy as np
import pyarrow as pa

from cutline.runtime.eventtime.aggregations import Aggregation, number
from cutline.runtime.eventtime.output import LateRecords
from cutline.runtime.operators import OperatorContext, RecordError
from cutline.runtime.state.backend import KeyedStateBackend
from cutline.runtime.state.keygroups import key_groups


class RecordColumns:
    """A window operator's records as its stores take them: the key (``key``: a column's
    name, or a function of a record, read by ``get_key``) and the value of its
    ``aggregation``. A record whose key or value cannot be taken fails (``ctx.fail``: the
    job's ``on_error``); one too late for every window goes to ``late``."""

    def __init__(
        self,
        key: str | Callable[[Any], Hashable],
        get_key: Callable[[Any], Hashable],
        aggregation: Aggregation,
        backend: KeyedStateBackend,
        ctx: OperatorContext,
        late: LateRecords,
    ) -> None:
        self.key = key
        self.get_key = get_key
        self.aggregation = aggregation
        self.backend = backend
        self.ctx = ctx
        self.late = late

    def fail(self, record: object, exc: BaseException) -> None:
        """A record (or a window of a key: ``record`` names it) could not be processed: raise,
        or send it to the dead-letter output (the job's ``on_error``)."""
        self.ctx.fail(record, exc)

    def vectorizable(self, batch: pa.RecordBatch) -> bool:
        """Whether a built-in takes the batch as columns: its key column, and its value
        column numeric, there and without nulls."""
        names = batch.schema.names
        assert isinstance(self.key, str)
        if self.key not in names or batch.column(self.key).null_count:
            return False
        if not self.aggregation.takes_values:
            return True
        if self.aggregation.field not in names:
            return False
        column = batch.column(self.aggregation.field)
        numeric = pa.types.is_integer(column.type) or pa.types.is_floating(column.type)
        return numeric and not column.null_count

    def values(self, batch: pa.RecordBatch, taken: pa.Array | None = None) -> np.ndarray | None:
        """The built-in's values of the batch's records (of those at ``taken``), as NumPy;
        ``None`` for ``count``."""
        if not self.aggregation.takes_values:
            return None
        assert self.aggregation.field is not None
        column = batch.column(self.aggregation.field)
        if taken is not None:
            column = column.take(taken)
        return np.asarray(column.to_numpy(zero_copy_only=False))

    def owned(self, keys: pa.Array) -> np.ndarray:
        """Which of ``keys`` are in this subtask's key groups (of the windows kept as columns,
        a restore at another parallelism keeps only those)."""
        mine, maximum = self.backend.key_groups, self.backend.max_parallelism
        groups = key_groups(keys, maximum)
        mask: np.ndarray = (groups >= mine.start) & (groups < mine.stop)
        return mask

    def one_by_one(
        self,
        records: list[Any],
        ts: np.ndarray,
        times: Callable[[Hashable, int], list[int]],
    ) -> tuple[pa.Array, np.ndarray, np.ndarray | None] | None:
        """A built-in's records one by one, as columns: each record's key, once per time
        ``times(key, stamp)`` gives it (its windows' starts, or its own time; none: it is
        late), and its value (none for ``count``). A record whose key or value cannot be taken
        fails (``on_error``). ``None``: nothing is left."""
        keys: list[Any] = []
        found: list[int] = []
        values: list[Any] = []
        late: list[Any] = []
        aggregation, get_key, backend = self.aggregation, self.get_key, self.backend
        kind, field_name, takes_values = (
            aggregation.kind,
            aggregation.field,
            aggregation.takes_values,
        )
        for record, stamp in zip(records, ts.tolist(), strict=True):
            try:
                key = get_key(record)
                backend.set_current_key(key)  # (checks the key belongs here)
                if key is None:
                    raise RecordError(f"the record's key is null: {record!r}")
                value = number(record, field_name, kind) if takes_values else None
                mine = times(key, stamp)
                if not mine:
                    late.append(record)
                    continue
                for at in mine:
                    keys.append(key)
                    found.append(at)
                    values.append(value)
            except Exception as exc:
                self.fail(record, exc)
        if late:
            self.late.add(late)
        if not keys:
            return None
        array = np.array(values) if takes_values else None
        if array is not None and array.dtype == object:
            array = np.array([float(v) for v in values])  # (ints and floats mixed)
        return pa.array(keys), np.array(found, dtype=np.int64), array
