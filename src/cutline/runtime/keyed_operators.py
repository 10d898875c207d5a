"""Keyed operators: each subtask's state in a backend of its key groups (:class:`_Keyed`),
the user's :class:`KeyedProcessFunction` with its state and timers, and the rolling
aggregations of ``keyed.running_sum(...)`` and the like (:class:`RollingLogic`)."""

from __future__ import annotations

import copy
import enum
import numbers
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any, TypeAlias, assert_never

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cutline.protocol.watermarks import MAX_WATERMARK
from cutline.runtime.eventtime.timers import EVENT, PROCESSING, TimeDomain, TimerService
from cutline.runtime.operators import (
    Batch,
    Logic,
    OperatorContext,
    RecordError,
    RunningOperator,
    _repr,
    key_getter,
    rows,
)
from cutline.runtime.state.backend import KeyedSnapshot, KeyedStateBackend
from cutline.runtime.state.keygroups import key_group, subtask_for_key_group


class _Keyed(RunningOperator):
    """A running keyed operator: its state backend owns this subtask's key groups."""

    def __init__(self, ctx: OperatorContext, state: Any, key: str | Callable[[Any], Hashable]):
        self.ctx = ctx
        self.key = key
        self.get_key = key_getter(key)
        self.backend, self.restored = ctx.open_keyed_state(state)
        """The backend, and the keyed state handles it was restored from (what their
        ``extra`` kept)."""

    def snapshot(
        self, checkpoint_id: int, *, base: int | None = None, savepoint: bool = False
    ) -> KeyedSnapshot:
        return self.backend.snapshot(checkpoint_id, base=base, savepoint=savepoint)

    def close(self) -> None:
        self.backend.close()


class KeyedProcessFunction:
    """Subclass it and pass an instance to ``KeyedStream.process``.

    ``open(ctx)`` runs once per subtask before any record (get state handles there);
    ``process(record, ctx)`` runs for every record with ``ctx.key`` set to its key and
    returns (or yields) the records to emit, or ``None``.
    """

    def open(self, ctx: ProcessContext) -> None:
        """Called once per subtask, before its first record (and again in every attempt
        after a restart, with the state restored). Get the state handles here
        (``self.count = ctx.value_state("count")``): a handle reads and writes the state of
        whatever key the current record has. Create here, not in ``__init__``, what cannot
        be pickled (a connection, a lock): the instance is sent to the Spark workers."""

    def process(self, record: Any, ctx: ProcessContext) -> Iterable[Any] | None:
        """Called for every record, with ``ctx.key`` its key. Return the records to emit (a
        list, or ``yield`` them), or ``None`` for none. Read and update the key's state
        through the handles from :meth:`open`; a state value must not be changed in place
        once stored (store a new one): snapshots share the values with the running state.
        An exception fails the record (``on_error``: the job restarts, or the record goes
        to the dead letters)."""
        raise NotImplementedError

    def on_timer(self, timestamp: int, ctx: ProcessContext) -> Iterable[Any] | None:
        """Called when a timer this function registered fires (``ctx.timer_service``): an
        event-time timer once the watermark reaches ``timestamp``, a processing-time one once
        the clock does; ``ctx.key`` is the timer's key, ``ctx.time_domain`` says which
        (``"event"`` or ``"processing"``). It may read and update the key's state and returns
        (or yields) records to emit, as :meth:`process`."""
        return None


class ProcessContext:
    """What a keyed process function sees: the current key, keyed state, its timers, and its
    subtask."""

    def __init__(
        self,
        backend: KeyedStateBackend,
        subtask: int,
        parallelism: int,
        timer_service: TimerService,
    ) -> None:
        self._backend = backend
        self.subtask = subtask
        """This subtask's index (0 .. parallelism - 1)."""
        self.parallelism = parallelism
        self.timer_service = timer_service
        """Timers of the current key: ``register_event_time_timer(t)``,
        ``register_processing_time_timer(t)``, ``delete_event_time_timer(t)``,
        ``delete_processing_time_timer(t)``, ``current_watermark()``,
        ``current_processing_time()`` (epoch milliseconds)."""
        self.time_domain: TimeDomain | None = None
        """In ``on_timer``: ``"event"`` or ``"processing"``; ``None`` in ``process``."""

    @property
    def key(self) -> Hashable:
        """The key of the record being processed."""
        return self._backend.current_key

    def value_state(self, name: str) -> Any:
        """One value per key: ``.get(default=None)``, ``.update(value)``, ``.clear()``."""
        return self._backend.value_state(name)

    def list_state(self, name: str) -> Any:
        """A list per key: ``.get()``, ``.add(value)``, ``.update(values)``, ``.clear()``."""
        return self._backend.list_state(name)

    def map_state(self, name: str) -> Any:
        """A dict per key: ``.get(k, default=None)``, ``.put(k, v)``, ``.remove(k)``,
        ``.contains(k)``, ``.items()``, ``.clear()``."""
        return self._backend.map_state(name)


@dataclass(frozen=True)
class ProcessLogic(Logic):
    function: KeyedProcessFunction
    key: str | Callable[[Any], Hashable]
    keyed = True

    def open(self, ctx: OperatorContext, state: Any) -> RunningOperator:
        # every subtask gets its own copy: open() binds state handles to this subtask's backend
        return _Process(copy.deepcopy(self.function), ctx, state, self.key)


class _Process(_Keyed):
    def __init__(self, function: KeyedProcessFunction, ctx: OperatorContext, state: Any, key: Any):
        super().__init__(ctx, state, key)
        self.function = function
        self.timers = TimerService(self.backend, lambda: ctx.watermark)
        self.pctx = ProcessContext(self.backend, ctx.subtask, ctx.parallelism, self.timers)
        try:
            function.open(self.pctx)
        except Exception as exc:
            ctx.fail("(none: in open())", exc)

    def on_watermark(self, watermark: int) -> Batch | None:
        fired = self._fire(EVENT, watermark)
        if watermark == MAX_WATERMARK:  # the end of the input: the clock's timers fire too
            pending = self._fire(PROCESSING, MAX_WATERMARK)
            if pending:
                fired = [*(fired or []), *pending]
        return fired

    def figures(self) -> dict[str, int] | None:
        return {"timers": len(self.timers)}

    def on_processing_time(self, now_ms: int) -> Batch | None:
        if not len(self.timers.indexes[PROCESSING]):
            return None
        return self._fire(PROCESSING, now_ms)

    def _fire(self, domain: TimeDomain, upto: int) -> Batch | None:
        """Call ``on_timer`` for every timer of ``domain`` due by ``upto``."""
        out: list[Any] = []
        pctx, on_timer = self.pctx, self.function.on_timer
        pctx.time_domain = domain
        try:
            for due, key in self.timers.due(domain, upto):
                try:
                    self.backend.set_current_key(key)
                    produced = on_timer(due, pctx)
                    if produced is not None:
                        out.extend(list(produced))
                except Exception as exc:
                    self.ctx.fail(f"(a {domain}-time timer at {due} of key {key!r})", exc)
        finally:
            pctx.time_domain = None
        return out or None

    def process(self, batch: Batch) -> Batch | None:
        return self.each(batch, self.get_key, self.function.process)

    def each(
        self,
        batch: Batch,
        get_key: Callable[[Any], Hashable],
        fn: Callable[[Any, ProcessContext], Iterable[Any] | None],
    ) -> list[Any]:
        """``fn(record, ctx)`` for every record of ``batch``, with its key (``get_key``) set:
        what they return, in order."""
        # _flat_map's loop, with the key set in line: a call less per record is about a tenth
        # of a per-record job's throughput (bench B1, "process()")
        out: list[Any] = []
        set_key, pctx = self.backend.set_current_key, self.pctx
        for record in rows(batch):
            try:
                set_key(get_key(record))  # (a key not of this subtask fails the record too)
                produced = fn(record, pctx)
                if produced is not None:
                    out.extend(list(produced))  # all of a record's output, or none of it
            except Exception as exc:
                self.ctx.fail(record, exc)
        return out


class Rolling(enum.StrEnum):
    """What a rolling aggregation keeps per key, and emits for every record (equal to its
    name as a string). The name is also that of its state in checkpoints: it never changes."""

    SUM = "sum"
    """The record, its field replaced by the key's running sum."""
    MIN = "min"
    """The record, its field replaced by the key's smallest value so far."""
    MAX = "max"
    """The record, its field replaced by the key's largest value so far."""
    MEAN = "mean"
    """The record, its field replaced by the key's running mean (a float); the state is
    ``(sum, count)``."""
    COUNT = "count"
    """The record with a ``count`` field: the key's records so far, this one included."""
    REDUCE = "reduce"
    """``fn(previous result, record)``; the first record of a key as it is."""


@dataclass(frozen=True)
class RollingLogic(Logic):
    """Flink's rolling aggregations per key: for every record, emit it with ``field`` replaced by
    its key's running sum, minimum, maximum or mean, or with a ``count`` field added; or the
    running ``reduce`` of a function (see :class:`Rolling`)."""

    how: Rolling
    key: str | Callable[[Any], Hashable]
    field: str | int | None = None
    fn: Callable[[Any, Any], Any] | None = None
    keyed = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "how", Rolling(self.how))  # (a name given as a string)

    def open(self, ctx: OperatorContext, state: Any) -> RunningOperator:
        return _Rolling(self, ctx, state)


_EXACT_INTEGERS = frozenset(
    [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32()]
)
_INT64_SAFE = 2**62

_MISSING: Any = object()
"""A key's state before its first record."""

Step: TypeAlias = Callable[[Any, Any], tuple[Any, Any]]
"""One record of a rolling aggregation: ``step(record, state)`` -> ``(state, emitted)``, the
key's new state and the record to emit (``state`` :data:`_MISSING` for a key's first)."""


def _replace(record: Any, field: str | int, value: Any) -> Any:
    if isinstance(record, dict):
        return {**record, field: value}
    if isinstance(record, tuple) and isinstance(field, int):
        return (*record[:field], value, *record[field + 1 :])
    if isinstance(record, list) and isinstance(field, int):
        return [*record[:field], value, *record[field + 1 :]]
    raise RecordError(f"cannot set field {field!r} of record {_repr.repr(record)}")


_PLAIN = frozenset([int, float])
"""The types of most numbers: checked first, the cheap way."""


def _value(record: Any, field: str | int, how: Rolling) -> Any:
    """The number in ``field`` of ``record`` (a bool is none), or a record error saying what
    is wrong. (The aggregations' steps do this in line for the common case, a dict holding an
    int or a float: a call less per record.)"""
    try:
        value = record[field]
    except (KeyError, IndexError, TypeError):
        raise RecordError(f"the record has no field {field!r}: {_repr.repr(record)}") from None
    if isinstance(value, bool) or not isinstance(value, numbers.Number):
        raise RecordError(  # (text would concatenate, or compare, silently)
            f"{field!r} is {type(value).__name__} {_repr.repr(value)}, not a number "
            f"({how} needs numbers)"
        )
    return value


def _step(logic: RollingLogic) -> Step:
    """The step of ``logic``'s aggregation, chosen once (not per record)."""
    how, field, fn = logic.how, logic.field, logic.fn
    match how:
        case Rolling.COUNT:

            def count(record: Any, previous: Any) -> tuple[Any, Any]:
                value = 1 if previous is _MISSING else previous + 1
                if type(record) is dict:
                    return value, {**record, "count": value}
                return value, _replace(record, "count", value)

            return count
        case Rolling.REDUCE:
            assert fn is not None

            def reduce(record: Any, previous: Any) -> tuple[Any, Any]:
                # a copy: a function that changes its accumulator in place must not change
                # records already emitted, nor the state a pending snapshot holds
                value = record if previous is _MISSING else fn(copy.copy(previous), record)
                return value, value

            return reduce
        case Rolling.MEAN:
            assert field is not None

            def mean(record: Any, previous: Any) -> tuple[Any, Any]:
                current: Any
                if type(record) is dict and type(current := record.get(field)) in _PLAIN:
                    pass
                else:
                    current = _value(record, field, how)
                if previous is _MISSING:
                    total, n = current, 1
                else:
                    total, n = previous[0] + current, previous[1] + 1
                if type(record) is dict:
                    return (total, n), {**record, field: total / n}
                return (total, n), _replace(record, field, total / n)

            return mean
        case Rolling.SUM | Rolling.MIN | Rolling.MAX:
            assert field is not None
            adds, least = how is Rolling.SUM, how is Rolling.MIN

            def fold(record: Any, previous: Any) -> tuple[Any, Any]:
                current: Any
                if type(record) is dict and type(current := record.get(field)) in _PLAIN:
                    pass
                else:
                    current = _value(record, field, how)
                if previous is _MISSING:
                    value = current
                elif adds:
                    value = previous + current
                elif least:
                    value = current if current < previous else previous
                else:
                    value = current if current > previous else previous
                if type(record) is dict:
                    return value, {**record, field: value}
                return value, _replace(record, field, value)

            return fold
        case _:
            assert_never(how)


class _Rolling(_Keyed):
    def __init__(self, logic: RollingLogic, ctx: OperatorContext, state: Any) -> None:
        super().__init__(ctx, state, logic.key)
        self.how = logic.how
        self.field = "count" if logic.how is Rolling.COUNT else logic.field
        self.step = _step(logic)
        self.table = self.backend.value_table(logic.how.value)
        self.targets: dict[Hashable, int] = {}
        self.vectorizes = logic.how in (Rolling.SUM, Rolling.COUNT) and isinstance(logic.key, str)

    def process(self, batch: Batch) -> Batch | None:
        if self.vectorizes and isinstance(batch, pa.RecordBatch) and batch.num_rows:
            vectorized = self._vectorized(batch)
            if vectorized is not None:
                return vectorized
        return self._per_record(rows(batch))

    def _per_record(self, records: list[Any]) -> list[Any]:
        out = []
        table, get_key, step, check_key = self.table, self.get_key, self.step, self._check_key
        for record in records:
            try:
                key = get_key(record)
                check_key(key)
                state, emitted = step(record, table.get(key, _MISSING))
                table[key] = state
                out.append(emitted)
            except Exception as exc:
                self.ctx.fail(record, exc)
        return out

    def _check_key(self, key: Hashable) -> None:
        """Keys are checked once (stable hash, owned by this subtask), then remembered."""
        if key in self.targets:
            return
        ctx = self.ctx
        group = key_group(key, ctx.max_parallelism)
        owner = subtask_for_key_group(group, ctx.parallelism, ctx.max_parallelism)
        if owner != ctx.subtask:
            raise RecordError(f"key {key!r} belongs to subtask {owner}, not {ctx.subtask}")
        self.targets[key] = owner

    def _vectorized(self, batch: pa.RecordBatch) -> pa.RecordBatch | None:
        """The running sum (or count) of a whole batch at once, with NumPy."""
        assert isinstance(self.key, str)
        names = batch.schema.names
        if self.key not in names:
            return None
        keys = batch.column(self.key)
        if self.how is Rolling.SUM:
            if self.field not in names:
                return None
            column = batch.column(self.field)
            # exact only in integers: float sums differ with the order of additions, so floats
            # take the per-record path (as do uint64 and nulls)
            if column.type not in _EXACT_INTEGERS or column.null_count or keys.null_count:
                return None
            values = column.to_numpy().astype(np.int64)
        else:
            if keys.null_count:
                return None
            values = np.ones(batch.num_rows, dtype=np.int64)
        encoded = pc.dictionary_encode(keys)
        uniques = encoded.dictionary.to_pylist()
        for key in uniques:
            self._check_key(key)
        indices = encoded.indices.to_numpy()
        order = np.argsort(indices, kind="stable")
        sorted_groups = indices[order]
        sums = np.cumsum(values[order])
        starts = np.flatnonzero(np.r_[True, sorted_groups[1:] != sorted_groups[:-1]])
        counts = np.diff(np.r_[starts, len(sorted_groups)])
        before = np.r_[0, sums][starts]
        table = self.table
        group_keys = [uniques[g] for g in sorted_groups[starts]]
        previous = [table.get(k, 0) for k in group_keys]
        if any(type(p) is not int for p in previous):
            return None  # a float (or other) running value: the per-record path keeps its type
        extreme = max(abs(int(values.max())), abs(int(values.min())))
        largest = max(map(abs, previous), default=0) + extreme * len(values)
        if largest >= _INT64_SAFE:
            return None  # could overflow int64: Python's integers in the per-record path cannot
        prior = np.array(previous, dtype=np.int64)
        running_sorted = sums - np.repeat(before - prior, counts)
        ends = running_sorted[starts + counts - 1]
        for k, total in zip(group_keys, ends.tolist(), strict=True):
            table[k] = total
        running = np.empty_like(running_sorted)
        running[order] = running_sorted
        result = pa.array(running)
        target = "count" if self.how is Rolling.COUNT else self.field
        assert isinstance(target, str)
        if target in names:
            return batch.set_column(names.index(target), target, result)
        return batch.append_column(target, result)
