"""Windows on event time: which windows a record belongs to, what a window keeps, and when it
fires.

**Window assigners** (what ``keyed.window(...)`` takes; sizes are durations: ``"10s"``,
``"1 min"``, a ``timedelta`` or milliseconds; windows are aligned to the epoch, as in Flink):

* :class:`Tumbling` ``(size)``: ``[start, start + size)``, every record in exactly one.
* :class:`Sliding` ``(size, every=slide)``: windows of ``size`` starting every ``slide``; a
  record is in ``size / slide`` of them.
* :class:`Session` ``(gap=...)``: per key, records at most ``gap`` apart are one session;
  sessions merge when a record bridges them, or when they touch (Flink's and Spark's rule). A
  session's ``window_end`` is its last record's time plus the gap.

A window **fires** when the watermark reaches its last millisecond (``window_end - 1``): its
result is emitted with ``window_start`` and ``window_end`` (in the type of the event-time
column) and carries event time ``window_end - 1`` downstream, so a second window regroups
results (Flink's rules). A record is **late** when every window it belongs to fired more than
``allowed_lateness`` ago (a window whose end, minus one, plus the lateness, is at or below the
watermark); for a session: when the session the record alone would open is so. Late records
within the lateness update their window, which fires again with the new result; later ones go
to the **side output** ``"late"`` (``.late()``), as they came in, and are counted; a job that
does not read ``.late()`` only counts them (nothing keeps them).

**What a window keeps** is keyed state of the window operator (checkpointed, restored, and
redistributed by key group with the rest): per key, ``{window start: (accumulator, fired)}``,
or for sessions a tuple of ``(start, end, accumulator, fired)``. The timers (when each window
fires, and when a fired one is dropped) are rebuilt from it when the operator opens. Values in
state are never changed in place: every update stores a new one. On the memory backend a
built-in of a key column keeps its windows as columns instead (:class:`PaneWindowOperator`,
:class:`SessionColumnsOperator`); a restore reads either layout, whichever backend wrote the
checkpoint (:mod:`~cutline.runtime.window_layouts`).

**Aggregations** (:class:`Aggregation`): the built-ins ``count``, ``sum``, ``min``, ``max`` and
``mean`` of a numeric column, which take a vectorized path on Arrow batches (windows assigned
and grouped with NumPy and Arrow, then one state update per key and window); a user's
:class:`AggregateFunction`, ``reduce(fn)`` and ``process(fn)`` take the per-record path.
"""

from __future__ import annotations

import copy
import datetime as dt
import heapq
import itertools
import math
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cutline.protocol.watermarks import MAX_WATERMARK, MIN_WATERMARK
from cutline.runtime.operators import (
    Batch,
    Logic,
    OperatorContext,
    RecordError,
    _Keyed,
    rows,
    to_arrow,
    without_time,
)
from cutline.runtime.state.backend import KeyedSnapshot
from cutline.runtime.state.keygroups import key_group, key_groups
from cutline.runtime.time import EventTime, EventTimeError, duration_ms
from cutline.runtime.window_layouts import (
    WINDOWS,
    PaneParts,
    fired_flags,
    panes_as_windows,
    session_rows_as_windows,
    windows_as_panes,
    windows_as_session_rows,
)

LATE = "late"
"""The side output of the records too late for their windows."""


# ----------------------------------------------------------------------------- assigners


@dataclass(frozen=True)
class Tumbling:
    """Windows of ``size`` one after another: ``Tumbling("1 min")``."""

    size: Any

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", duration_ms(self.size, "Tumbling size"))

    def __str__(self) -> str:
        return f"Tumbling({_shown(self.size)})"


@dataclass(frozen=True)
class Sliding:
    """Windows of ``size`` starting every ``every``: ``Sliding("10 min", every="1 min")``."""

    size: Any
    every: Any

    def __post_init__(self) -> None:
        size = duration_ms(self.size, "Sliding size")
        every = duration_ms(self.every, "Sliding every")
        if every > size:
            raise EventTimeError(
                f"Sliding({_shown(size)}, every={_shown(every)}): the slide is longer than the "
                "window, so some records would be in no window; use Tumbling for a slide equal "
                "to the size"
            )
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "every", every)

    def __str__(self) -> str:
        return f"Sliding({_shown(self.size)}, every={_shown(self.every)})"


@dataclass(frozen=True)
class Session:
    """Per key, records at most ``gap`` apart: ``Session(gap="30 min")``."""

    gap: Any

    def __post_init__(self) -> None:
        object.__setattr__(self, "gap", duration_ms(self.gap, "Session gap"))

    def __str__(self) -> str:
        return f"Session(gap={_shown(self.gap)})"


Assigner = Tumbling | Sliding | Session


def _shown(ms: int) -> str:
    for unit, size in (("h", 3_600_000), ("min", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def assign(assigner: Tumbling | Sliding, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The windows of timestamps ``ts``: (index of the record, window start) per pair."""
    if isinstance(assigner, Tumbling):
        size = assigner.size
        return np.arange(len(ts)), ts - np.mod(ts, size)
    size, slide = assigner.size, assigner.every
    count = math.ceil(size / slide)
    last = ts - np.mod(ts, slide)
    starts = last[:, None] - slide * np.arange(count, dtype=np.int64)[None, :]
    inside = starts + size > ts[:, None]
    index = np.broadcast_to(np.arange(len(ts))[:, None], starts.shape)
    return index[inside], starts[inside]


def window_size(assigner: Tumbling | Sliding) -> int:
    return assigner.size  # type: ignore[no-any-return]


# --------------------------------------------------------------------------- aggregations


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


BUILTINS = ("count", "sum", "min", "max", "mean")


@dataclass(frozen=True)
class Aggregation:
    """What a window computes: a built-in (``kind`` in :data:`BUILTINS`, of ``field``), or a
    user's ``aggregate`` (an :class:`AggregateFunction`), ``reduce`` (a function of two
    records) or ``process`` (a function of the key, the window and its records)."""

    kind: str
    field: str | None = None
    fn: Any = None

    @property
    def builtin(self) -> bool:
        return self.kind in BUILTINS

    @property
    def output(self) -> str:
        """The output column of a built-in: ``count``, or the aggregated field."""
        return "count" if self.kind == "count" else str(self.field)

    # the accumulator of one window, record by record

    def create(self) -> Any:
        if self.kind == "count":
            return 0
        if self.kind == "mean":
            return (0, 0)
        if self.kind == "aggregate":
            return self.fn.create_accumulator()
        if self.kind in ("process", "process_batches"):
            return ()  # (chunks: tuples of records, or Arrow batches)
        return None  # sum, min, max, reduce: the first value

    def add(self, acc: Any, record: Any) -> Any:
        kind = self.kind
        if kind == "count":
            return acc + 1
        if kind == "process":
            return (*acc, (record,))
        if kind == "process_batches":  # (sessions, record by record)
            return (*acc, to_arrow([record], "process_batches"))
        if kind == "aggregate":
            return self.fn.add(record, copy.copy(acc))
        if kind == "reduce":
            return record if acc is None else self.fn(copy.copy(acc), record)
        value = _number(record, self.field, kind)
        if kind == "mean":
            return (acc[0] + value, acc[1] + 1)
        return self.combine(acc, value)

    def combine(self, acc: Any, value: Any) -> Any:
        """A built-in's accumulator with ``value`` (a partial result of the same kind) in."""
        kind = self.kind
        if acc is None:
            return value
        if kind in ("sum", "count"):
            return acc + value
        if kind == "min":
            return value if value < acc else acc
        if kind == "max":
            return value if value > acc else acc
        if kind == "mean":
            return (acc[0] + value[0], acc[1] + value[1])
        raise AssertionError(kind)

    def merge(self, a: Any, b: Any) -> Any:
        """One accumulator of two windows' (sessions that merge)."""
        kind = self.kind
        if kind in ("process", "process_batches"):
            return (*a, *b)
        if kind == "aggregate":
            return self.fn.merge(copy.copy(a), copy.copy(b))
        if kind == "reduce":
            if a is None or b is None:
                return b if a is None else a
            return self.fn(copy.copy(a), b)
        if b is None:
            return a
        return self.combine(a, b)

    def result(self, acc: Any) -> Any:
        if self.kind == "mean":
            return acc[0] / acc[1] if acc[1] else None
        if self.kind == "aggregate":
            return self.fn.get_result(acc)
        return acc


def _number(record: Any, field_name: str | None, kind: str) -> Any:
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


@dataclass(frozen=True)
class WindowLogic(Logic):
    """A keyed window operator: ``assigner`` windows of records keyed by ``key``, on event
    time ``event_time``, computing ``aggregation``."""

    assigner: Tumbling | Sliding | Session
    aggregation: Aggregation
    key: str | Callable[[Any], Hashable]
    event_time: EventTime
    allowed_lateness: int = 0
    time: str = "event"
    """``"event"``: windows of the records' event time, fired by watermarks;
    ``"processing"``: of the time each record arrives here, fired by the clock."""
    keyed = True

    def open(self, ctx: OperatorContext, state: Any) -> WindowOperator:
        if self.aggregation.builtin and isinstance(self.key, str) and ctx.state.backend == "memory":
            if isinstance(self.assigner, Session):
                return SessionColumnsOperator(self, ctx, state)
            return PaneWindowOperator(self, ctx, state)
        return WindowOperator(self, ctx, state)

    @property
    def key_column(self) -> str:
        """What the output calls the key: the key's column, or ``key``."""
        return self.key if isinstance(self.key, str) else "key"


class WindowOperator(_Keyed):
    """The running window operator of one subtask."""

    def __init__(self, logic: WindowLogic, ctx: OperatorContext, state: Any) -> None:
        super().__init__(ctx, state, logic.key)
        self.logic = logic
        self.assigner = logic.assigner
        self.aggregation = logic.aggregation
        self.event_time = logic.event_time
        self.lateness = logic.allowed_lateness
        self.table = self.backend.value_table(WINDOWS)
        self.watermark = MIN_WATERMARK
        self.fire = self.backend.timer_index("window-fire")
        """Windows not fired yet, by their last millisecond (namespace: start, end)."""
        self.clean = self.backend.timer_index("window-clean")
        """Fired windows kept for late records, by when they are dropped."""
        self.late_records = 0
        """Records too late for their windows (sent to the side output ``late``)."""
        self._late: list[Batch] = []
        """The late records not yet taken by the side output; only kept when the job reads
        it (``.late()``): otherwise they are counted and let go."""
        self._keeps_late = LATE in ctx.side_outputs
        self._session = isinstance(self.assigner, Session)
        self.processing = logic.time == "processing"
        self._time_type = self.event_time.type
        """The event-time column's type (learned from the records when the job could not
        know it: after ``assign_timestamps``): window_start and window_end come back in it."""
        # The watermark it had reached at the restored checkpoint: a window that fired then
        # must not open again for a record that was late then (it would be published twice).
        # Restored at another parallelism, each key keeps the watermark of the subtask it was
        # in, until the watermark passes them all.
        mine = self.backend.key_groups
        self._marks: list[tuple[range, int]] = []
        for handle in self.restored:
            start, stop = handle.get("key_groups", (0, 0))
            groups = range(max(start, mine.start), min(stop, mine.stop))
            if len(groups) and "watermark" in handle:
                self._marks.append((groups, int(handle["watermark"])))
                if self._time_type is None and handle.get("time_type") is not None:
                    self._time_type = handle["time_type"]
        if self._marks:
            self.watermark = min(m for _, m in self._marks)
        self._ceiling = max((m for _, m in self._marks), default=MIN_WATERMARK)
        self._restore_windows()

    # ------------------------------------------------------------------ timers

    def _end(self, start: int) -> int:
        assert not isinstance(self.assigner, Session)
        return start + window_size(self.assigner)

    def _restore_windows(self) -> None:
        """The restored windows in the keyed layout, whichever layout wrote them (a checkpoint
        of the memory backend keeps a built-in's windows as columns:
        :mod:`~cutline.runtime.window_layouts`), and their timers. The last step of opening:
        the columnar operators restore into their own layout instead."""
        mine, maximum = self.backend.key_groups, self.backend.max_parallelism
        for handle in self.restored:
            panes, rows = handle.get("panes"), handle.get("sessions")
            if not panes and not rows:
                continue
            start, stop = handle.get("key_groups", (0, 0))
            whole = range(start, stop) == mine
            found: dict[Hashable, Any] = (
                panes_as_windows(panes) if panes else session_rows_as_windows(rows or {})
            )
            for key, value in found.items():
                if not whole and key_group(key, maximum) not in mine:
                    continue  # rescaled: the keys of my key groups only
                old = self.table.get(key)
                if old is None:
                    self.table[key] = value
                elif self._session:  # (a key is in one old subtask: never, but kept whole)
                    self.table[key] = tuple(sorted((*old, *value)))
                else:
                    self.table[key] = {**old, **value}
        self._rebuild_timers()

    def _rebuild_timers(self) -> None:
        """From the restored windows: each one not fired fires at its end, each fired one is
        dropped after the lateness."""
        for key in list(self.backend.keys(WINDOWS)):
            value = self.table.get(key)
            for start, end, fired in self._windows_of(value):
                self._register(key, start, end, fired)

    def _windows_of(self, value: Any) -> Iterable[tuple[int, int, bool]]:
        if value is None:
            return
        if self._session:
            for start, end, _, fired in value:
                yield start, end, fired
        else:
            for start, (_, fired) in value.items():
                yield start, self._end(start), fired

    def _register(self, key: Hashable, start: int, end: int, fired: bool) -> None:
        if fired:
            self.clean.add(_add(end - 1, self.lateness), key, (start, end))
        else:
            self.fire.add(end - 1, key, (start, end))

    @property
    def open_windows(self) -> int:
        """Windows not fired yet."""
        return len(self.fire)

    def figures(self) -> dict[str, int] | None:
        return {
            "late": self.late_records,
            "windows": len(self.fire),
            "timers": len(self.fire) + len(self.clean),
        }

    # ------------------------------------------------------------------ records

    def _late_window(self, end: int, floor: int | None = None) -> bool:
        return _add(end - 1, self.lateness) <= (self.watermark if floor is None else floor)

    def _floor(self, key: Hashable) -> int:
        """The watermark a record of ``key`` is late against: the operator's, or, after a
        restore at another parallelism, that of the subtask whose state the key was in."""
        if self.watermark >= self._ceiling:
            return self.watermark
        group = key_group(key, self.backend.max_parallelism)
        for groups, mark in self._marks:
            if group in groups:
                return max(self.watermark, mark)
        return self.watermark

    def snapshot(
        self, checkpoint_id: int, *, base: int | None = None, savepoint: bool = False
    ) -> KeyedSnapshot:
        taken = super().snapshot(checkpoint_id, base=base, savepoint=savepoint)
        taken.extra["watermark"] = self.watermark
        if self._time_type is not None:
            taken.extra["time_type"] = self._time_type
        return taken

    def process(self, batch: Batch) -> Batch | None:
        if not len(batch):
            return None
        prepared = self._prepare(batch)
        if prepared is None:
            return None
        batch, ts = prepared
        if (
            self.aggregation.kind in ("process", "process_batches")
            and not self._session
            and self.watermark >= self._ceiling
        ):
            return self._collect(batch, ts)
        if (
            self.watermark >= self._ceiling  # (else the per-record path: lateness per key)
            and self.aggregation.builtin
            and isinstance(batch, pa.RecordBatch)
            and isinstance(self.key, str)
            and self._vectorizable(batch)
        ):
            if self._session:
                return self._sessions_vectorized(batch, ts)
            return self._windows_vectorized(batch, ts)
        return self._per_record(rows(batch), ts)

    def _prepare(self, batch: Batch) -> tuple[Batch, np.ndarray] | None:
        """The records with an event time (the others failed), and their timestamps (the time
        they arrive, for processing time); ``None`` when none is left."""
        if self.processing:
            now = int(time.time() * 1000)
            self.watermark = max(self.watermark, now - 1)
            return batch, np.full(len(batch), now, dtype=np.int64)
        try:
            ts, missing = self.event_time.timestamps(batch)
        except EventTimeError as exc:
            raise RecordError(str(exc)) from None
        if missing is not None:
            batch, ts = without_time(batch, ts, missing, self.event_time.column, self.ctx)
            if not len(batch):
                return None
        if self._time_type is None:
            self._learn_time_type(batch)
        return batch, ts

    def _owned(self, keys: pa.Array) -> np.ndarray:
        """Which of ``keys`` are in this subtask's key groups (of the windows kept as columns, a
        restore at another parallelism keeps only those)."""
        mine, maximum = self.backend.key_groups, self.backend.max_parallelism
        groups = key_groups(keys, maximum)
        return (groups >= mine.start) & (groups < mine.stop)

    def _record_columns(
        self,
        records: list[Any],
        ts: np.ndarray,
        times: Callable[[Hashable, int], list[int]],
    ) -> tuple[pa.Array, np.ndarray, np.ndarray | None] | None:
        """A built-in's records one by one, as columns: each record's key, once per time
        ``times(key, stamp)`` gives it (its windows' starts, or its own time; none: it is
        late, to the side output), and its value (none for ``count``). A record whose key or
        value cannot be taken fails (``on_error``). ``None``: nothing is left."""
        keys: list[Any] = []
        found: list[int] = []
        values: list[Any] = []
        late: list[Any] = []
        kind, field_name = self.aggregation.kind, self.aggregation.field
        for record, stamp in zip(records, ts.tolist(), strict=True):
            try:
                key = self.get_key(record)
                self.backend.set_current_key(key)  # (checks the key belongs here)
                if key is None:
                    raise RecordError(f"the record's key is null: {record!r}")
                value = None if kind == "count" else _number(record, field_name, kind)
                mine = times(key, stamp)
                if not mine:
                    late.append(record)
                    continue
                for at in mine:
                    keys.append(key)
                    found.append(at)
                    values.append(value)
            except Exception as exc:
                self.ctx.fail(record, exc)
        if late:
            self._too_late(late)
        if not keys:
            return None
        array = None if kind == "count" else np.array(values)
        if array is not None and array.dtype == object:
            array = np.array([float(v) for v in values])  # (ints and floats mixed)
        return pa.array(keys), np.array(found, dtype=np.int64), array

    def _learn_time_type(self, batch: Batch) -> None:
        """The event-time column's type, from the records (``assign_timestamps``)."""
        column = self.event_time.column
        if isinstance(batch, pa.RecordBatch):
            self._time_type = batch.schema.field(column).type
            return
        for record in batch:
            value = record.get(column) if isinstance(record, dict) else None
            if isinstance(value, dt.datetime):
                self._time_type = pa.timestamp("us", tz="UTC" if value.tzinfo else None)
                return
            if isinstance(value, int):
                self._time_type = pa.int64()
                return

    def _vectorizable(self, batch: pa.RecordBatch) -> bool:
        names = batch.schema.names
        assert isinstance(self.key, str)
        if self.key not in names or batch.column(self.key).null_count:
            return False
        if self.aggregation.kind == "count":
            return True
        if self.aggregation.field not in names:
            return False
        column = batch.column(self.aggregation.field)
        numeric = pa.types.is_integer(column.type) or pa.types.is_floating(column.type)
        return numeric and not column.null_count

    def _windows_vectorized(self, batch: pa.RecordBatch, ts: np.ndarray) -> Batch | None:
        assigner = self.assigner
        assert not isinstance(assigner, Session)
        index, starts = assign(assigner, ts)
        ends = starts + window_size(assigner)
        on_time = _add_array(ends - 1, self.lateness) > self.watermark
        self._note_late(batch, index, on_time)
        if not on_time.all():
            index, starts = index[on_time], starts[on_time]
        if not len(index):
            return None
        aggregation = self.aggregation
        assert isinstance(self.key, str)
        taken = pa.array(index)
        values = None
        if aggregation.kind != "count":
            assert aggregation.field is not None
            values = batch.column(aggregation.field).take(taken)
        grouped_keys, grouped_starts, sums, counts = group_by_window(
            batch.column(self.key).take(taken), starts, values, aggregation.kind
        )
        parts: list[Any] = sums.to_pylist()
        if counts is not None:  # mean: (sum, count)
            parts = list(zip(parts, counts.to_pylist(), strict=True))
        keys = grouped_keys.to_pylist()
        group_starts = grouped_starts.tolist()
        # one state update per key: a new dict for it (values in state are never changed)
        changes: dict[Hashable, list[tuple[int, Any]]] = {}
        for key, start, part in zip(keys, group_starts, parts, strict=True):
            changes.setdefault(key, []).append((start, part))
        refired: list[tuple[Hashable, int, int, Any]] = []
        size = window_size(assigner)
        table_state = self.table
        combine = aggregation.combine
        for key, updates in changes.items():
            old = table_state.get(key)
            windows = dict(old) if old else {}
            for start, part in updates:
                entry = windows.get(start)
                if entry is None:
                    windows[start] = (part, False)
                    self.fire.add(start + size - 1, key, (start, start + size))
                else:
                    acc, fired = entry
                    acc = combine(acc, part)
                    windows[start] = (acc, fired)
                    if fired:  # a late record within the lateness: the window fires again
                        refired.append((key, start, start + size, acc))
            table_state[key] = windows
        return self._results(refired) if refired else None

    def _note_late(self, batch: Batch, index: np.ndarray, on_time: np.ndarray) -> None:
        """Records none of whose windows is on time go to the side output, counted."""
        if on_time.all():
            return
        count = len(batch)
        alive = np.zeros(count, dtype=bool)
        alive[index[on_time]] = True
        late = ~alive
        if not late.any():
            return
        if not self._keeps_late:
            self.late_records += int(late.sum())
        elif isinstance(batch, pa.RecordBatch):
            self._too_late(batch.filter(pa.array(late)))
        else:
            self._too_late([r for r, x in zip(batch, late.tolist(), strict=True) if x])

    def _too_late(self, records: Batch) -> None:
        """Records too late for every window they belong to: counted, and kept for the side
        output ``late`` if the job reads it."""
        self.late_records += len(records)
        if self._keeps_late:
            self._late.append(records)

    def _sessions_vectorized(self, batch: pa.RecordBatch, ts: np.ndarray) -> Batch | None:
        assigner = self.assigner
        assert isinstance(assigner, Session) and isinstance(self.key, str)
        gap = assigner.gap
        on_time = _add_array(ts + gap - 1, self.lateness) > self.watermark
        self._note_late(batch, np.arange(len(ts)), on_time)
        if not on_time.any():
            return None
        if not on_time.all():
            batch, ts = batch.filter(pa.array(on_time)), ts[on_time]
        kind = self.aggregation.kind
        values = None
        if kind != "count":
            assert self.aggregation.field is not None
            values = np.asarray(batch.column(self.aggregation.field).to_numpy(zero_copy_only=False))
        keys, firsts, ends, acc, counts = cut_sessions(
            batch.column(self.key), ts, values, kind, gap
        )
        parts: list[Any] = acc.tolist()
        if kind == "mean":  # (sum, count)
            parts = list(zip(parts, counts.tolist(), strict=True))
        refired: list[tuple[Hashable, int, int, Any]] = []
        for key, first, end, part in zip(
            keys.to_pylist(), firsts.tolist(), ends.tolist(), parts, strict=True
        ):
            refired += self._merge_session(key, first, end, part)
        return self._results(refired) if refired else None

    def _merge_session(
        self, key: Hashable, start: int, end: int, acc: Any
    ) -> list[tuple[Hashable, int, int, Any]]:
        """Add the session ``[start, end)`` with ``acc`` to ``key``'s, merging those it
        overlaps; returns the merged session if it fired already (to fire again)."""
        sessions = self.table.get(key) or ()
        kept = []
        fired = False
        merge = self.aggregation.merge
        for s_start, s_end, s_acc, s_fired in sessions:
            if s_start <= end and start <= s_end:  # overlaps or touches: one session (Flink)
                start, end = min(start, s_start), max(end, s_end)
                acc = merge(s_acc, acc)
                fired = fired or s_fired
                if s_fired:
                    self.clean.discard(_add(s_end - 1, self.lateness), key, (s_start, s_end))
                else:
                    self.fire.discard(s_end - 1, key, (s_start, s_end))
            else:
                kept.append((s_start, s_end, s_acc, s_fired))
        # a fired session that grew past the watermark fires again when its new end passes
        refire_now = fired and self.watermark >= end - 1
        if fired and not refire_now:
            fired = False
        kept.append((start, end, acc, fired))
        kept.sort()
        self.table[key] = tuple(kept)
        self._register(key, start, end, fired)
        return [(key, start, end, acc)] if refire_now else []

    def _per_record(self, records: list[Any], ts: np.ndarray) -> Batch | None:
        aggregation, get_key = self.aggregation, self.get_key
        refired: dict[tuple[Hashable, int], tuple[Hashable, int, int, Any]] = {}
        late: list[Any] = []
        for record, stamp in zip(records, ts.tolist(), strict=True):
            try:
                key = get_key(record)
                self.backend.set_current_key(key)  # (checks the key belongs here)
                if self._session:
                    assert isinstance(self.assigner, Session)
                    end = stamp + self.assigner.gap
                    if self._late_window(end, self._floor(key)):
                        late.append(record)
                        continue
                    acc = aggregation.add(aggregation.create(), record)
                    for hit in self._merge_session(key, stamp, end, acc):
                        refired[(key, hit[1])] = hit
                    continue
                starts = self._starts(stamp)
                windows = dict(self.table.get(key) or {})
                size = window_size(self.assigner)  # type: ignore[arg-type]
                on_time = False
                floor = self._floor(key)
                for start in starts:
                    end = start + size
                    if self._late_window(end, floor):
                        continue
                    on_time = True
                    entry = windows.get(start)
                    if entry is None:
                        windows[start] = (aggregation.add(aggregation.create(), record), False)
                        self.fire.add(end - 1, key, (start, end))
                    else:
                        acc = aggregation.add(entry[0], record)
                        windows[start] = (acc, entry[1])
                        if entry[1]:
                            refired[(key, start)] = (key, start, end, acc)
                if not on_time:
                    late.append(record)
                    continue
                self.table[key] = windows
            except Exception as exc:
                self.ctx.fail(record, exc)
        if late:
            self._too_late(late)
        return self._results(list(refired.values())) if refired else None

    def _collect(self, batch: Batch, ts: np.ndarray) -> Batch | None:
        """``process`` and ``process_batches`` on tumbling and sliding windows: the records of
        the batch grouped by key and window, each group added to its window as one chunk (a
        tuple of records, or an Arrow batch): one state update per key and window, not per
        record."""
        assigner = self.assigner
        assert not isinstance(assigner, Session)
        arrow = self.aggregation.kind == "process_batches"
        if arrow:
            batch = to_arrow(batch, self.ctx.name)
        index, starts = assign(assigner, ts)
        size = window_size(assigner)
        on_time = _add_array(starts + size - 1, self.lateness) > self.watermark
        self._note_late(batch, index, on_time)
        if not on_time.all():
            index, starts = index[on_time], starts[on_time]
        if not len(index):
            return None
        records = None if arrow else rows(batch)
        keys, codes = self._key_codes(batch, records)
        if keys is None:
            return None
        pair_codes = codes[index]
        keep = pair_codes >= 0  # (a record whose key failed is in no window)
        index, starts, pair_codes = index[keep], starts[keep], pair_codes[keep]
        order = np.lexsort((starts, pair_codes))
        index, starts, pair_codes = index[order], starts[order], pair_codes[order]
        new = np.ones(len(order), dtype=bool)
        new[1:] = (pair_codes[1:] != pair_codes[:-1]) | (starts[1:] != starts[:-1])
        bounds = np.r_[np.flatnonzero(new), len(order)].tolist()
        refired: list[tuple[Hashable, int, int, Any]] = []
        changed: dict[Hashable, dict[int, tuple[Any, bool]]] = {}
        for a, b in itertools.pairwise(bounds):
            key, start = keys[int(pair_codes[a])], int(starts[a])
            members = index[a:b]
            if arrow:
                chunk: Any = batch.take(pa.array(members))
            else:
                assert records is not None
                chunk = tuple(records[i] for i in members.tolist())
            windows = changed.get(key)
            if windows is None:
                windows = changed[key] = dict(self.table.get(key) or {})
            entry = windows.get(start)
            if entry is None:
                windows[start] = ((chunk,), False)
                self.fire.add(start + size - 1, key, (start, start + size))
            else:
                acc = (*entry[0], chunk)
                windows[start] = (acc, entry[1])
                if entry[1]:
                    refired.append((key, start, start + size, acc))
        for key, windows in changed.items():
            self.table[key] = windows
        return self._results(refired) if refired else None

    def _key_codes(
        self, batch: Batch, records: list[Any] | None
    ) -> tuple[list[Any] | None, np.ndarray]:
        """The distinct keys of the batch's records and each record's index among them (-1:
        its key could not be taken: the record failed)."""
        if isinstance(batch, pa.RecordBatch) and isinstance(self.key, str) and records is None:
            if self.key not in batch.schema.names or batch.column(self.key).null_count:
                records = rows(batch)  # (named in the per-record failures below)
            else:
                encoded = pc.dictionary_encode(batch.column(self.key))
                uniques = encoded.dictionary.to_pylist()
                for key in uniques:
                    self.backend.set_current_key(key)  # (checks the key belongs here)
                codes = np.asarray(encoded.indices.to_numpy(zero_copy_only=False)).astype(np.int64)
                return uniques, codes
        if records is None:
            records = rows(batch)
        found: dict[Hashable, int] = {}
        codes = np.full(len(records), -1, dtype=np.int64)
        for i, record in enumerate(records):
            try:
                key = self.get_key(record)
                self.backend.set_current_key(key)
                codes[i] = found.setdefault(key, len(found))
            except Exception as exc:
                self.ctx.fail(record, exc)
        return list(found), codes

    def _starts(self, stamp: int) -> list[int]:
        assigner = self.assigner
        if isinstance(assigner, Tumbling):
            return [stamp - stamp % assigner.size]
        assert isinstance(assigner, Sliding)
        last = stamp - stamp % assigner.every
        out = []
        start = last
        while start + assigner.size > stamp:
            out.append(start)
            start -= assigner.every
        return out

    # ------------------------------------------------------------------ firing

    def on_watermark(self, watermark: int) -> Batch | None:
        if self.processing and watermark != MAX_WATERMARK:
            return None  # (the clock fires processing-time windows; the end, everything)
        return self._fire_upto(watermark)

    def on_processing_time(self, now: int) -> Batch | None:
        if not self.processing or not len(self.fire):
            return None
        return self._fire_upto(max(self.watermark, now - 1))

    def _fire_upto(self, watermark: int) -> Batch | None:
        """Fire every window whose last millisecond is at or before ``watermark`` (never
        going back: after a restore, the watermarks from upstream start again from the
        least, behind the one restored)."""
        if watermark <= self.watermark and not len(self.fire):
            return None
        watermark = self.watermark = max(self.watermark, watermark)
        results: list[tuple[Hashable, int, int, Any]] = []
        for _, key, (start, end) in self.fire.pop_due(watermark):
            acc = self._fire(key, start, end)
            if acc is not _GONE:
                results.append((key, start, end, acc))
        for _, key, (start, _end) in self.clean.pop_due(watermark):
            self._drop(key, start)
        return self._results(results) if results else None

    def _fire(self, key: Hashable, start: int, end: int) -> Any:
        """Window ``[start, end)`` of ``key`` fires: its accumulator (dropped from state, or
        marked fired and kept for the lateness)."""
        value = self.table.get(key)
        keep = self.lateness > 0 and self.watermark != MAX_WATERMARK
        if self._session:
            sessions = list(value or ())
            for i, (s_start, s_end, acc, _) in enumerate(sessions):
                if s_start == start and s_end == end:
                    if keep:
                        sessions[i] = (s_start, s_end, acc, True)
                        self.clean.add(_add(end - 1, self.lateness), key, (start, end))
                    else:
                        del sessions[i]
                    self._store(key, tuple(sessions))
                    return acc
            return _GONE
        windows = dict(value or {})
        entry = windows.get(start)
        if entry is None:
            return _GONE
        if keep:
            windows[start] = (entry[0], True)
            self.clean.add(_add(end - 1, self.lateness), key, (start, end))
        else:
            del windows[start]
        self._store(key, windows)
        return entry[0]

    def _drop(self, key: Hashable, start: int) -> None:
        value = self.table.get(key)
        if value is None:
            return
        if self._session:
            self._store(key, tuple(s for s in value if s[0] != start or not s[3]))
        else:
            windows = dict(value)
            windows.pop(start, None)
            self._store(key, windows)

    def _store(self, key: Hashable, value: Any) -> None:
        if value:
            self.table[key] = value
        else:
            self.table.delete(key)

    def _results(self, fired: list[tuple[Hashable, int, int, Any]]) -> Batch:
        """The output records of fired windows: key, window_start, window_end, the result."""
        aggregation, key_column = self.aggregation, self.logic.key_column
        event_time = EventTime(self.event_time.column, 0, self._time_type)
        if aggregation.builtin:
            return self._builtin_batch(
                pa.array([f[0] for f in fired]),
                [f[1] for f in fired],
                [f[2] for f in fired],
                [aggregation.result(f[3]) for f in fired],
            )
        out: list[Any] = []
        for key, start, end, acc in fired:
            window_start, window_end = event_time.to_value(start), event_time.to_value(end)
            if aggregation.kind in ("process", "process_batches"):
                window = Window(window_start, window_end)
                try:
                    if aggregation.kind == "process":
                        contents: Any = [r for chunk in acc for r in chunk]
                    else:
                        contents = pa.Table.from_batches(list(acc))
                    produced = aggregation.fn(key, window, contents)
                    if isinstance(produced, pa.Table | pa.RecordBatch):
                        produced = produced.to_pylist()
                    if produced is not None:
                        out.extend(list(produced))
                except Exception as exc:
                    self.ctx.fail(f"window {window_start}..{window_end} of key {key!r}", exc)
                continue
            try:
                result = aggregation.result(acc)
            except Exception as exc:
                self.ctx.fail(f"window {window_start}..{window_end} of key {key!r}", exc)
                continue
            fields = {key_column: key, "window_start": window_start, "window_end": window_end}
            if isinstance(result, dict):
                out.append({**fields, **result})
            else:
                out.append({**fields, "result": result})
        return out

    def _builtin_batch(self, keys: pa.Array, starts: Any, ends: Any, values: Any) -> pa.RecordBatch:
        """The results of a built-in aggregate: the key, ``window_start`` and ``window_end``
        (in the event-time column's type) and the result."""
        event_time = EventTime(self.event_time.column, 0, self._time_type)
        if isinstance(values, np.ndarray) and values.dtype == object:
            values = values.tolist()  # (Python ints beyond int64)
        return pa.record_batch(
            {
                self.logic.key_column: keys,
                "window_start": event_time.to_column(starts),
                "window_end": event_time.to_column(ends),
                self.aggregation.output: pa.array(values),
            }
        )

    def side_output(self, side: str) -> Batch | None:
        if side != LATE or not self._late:
            return None
        late, self._late = self._late, []
        if len(late) == 1:
            return late[0]
        if all(isinstance(b, pa.RecordBatch) for b in late):
            return pa.concat_batches(late)
        return [r for b in late for r in rows(b)]


@dataclass
class _Pane:
    """One window of :class:`PaneWindowOperator`: its keys and their accumulators, as columns."""

    start: int
    keys: pa.Array
    """Every key with records in the window, once each."""
    acc: np.ndarray
    """Per key: its count, sum, least or greatest value (mean: its sum)."""
    count: np.ndarray | None = None
    """Mean: per key, how many values its sum holds."""
    fired: bool = False
    """Fired, and kept for the allowed lateness."""
    waiting: np.ndarray | None = None
    """Of a fired window, the positions of the keys it has not fired for yet (restored so):
    they fire when the watermark passes its end."""
    shared: bool = False
    """A snapshot holds its arrays: they are copied before they change."""


_SAFE = 2**61
"""Integer sums stay in int64 while every value and sum is below this; beyond, Python ints."""


class PaneWindowOperator(WindowOperator):
    """Tumbling and sliding windows computing a built-in aggregate (``count``, ``sum``,
    ``min``, ``max``, ``mean``) on the memory backend: each window keeps its keys and their
    accumulators as columns, merged a batch at a time (records grouped by key and window with
    Arrow, each window's groups merged into its columns with ``index_in`` and NumPy), and
    fires as one batch. No Python runs per record nor per key.

    What the windows hold goes into each checkpoint beside the (empty) keyed state, in full
    (``KeyedSnapshot.extra``); restored at another parallelism, each subtask keeps the keys
    of its key groups. A window's arrays are shared with a snapshot being written and are
    copied before they change."""

    def __init__(self, logic: WindowLogic, ctx: OperatorContext, state: Any) -> None:
        assert not isinstance(logic.assigner, Session)
        self.size = window_size(logic.assigner)
        self.panes: dict[int, _Pane] = {}
        self._due: list[int] = []
        """Starts of the windows not fired yet (a heap; each fires at ``start + size - 1``)."""
        self._kept: list[tuple[int, int]] = []
        """(when it is dropped, start) of the fired windows kept for the lateness (a heap)."""
        super().__init__(logic, ctx, state)  # (restores the windows: _restore_windows)

    def _restore_windows(self) -> None:
        """Every restored window as a pane: those kept as columns, and those the keyed layout
        wrote (a checkpoint of the disk backend), taken out of keyed state. A window that
        fired for some of its keys only (the old subtasks' watermarks differed at the
        checkpoint, or a record within the lateness came for a new key) fires for the others
        when the watermark passes its end."""
        parts: dict[int, list[PaneParts]] = {}
        mine = self.backend.key_groups
        for handle in self.restored:
            start, stop = handle.get("key_groups", (0, 0))
            whole = range(start, stop) == mine
            for pane_start, keys, acc, count, fired in handle.get("panes", ()):
                flags = fired_flags(fired, len(keys))
                if not whole:  # rescaled: the keys of my key groups only
                    keep = self._owned(keys)
                    if not keep.any():
                        continue
                    keys, acc, flags = keys.filter(pa.array(keep)), acc[keep], flags[keep]
                    count = count[keep] if count is not None else None
                parts.setdefault(pane_start, []).append((pane_start, keys, acc, count, flags))
        keyed = [(key, self.table.get(key)) for key in list(self.backend.keys(WINDOWS))]
        for found in windows_as_panes(keyed, self.aggregation.kind == "mean"):
            parts.setdefault(found[0], []).append(found)
        for key, _ in keyed:
            self.table.delete(key)
        for pane_start, pieces in parts.items():  # (keys of several old subtasks: disjoint)
            first = pieces[0][1].type
            counts = [piece[3] for piece in pieces if piece[3] is not None]
            flags = np.concatenate([piece[4] for piece in pieces])
            pane = _Pane(
                pane_start,
                pa.concat_arrays([piece[1].cast(first) for piece in pieces]),
                np.concatenate([piece[2] for piece in pieces]),
                np.concatenate(counts) if counts else None,
                bool(flags.any()),
            )
            if pane.fired and not flags.all():
                pane.waiting = np.flatnonzero(~flags)
            self._add_pane(pane)

    def _add_pane(self, pane: _Pane) -> None:
        self.panes[pane.start] = pane
        if pane.fired:
            due = _add(pane.start + self.size - 1, self.lateness)
            heapq.heappush(self._kept, (due, pane.start))
        if not pane.fired or pane.waiting is not None:
            heapq.heappush(self._due, pane.start)

    # ---------------------------------------------------------------- figures

    @property
    def open_windows(self) -> int:
        return sum(
            len(p.keys) if not p.fired else len(p.waiting) if p.waiting is not None else 0
            for p in self.panes.values()
        )

    def figures(self) -> dict[str, int] | None:
        return {"late": self.late_records, "windows": self.open_windows, "timers": len(self.panes)}

    def snapshot(
        self, checkpoint_id: int, *, base: int | None = None, savepoint: bool = False
    ) -> KeyedSnapshot:
        taken = super().snapshot(checkpoint_id, base=base, savepoint=savepoint)
        for pane in self.panes.values():
            pane.shared = True
        taken.extra["panes"] = [
            (p.start, p.keys, p.acc, p.count, p.fired if p.waiting is None else _flags(p))
            for p in self.panes.values()
        ]
        return taken

    # ---------------------------------------------------------------- records

    def process(self, batch: Batch) -> Batch | None:
        if not len(batch):
            return None
        prepared = self._prepare(batch)
        if prepared is None:
            return None
        batch, ts = prepared
        if (
            isinstance(batch, pa.RecordBatch)
            and self.watermark >= self._ceiling
            and self._vectorizable(batch)
        ):
            assert isinstance(self.key, str) and not isinstance(self.assigner, Session)
            index, starts = assign(self.assigner, ts)
            on_time = _add_array(starts + self.size - 1, self.lateness) > self.watermark
            self._note_late(batch, index, on_time)
            if not on_time.all():
                index, starts = index[on_time], starts[on_time]
            if not len(index):
                return None
            taken = pa.array(index)
            keys = batch.column(self.key).take(taken)
            values = None
            if self.aggregation.kind != "count":
                assert self.aggregation.field is not None
                column = batch.column(self.aggregation.field).take(taken)
                values = np.asarray(column.to_numpy(zero_copy_only=False))
            return self._merge(keys, starts, values)
        return self._merge_records(rows(batch), ts)

    def _merge_records(self, records: list[Any], ts: np.ndarray) -> Batch | None:
        """Records one by one (Python records, nulls, or after a rescaled restore): their
        windows and values, then merged as a batch."""

        def windows(key: Hashable, stamp: int) -> list[int]:
            floor = self._floor(key)
            return [
                s for s in self._starts(stamp) if _add(s + self.size - 1, self.lateness) > floor
            ]

        found = self._record_columns(records, ts, windows)
        return None if found is None else self._merge(*found)

    def _merge(self, keys: pa.Array, starts: np.ndarray, values: np.ndarray | None) -> Batch | None:
        """Merge (key, window start, value) triples into the windows; the windows already
        fired that they update (allowed lateness) fire again."""
        group_keys, group_starts, sums, grouped_counts = group_by_window(
            keys, starts, None if values is None else pa.array(values), self.aggregation.kind
        )
        parts = _numbers(sums)
        counts = None if grouped_counts is None else _numbers(grouped_counts)
        refired: list[tuple[_Pane, pa.Array, np.ndarray]] = []
        for start in np.unique(group_starts).tolist():
            mask = group_starts == start
            these = group_keys.filter(pa.array(mask))
            pane = self.panes.get(start)
            if pane is None:
                self._add_pane(
                    _Pane(
                        start,
                        these,
                        parts[mask].copy(),
                        None if counts is None else counts[mask].copy(),
                    )
                )
                continue
            positions = self._combine(
                pane, these, parts[mask], None if counts is None else counts[mask]
            )
            if pane.fired:
                if pane.waiting is not None:  # (those fire when the watermark passes)
                    fresh = ~np.isin(positions, pane.waiting)
                    these, positions = these.filter(pa.array(fresh)), positions[fresh]
                refired.append((pane, these, positions))
        if not refired:
            return None
        return self._batch(
            [(pane, keys_, self._values(pane)[positions]) for pane, keys_, positions in refired]
        )

    def _combine(
        self, pane: _Pane, keys: pa.Array, parts: np.ndarray, counts: np.ndarray | None
    ) -> np.ndarray:
        """Merge one window's groups into its columns; their positions in it."""
        if keys.type != pane.keys.type:
            keys = keys.cast(pane.keys.type)
        found = np.asarray(
            pc.fill_null(pc.index_in(keys, value_set=pane.keys), -1).to_numpy(zero_copy_only=False)
        )
        old = found >= 0
        if pane.shared:  # a snapshot holds the arrays
            pane.acc = pane.acc.copy()
            pane.count = None if pane.count is None else pane.count.copy()
            pane.shared = False
        kind = self.aggregation.kind
        if old.any():
            at, add = found[old], parts[old]
            if kind in ("count", "sum", "mean"):
                if pane.acc.dtype.kind in "iu" and (
                    _largest(add) >= _SAFE or _largest(pane.acc[at]) >= _SAFE
                ):
                    pane.acc = pane.acc.astype(object)  # (Python ints: no overflow)
                pane.acc[at] = pane.acc[at] + add
                if pane.count is not None and counts is not None:
                    pane.count[at] = pane.count[at] + counts[old]
            elif kind == "min":
                pane.acc[at] = np.minimum(pane.acc[at], add)
            else:
                pane.acc[at] = np.maximum(pane.acc[at], add)
        positions = found.copy()
        new = ~old
        if new.any():
            size = len(pane.keys)
            pane.keys = pa.concat_arrays([pane.keys, keys.filter(pa.array(new))])
            added = parts[new]
            if pane.acc.dtype != added.dtype:
                common = np.result_type(pane.acc.dtype, added.dtype)
                pane.acc = pane.acc.astype(common)
            pane.acc = np.concatenate([pane.acc, added])
            if pane.count is not None and counts is not None:
                pane.count = np.concatenate([pane.count, counts[new]])
            positions[new] = np.arange(size, size + int(new.sum()))
        return positions

    def _values(self, pane: _Pane) -> np.ndarray:
        """A window's results per key (the mean divides)."""
        if self.aggregation.kind == "mean":
            assert pane.count is not None
            means: np.ndarray = pane.acc.astype(float) / pane.count
            return means
        return pane.acc

    # ----------------------------------------------------------------- firing

    def on_processing_time(self, now: int) -> Batch | None:
        if not self.processing or not self.panes:
            return None
        return self._fire_upto(max(self.watermark, now - 1))

    def _fire_upto(self, watermark: int) -> Batch | None:
        watermark = self.watermark = max(self.watermark, watermark)
        fired: list[tuple[_Pane, pa.Array, np.ndarray]] = []
        keep = self.lateness > 0 and watermark != MAX_WATERMARK
        while self._due and self._due[0] + self.size - 1 <= watermark:
            start = heapq.heappop(self._due)
            pane = self.panes.get(start)
            if pane is None:
                continue
            if pane.fired:  # (restored fired for some keys: now for the others)
                if pane.waiting is not None:
                    waiting, pane.waiting = pane.waiting, None
                    fired.append(
                        (pane, pane.keys.take(pa.array(waiting)), self._values(pane)[waiting])
                    )
                continue
            fired.append((pane, pane.keys, self._values(pane)))
            if keep:
                pane.fired = True
                heapq.heappush(self._kept, (_add(start + self.size - 1, self.lateness), start))
            else:
                del self.panes[start]
        while self._kept and self._kept[0][0] <= watermark:
            _, start = heapq.heappop(self._kept)
            pane = self.panes.get(start)
            if pane is not None and pane.fired:
                del self.panes[start]
        return self._batch(fired) if fired else None

    def _batch(self, fired: list[tuple[_Pane, pa.Array, np.ndarray]]) -> pa.RecordBatch:
        """The output of windows firing: per window, its keys and their results."""
        lengths = [len(keys) for _, keys, _ in fired]
        starts = np.repeat(np.array([p.start for p, _, _ in fired], dtype=np.int64), lengths)
        keys = pa.concat_arrays([k.cast(fired[0][1].type) for _, k, _ in fired])
        values = np.concatenate([v for _, _, v in fired])
        return self._builtin_batch(keys, starts, starts + self.size, values)


class SessionColumnsOperator(WindowOperator):
    """Session windows computing a built-in aggregate on the memory backend, kept as columns:
    one row per open session (key, start, end, accumulator, fired). A batch's records are cut
    into sessions per key with NumPy, merged with the open sessions of the same keys in one
    sorted pass (a session ends where the next one starts at or after the greatest end before
    it), and the sessions whose end the watermark passed fire as one batch.

    The rows go into each checkpoint beside the (empty) keyed state, in full; restored at
    another parallelism, each subtask keeps the rows of its key groups. Every change makes new
    arrays: a snapshot being written keeps the old ones."""

    def __init__(self, logic: WindowLogic, ctx: OperatorContext, state: Any) -> None:
        assert isinstance(logic.assigner, Session)
        self.gap = logic.assigner.gap
        self.rows: dict[str, Any] | None = None
        """The open sessions: ``keys`` (Arrow), ``start``, ``end``, ``acc``, ``count`` (mean),
        ``fired`` (NumPy); ``None``: none."""
        super().__init__(logic, ctx, state)  # (restores the sessions: _restore_windows)

    def _restore_windows(self) -> None:
        """Every restored session as a row: those kept as rows, and those the keyed layout
        wrote (a checkpoint of the disk backend), taken out of keyed state."""
        parts = []
        for handle in self.restored:
            rows = handle.get("sessions")
            if rows is None:
                continue
            start, stop = handle.get("key_groups", (0, 0))
            if range(start, stop) != self.backend.key_groups:  # rescaled: my key groups' rows
                rows = _take_rows(rows, self._owned(rows["keys"]))
            if len(rows["keys"]):
                parts.append(rows)
        keyed = [(key, self.table.get(key)) for key in list(self.backend.keys(WINDOWS))]
        converted = windows_as_session_rows(keyed, self.aggregation.kind == "mean")
        if converted is not None:
            parts.append(converted)
        for key, _ in keyed:
            self.table.delete(key)
        self.rows = _concat_rows(parts) if parts else None

    @property
    def open_windows(self) -> int:
        return 0 if self.rows is None else int((~self.rows["fired"]).sum())

    def figures(self) -> dict[str, int] | None:
        rows = 0 if self.rows is None else len(self.rows["keys"])
        return {"late": self.late_records, "windows": self.open_windows, "timers": rows}

    def snapshot(
        self, checkpoint_id: int, *, base: int | None = None, savepoint: bool = False
    ) -> KeyedSnapshot:
        taken = super().snapshot(checkpoint_id, base=base, savepoint=savepoint)
        if self.rows is not None:
            taken.extra["sessions"] = self.rows
        return taken

    def process(self, batch: Batch) -> Batch | None:
        if not len(batch):
            return None
        prepared = self._prepare(batch)
        if prepared is None:
            return None
        batch, ts = prepared
        gap, kind = self.gap, self.aggregation.kind
        if (
            isinstance(batch, pa.RecordBatch)
            and self.watermark >= self._ceiling
            and self._vectorizable(batch)
        ):
            assert isinstance(self.key, str)
            on_time = _add_array(ts + gap - 1, self.lateness) > self.watermark
            self._note_late(batch, np.arange(len(ts)), on_time)
            if not on_time.any():
                return None
            if not on_time.all():
                batch, ts = batch.filter(pa.array(on_time)), ts[on_time]
            keys = batch.column(self.key)
            values = None
            if kind != "count":
                assert self.aggregation.field is not None
                values = np.asarray(
                    batch.column(self.aggregation.field).to_numpy(zero_copy_only=False)
                )
            return self._merge(keys, ts, values)
        # record by record (Python records, nulls, or keys keeping a restored watermark)

        def own(key: Hashable, stamp: int) -> list[int]:
            return [] if self._late_window(stamp + gap, self._floor(key)) else [stamp]

        found = self._record_columns(rows(batch), ts, own)
        return None if found is None else self._merge(*found)

    def _merge(self, keys: Any, ts: np.ndarray, values: np.ndarray | None) -> Batch | None:
        """Cut the records into sessions per key and merge them with the open ones."""
        kind = self.aggregation.kind
        cut, start, end, acc, counts = cut_sessions(keys, ts, values, kind, self.gap)
        local = {
            "keys": cut,
            "start": start,
            "end": end,
            "acc": acc,
            "count": counts if kind == "mean" else None,
            "fired": np.zeros(len(start), dtype=bool),
        }
        if self.rows is None:
            self.rows = local
            return None
        state = self.rows
        if local["keys"].type != state["keys"].type:
            local["keys"] = local["keys"].cast(state["keys"].type)
        touched = np.asarray(
            pc.is_in(state["keys"], value_set=local["keys"]).to_numpy(zero_copy_only=False)
        )
        if not touched.any():
            self.rows = _concat_rows([state, local])
            return None
        merged, refire = self._merge_sessions(_take_rows(state, touched), local)
        self.rows = _concat_rows([_take_rows(state, ~touched), merged])
        if refire is None:
            return None
        return self._session_batch(_take_rows(merged, refire))

    def _merge_sessions(
        self, old: dict[str, Any], local: dict[str, Any]
    ) -> tuple[dict[str, Any], np.ndarray | None]:
        """Open sessions of the batch's keys and the batch's sessions, merged where they
        overlap; and which merged ones fired already and must fire again now."""
        kind = self.aggregation.kind
        both = _concat_rows([old, local])
        fresh = np.r_[np.zeros(len(old["keys"]), bool), np.ones(len(local["keys"]), bool)]
        encoded = pc.dictionary_encode(both["keys"])
        codes = np.asarray(encoded.indices.to_numpy(zero_copy_only=False)).astype(np.int64)
        order = np.lexsort((both["start"], codes))
        codes, start, end = codes[order], both["start"][order], both["end"][order]
        # the greatest end so far within each key: shifted apart per key, so one running
        # maximum over the whole array never crosses from a key to the next
        low = int(min(start.min(), end.min()))
        span = int(end.max()) - low + 1
        if (int(codes.max()) + 1) * span < 2**62:
            running = np.maximum.accumulate(codes * span + (end - low)) - codes * span + low
        else:  # (keys times the span of time would overflow: one key at a time)
            running = end.copy()
            firsts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
            for a, b in itertools.pairwise([*firsts.tolist(), len(codes)]):
                running[a:b] = np.maximum.accumulate(end[a:b])
        new = np.ones(len(order), dtype=bool)
        new[1:] = (codes[1:] != codes[:-1]) | (start[1:] > running[:-1])
        at = np.flatnonzero(new)
        acc = both["acc"][order]
        if kind in ("count", "sum", "mean"):
            summed = np.add.reduceat(acc, at)
        elif kind == "min":
            summed = np.minimum.reduceat(acc, at)
        else:
            summed = np.maximum.reduceat(acc, at)
        fired = np.maximum.reduceat(both["fired"][order], at).astype(bool)
        touched = np.maximum.reduceat(fresh[order], at).astype(bool)
        merged_end = np.maximum.reduceat(end, at)
        merged = {
            "keys": both["keys"].take(pa.array(order[at])),
            "start": start[at],
            "end": merged_end,
            "acc": summed,
            "count": None if kind != "mean" else np.add.reduceat(both["count"][order], at),
            "fired": fired,
        }
        # a fired session that a late record (within the lateness) changed fires again now
        # if its end is still passed, else when it is
        changed = fired & touched
        if not changed.any():
            return merged, None
        passed = merged_end - 1 <= self.watermark
        merged["fired"] = fired & ~(changed & ~passed)
        refire = changed & passed
        return merged, (refire if refire.any() else None)

    def _session_batch(self, rows: dict[str, Any]) -> pa.RecordBatch:
        acc = rows["acc"]
        if self.aggregation.kind == "mean":
            acc = acc.astype(float) / rows["count"]
        return self._builtin_batch(rows["keys"], rows["start"], rows["end"], acc)

    def on_processing_time(self, now: int) -> Batch | None:
        if not self.processing or self.rows is None:
            return None
        return self._fire_upto(max(self.watermark, now - 1))

    def _fire_upto(self, watermark: int) -> Batch | None:
        watermark = self.watermark = max(self.watermark, watermark)
        rows = self.rows
        if rows is None:
            return None
        due = ~rows["fired"] & (rows["end"] - 1 <= watermark)
        keep = self.lateness > 0 and watermark != MAX_WATERMARK
        dropped = rows["fired"] & (_add_array(rows["end"] - 1, self.lateness) <= watermark)
        out = self._session_batch(_take_rows(rows, due)) if due.any() else None
        if keep:
            if due.any():
                rows = {**rows, "fired": rows["fired"] | due}
            remove = dropped
        else:
            remove = due | rows["fired"]
        if remove.any():
            rows = _take_rows(rows, ~remove)
        self.rows = rows if len(rows["keys"]) else None
        return out


def _flags(pane: _Pane) -> np.ndarray:
    """Per key of a fired pane, whether it fired for it (those waiting: not yet)."""
    flags = np.ones(len(pane.keys), dtype=bool)
    if pane.waiting is not None:
        flags[pane.waiting] = False
    return flags


def _take_rows(rows: dict[str, Any], mask: np.ndarray) -> dict[str, Any]:
    return {
        name: (
            None
            if value is None
            else value.filter(pa.array(mask))
            if isinstance(value, pa.Array)
            else value[mask]
        )
        for name, value in rows.items()
    }


def _concat_rows(parts: list[dict[str, Any]]) -> dict[str, Any]:
    first = parts[0]
    out: dict[str, Any] = {}
    for name in first:
        values = [p[name] for p in parts]
        if values[0] is None:
            out[name] = None
        elif isinstance(values[0], pa.Array):
            out[name] = pa.concat_arrays([v.cast(values[0].type) for v in values])
        else:
            kinds = {v.dtype for v in values}
            common = values[0].dtype if len(kinds) == 1 else np.result_type(*kinds)
            out[name] = np.concatenate([v.astype(common, copy=False) for v in values])
    return out


def group_by_window(
    keys: Any, starts: np.ndarray, values: Any, kind: str
) -> tuple[pa.Array, np.ndarray, pa.ChunkedArray, pa.ChunkedArray | None]:
    """(key, window start[, value]) triples grouped by key and window with Arrow: per group its
    key, its start, its part of built-in ``kind`` (count, sum, least or greatest value; a
    mean's sum) and, for a mean, its count."""
    columns: dict[str, Any] = {"k": keys, "s": pa.array(starts, pa.int64())}
    if kind == "count":
        aggregations = [("s", "count")]
    else:
        columns["v"] = values
        aggregations = [("v", "sum"), ("v", "count")] if kind == "mean" else [("v", kind)]
    grouped = pa.table(columns).group_by(["k", "s"], use_threads=False).aggregate(aggregations)
    first = grouped.num_columns - len(aggregations)
    return (
        grouped.column("k").combine_chunks(),
        grouped.column("s").to_numpy(),
        grouped.column(first),
        grouped.column(first + 1) if kind == "mean" else None,
    )


def cut_sessions(
    keys: Any, ts: np.ndarray, values: np.ndarray | None, kind: str, gap: int
) -> tuple[pa.Array, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Records cut into sessions per key (a new one where the next record of the key is more
    than ``gap`` after the one before): per session its key, first time, end (last time plus
    the gap), part of built-in ``kind`` (a mean's sum; integer sums that could overflow in
    Python ints) and count of records."""
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
    if kind == "count":
        acc = counts
    else:
        assert values is not None
        ordered = _numbers_of(values[order])
        if kind in ("sum", "mean"):
            if ordered.dtype.kind in "iu" and _largest(ordered) * len(ordered) >= _SAFE:
                ordered = ordered.astype(object)
            acc = np.add.reduceat(ordered, at)
        elif kind == "min":
            acc = np.minimum.reduceat(ordered, at)
        else:
            acc = np.maximum.reduceat(ordered, at)
    ends = np.maximum.reduceat(ordered_ts, at) + gap
    return keys.take(pa.array(order[at])), ordered_ts[at], ends, acc, counts


def _numbers_of(values: np.ndarray) -> np.ndarray:
    if values.dtype.kind in "iu":
        return values.astype(np.int64, copy=False)
    if values.dtype.kind == "f":
        return values.astype(np.float64, copy=False)
    return values


def _numbers(column: Any) -> np.ndarray:
    """An aggregate's column as a NumPy array (ints as int64, floats as float64)."""
    array = np.asarray(column.to_numpy())
    if array.dtype.kind in "iu":
        return array.astype(np.int64, copy=False)
    if array.dtype.kind == "f":
        return array.astype(np.float64, copy=False)
    return array


def _largest(values: np.ndarray) -> int:
    if not len(values):
        return 0
    return int(max(abs(int(values.max())), abs(int(values.min()))))


@dataclass(frozen=True)
class Window:
    """The window a ``process`` function is given: its start and end (in the event-time
    column's type: ``datetime`` or epoch milliseconds)."""

    start: Any
    end: Any


_GONE = object()


def _add(a: int, b: int) -> int:
    """``a + b`` within the watermarks' range."""
    return min(MAX_WATERMARK, a + b)


def _add_array(a: np.ndarray, b: int) -> np.ndarray:
    return a + b if b else a
