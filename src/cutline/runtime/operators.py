"""What each operator does with the records of one subtask.

Records travel in **batches**: a ``pyarrow.RecordBatch`` (columnar, the form
sources produce and the fast paths keep) or a list of Python objects (what
per-record functions return). Each operator of the job graph carries a
picklable *logic* object; in every subtask, :meth:`Logic.open` makes a
running instance of it that

* ``process(batch)`` — returns the batch of records it emits (or ``None``),
* ``snapshot(checkpoint_id, base=..., savepoint=...)`` — the synchronous part of a
  checkpoint: returns what goes into the checkpoint (cheap; serialized later, off the
  loop; keyed state returns a :class:`~cutline.runtime.state.backend.KeyedSnapshot`),
* ``notify_complete(checkpoint_id)`` — the checkpoint is complete (sinks publish),
* ``close()``.

A user function that raises is reported by :class:`UserFunctionError`, naming
the operator, the subtask and the record, with the user's traceback; or, for
an operator opened with ``on_error="dead_letter"``, the record and the error
go to the dead-letter output and processing goes on.
"""

from __future__ import annotations

import copy
import json
import numbers
import reprlib
import time
import traceback
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cutline.connectors.sink import Sink, SinkContext, SinkWriter
from cutline.connectors.source import Source, SourceContext
from cutline.protocol.watermarks import MAX_WATERMARK, EmitWatermark, SplitWatermarks
from cutline.runtime.eventtime.timers import EVENT, PROCESSING, TimerService
from cutline.runtime.eventtime.watermarks import WatermarkStrategy, promise_after
from cutline.runtime.source_operator import SourceOperator
from cutline.runtime.state.backend import KeyedSnapshot, KeyedStateBackend
from cutline.runtime.state.config import StateConfig
from cutline.runtime.state.factory import new_backend
from cutline.runtime.state.keygroups import (
    key_group,
    key_group_range,
    key_groups,
    subtask_for_key_group,
)
from cutline.runtime.state.segments import SegmentSource

Batch: TypeAlias = Any
"""A ``pyarrow.RecordBatch`` or a ``list`` of records (pyarrow has no type hints)."""
ON_ERROR = ("fail", "dead_letter")
_repr = reprlib.Repr()  # records in messages: long ones shortened
_repr.maxstring = _repr.maxother = 200
_repr.maxlist = _repr.maxdict = 20


class UserFunctionError(Exception):
    """A user function raised while processing a record."""

    def __init__(
        self, operator: str, subtask: int, record: str, error: str, user_traceback: str
    ) -> None:
        super().__init__(
            f"{operator} (subtask {subtask}) failed on record {record}: {error}\n"
            f"{user_traceback.rstrip()}"
        )
        self.operator = operator
        self.subtask = subtask
        self.record = record
        self.error = error
        self.user_traceback = user_traceback


class RecordError(Exception):
    """A record cannot be handled by cutline itself (not a dict where columns are needed, a
    missing key column); reported like a user function's error, with the record."""

    def __init__(self, message: str, record: Any = None) -> None:
        super().__init__(message)
        self.record = record


def rows(batch: Batch) -> list[Any]:
    records: list[Any] = batch.to_pylist() if isinstance(batch, pa.RecordBatch) else batch
    return records


def to_arrow(batch: Batch, what: str) -> pa.RecordBatch:
    """``batch`` as columns: records must be dicts with the same keys and compatible values."""
    if isinstance(batch, pa.RecordBatch):
        return batch
    if not all(isinstance(r, dict) for r in batch):
        bad = next(r for r in batch if not isinstance(r, dict))
        raise RecordError(
            f"{what} needs records that are dicts (column -> value), got {_repr.repr(bad)}", bad
        )
    try:
        return pa.RecordBatch.from_pylist(batch)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise RecordError(f"{what}: the records do not fit one schema: {exc}") from None


def function_name(fn: Any) -> str:
    """How messages name a user function: its ``__name__``, ``lambda``, or its class."""
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return "lambda" if name == "<lambda>" else str(name)


def _user_traceback(exc: BaseException) -> str:
    """The traceback of ``exc`` without cutline's own frames before the user's."""
    frames = traceback.extract_tb(exc.__traceback__)
    user = [f for f in frames if "/cutline/runtime/" not in f.filename.replace("\\", "/")]
    lines = traceback.format_list(user or frames)
    return (
        "Traceback (most recent call last):\n"
        + "".join(lines)
        + "".join(traceback.format_exception_only(type(exc), exc))
    )


@dataclass
class OperatorContext:
    """What a running operator knows about where it runs."""

    name: str
    subtask: int
    parallelism: int
    max_parallelism: int
    generation: int
    on_error: str = "fail"
    dead_letters: DeadLetterOutput | None = None
    run: str = "r0"
    """The id of this run of the job (one ``execute()``): sinks name their files with it."""
    job: str = "r0"
    """The id of the job's lineage, the same across resumed runs (``SinkContext.job``)."""
    uid: str = ""
    """The operator's id (unique in the job, the same in every run)."""
    state: StateConfig = field(default_factory=StateConfig)
    """The keyed state backend and how it checkpoints."""
    restore_store: SegmentSource | None = None
    """Where the restored checkpoint's keyed state segments are read from."""
    restore_checkpoint: int | None = None
    """The restored checkpoint, when it is one of this job's directory (incremental
    checkpoints may build on its files)."""
    checkpoint_dir: str = ""
    """The job's checkpoint directory (the collect sinks write there)."""
    storage_options: Mapping[str, Any] | None = None
    """The fsspec options of the checkpoint directory."""
    side_outputs: frozenset[str] = frozenset()
    """The side outputs of this operator that the job reads (``"late"`` once ``.late()`` is
    read): what goes to another is counted and let go, never kept."""
    warn: Callable[[str], None] | None = None
    """Tell the job's listener something that is not a failure (a file that changed after it
    was read); ``None``: nowhere to (a test)."""

    def fail(self, record: Any, exc: BaseException) -> None:
        """A record could not be processed: raise, or send it to the dead-letter output."""
        if isinstance(exc, UserFunctionError):
            raise exc
        if isinstance(exc, RecordError):  # cutline's own finding: no traceback to show
            error, trace = str(exc), ""
        else:
            error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            trace = _user_traceback(exc)
        if self.on_error == "dead_letter" and self.dead_letters is not None:
            self.dead_letters.add(self.name, self.subtask, record, error, trace)
            return
        raise UserFunctionError(self.name, self.subtask, _repr.repr(record), error, trace) from exc


class DeadLetterOutput:
    """Records that failed, with their error, written exactly once (a JSON-lines file sink)."""

    def __init__(self, writer: SinkWriter) -> None:
        self.writer = writer
        self.count = 0

    def add(self, operator: str, subtask: int, record: Any, error: str, trace: str) -> None:
        try:
            text = json.dumps(record, default=repr, sort_keys=True)
        except (TypeError, ValueError):
            text = repr(record)
        row = {
            "operator": operator,
            "subtask": subtask,
            "error": error,
            "traceback": trace,
            "record": text,
        }
        self.writer.write(pa.RecordBatch.from_pylist([row]))
        self.count += 1


class RunningOperator:
    """A running operator; the default does nothing at checkpoints, nor with event time."""

    makes_watermarks = False
    """It makes its own watermarks from its records (``assign_timestamps``): those from
    upstream stop at it (but the end's), and :meth:`take_watermark` says when it has one."""

    def process(self, batch: Batch) -> Batch | None:
        raise NotImplementedError

    def on_watermark(self, watermark: int) -> Batch | None:
        """Event time reached ``watermark`` here (epoch ms; it only increases): return what
        that completes (an event-time window's result), or ``None``."""
        return None

    def on_processing_time(self, now: int) -> Batch | None:
        """The wall clock is ``now`` (epoch ms), called every few tens of milliseconds:
        return what that completes (a processing-time timer's or window's output), or
        ``None``."""
        return None

    def take_watermark(self) -> int | None:
        """(``makes_watermarks``) A watermark newer than the last one taken, if any."""
        return None

    def take_status(self) -> bool | None:
        """(``makes_watermarks``) Whether it went idle (``True``) or active again (``False``)
        since the last call; ``None``: neither."""
        return None

    def side_output(self, side: str) -> Batch | None:
        """What went to side output ``side`` (``"late"``) since the last call."""
        return None

    def figures(self) -> dict[str, int] | None:
        """Event-time figures for the progress and the checkpoints' statistics: ``late``
        (records too late for their windows, so far), ``windows`` (open now), ``timers``
        (registered now); ``None``: it has none."""
        return None

    def snapshot(
        self, checkpoint_id: int, *, base: int | None = None, savepoint: bool = False
    ) -> Any:
        return None

    def notify_complete(self, checkpoint_id: int) -> None:
        pass

    def abort(self) -> None:
        """The subtask failed or was stopped: drop what was staged for output (before
        :meth:`close`)."""

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class RescaledStates:
    """The state a sink subtask takes over on a restore at another parallelism: the states
    of the previous run's subtasks it stands in for (old subtask index -> state)."""

    states: dict[int, Any]

    @staticmethod
    def of(state: Any, subtask: int) -> dict[int, Any]:
        """A sink's restored state as its writer takes it: old subtask index -> state (its
        own at the same parallelism, those it adopts at another; none on a fresh start)."""
        if isinstance(state, RescaledStates):
            return dict(state.states)
        return {} if state is None else {subtask: state}


class Logic:
    """The picklable description of an operator's work."""

    keyed = False
    makes_watermarks = False
    """Its running operator makes watermarks from its records (``assign_timestamps``)."""

    def open(self, ctx: OperatorContext, state: Any) -> RunningOperator:
        raise NotImplementedError


# --------------------------------------------------------------------------- sources


@dataclass(frozen=True)
class SourceLogic:
    """A source operator: any connector's :class:`~cutline.connectors.Source`, run by a
    :class:`~cutline.runtime.source_operator.SourceOperator` on each subtask. The records its
    reader rejects (a malformed row, one not of the job's schema) fail the job naming their
    split (a file source: file and line), or, with ``on_error="dead_letter"``, go to the
    dead-letter output."""

    source: Source
    watermarks: WatermarkStrategy | None = None
    """How its subtasks make watermarks (``event_time=``); ``None``: they make none."""

    def open(self, ctx: OperatorContext, state: Any) -> SourceOperator:
        rejected = None
        dead = ctx.dead_letters
        if ctx.on_error == "dead_letter" and dead is not None:

            def rejected(record: Any, error: str) -> None:
                dead.add(ctx.name, ctx.subtask, record, error, "")

        context = SourceContext(ctx.name, ctx.subtask, ctx.parallelism, rejected, ctx.warn)
        return SourceOperator(self.source, context, state, self.watermarks)


# ------------------------------------------------------------------ stateless per record


@dataclass(frozen=True)
class PassLogic(Logic):
    """Records pass unchanged (``union``)."""

    def open(self, ctx: OperatorContext, state: Any) -> RunningOperator:
        return _Pass()


class _Pass(RunningOperator):
    def process(self, batch: Batch) -> Batch | None:
        return batch


@dataclass(frozen=True)
class MapLogic(Logic):
    fn: Callable[[Any], Any]
    kind: str = "map"  # map, flat_map or filter

    def open(self, ctx: OperatorContext, state: Any) -> RunningOperator:
        return _PerRecord(self.fn, self.kind, ctx)


class _PerRecord(RunningOperator):
    def __init__(self, fn: Callable[[Any], Any], kind: str, ctx: OperatorContext) -> None:
        self.fn, self.kind, self.ctx = fn, kind, ctx

    def process(self, batch: Batch) -> Batch | None:
        fn, out = self.fn, []
        if self.kind == "map":
            for record in rows(batch):
                try:
                    out.append(fn(record))
                except Exception as exc:
                    self.ctx.fail(record, exc)
            return out
        if self.kind == "filter":
            for record in rows(batch):
                try:
                    if fn(record):
                        out.append(record)
                except Exception as exc:
                    self.ctx.fail(record, exc)
            return out
        return _flat_map(batch, fn, self.ctx)


def _flat_map(
    batch: Batch, produce: Callable[[Any], Iterable[Any] | None], ctx: OperatorContext
) -> list[Any]:
    """What ``produce`` makes of each record of ``batch``, in order (``None``: nothing), for
    flat_map (the keyed process function has this loop in line). A record's output counts whole or not at all: a
    record whose ``produce`` fails, even halfway through yielding, goes to ``ctx.fail`` (the
    job's error policy) and adds nothing."""
    out: list[Any] = []
    for record in rows(batch):
        try:
            produced = produce(record)
            if produced is not None:
                out.extend(list(produced))  # all of a record's output, or none of it
        except Exception as exc:
            ctx.fail(record, exc)
    return out


@dataclass(frozen=True)
class MapBatchesLogic(Logic):
    fn: Callable[[pa.RecordBatch], Any]

    def open(self, ctx: OperatorContext, state: Any) -> RunningOperator:
        return _MapBatches(self.fn, ctx)


class _MapBatches(RunningOperator):
    def __init__(self, fn: Callable[[pa.RecordBatch], Any], ctx: OperatorContext) -> None:
        self.fn, self.ctx = fn, ctx

    def process(self, batch: Batch) -> Batch | None:
        columns = to_arrow(batch, f"{self.ctx.name}")
        try:
            result = self.fn(columns)
            if isinstance(result, pa.Table):
                result = result.combine_chunks().to_batches()
                result = result[0] if len(result) == 1 else pa.concat_batches(result)
            if result is None:
                return None
            if not isinstance(result, pa.RecordBatch):
                raise TypeError(
                    f"map_batches functions return a pyarrow.RecordBatch or Table, not "
                    f"{type(result).__name__}"
                )
            return result
        except Exception as exc:
            if self.ctx.on_error != "dead_letter":
                self.ctx.fail(f"a batch of {columns.num_rows} rows", exc)
            for record in columns.to_pylist():  # the whole batch failed: each record goes
                self.ctx.fail(record, exc)
            return None


# ------------------------------------------------------------------------ event time


def without_time(
    batch: Batch, ts: np.ndarray, missing: np.ndarray, column: str, ctx: OperatorContext
) -> tuple[Batch, np.ndarray]:
    """The records of ``batch`` that have an event time, and their timestamps; those without
    one (``missing``) fail (``ctx.fail``: ``on_error``)."""
    records = rows(batch)
    for i in np.flatnonzero(missing).tolist():
        ctx.fail(records[i], RecordError(f"the record has no event time (no value in {column!r})"))
    keep = ~missing
    if isinstance(batch, pa.RecordBatch):
        return batch.filter(pa.array(keep)), ts[keep]
    return [r for r, k in zip(records, keep.tolist(), strict=True) if k], ts[keep]


@dataclass(frozen=True)
class AssignTimestampsLogic(Logic):
    """``assign_timestamps``: the records' event time (a column, or ``fn(record)`` stored in
    the ``event_time`` field), and watermarks made from it with bounded out-of-orderness, per
    subtask. Watermarks from upstream stop here, but the end's."""

    strategy: WatermarkStrategy
    fn: Callable[[Any], Any] | None = None
    makes_watermarks = True

    def open(self, ctx: OperatorContext, state: Any) -> RunningOperator:
        return _AssignTimestamps(self, ctx)


class _AssignTimestamps(RunningOperator):
    makes_watermarks = True

    def __init__(self, logic: AssignTimestampsLogic, ctx: OperatorContext) -> None:
        self.logic, self.ctx = logic, ctx
        strategy = logic.strategy
        self.clock: SplitWatermarks[str] = SplitWatermarks(strategy.bound, strategy.idle_timeout)
        self.clock.split_added("records")
        self._pending: int | None = None
        self._status: bool | None = None
        self._unit_checked = False
        prototype = strategy.generator
        self.generator = None if prototype is None else copy.deepcopy(prototype)

    def _take_actions(self, actions: list[Any]) -> None:
        for action in actions:
            if isinstance(action, EmitWatermark):
                self._pending = action.watermark
            else:
                self._status = action.idle

    def on_processing_time(self, now: int) -> Batch | None:
        if self.logic.strategy.idle_timeout is not None:
            self._take_actions(self.clock.tick(now / 1000))
        return None

    def take_status(self) -> bool | None:
        status, self._status = self._status, None
        return status

    def process(self, batch: Batch) -> Batch | None:
        fn, event_time = self.logic.fn, self.logic.strategy.event_time
        if fn is not None:
            out = []
            for record in rows(batch):
                try:
                    if not isinstance(record, dict):
                        raise RecordError(
                            f"assign_timestamps with a function needs records that are dicts "
                            f"(it stores the time in 'event_time'), got {_repr.repr(record)}",
                            record,
                        )
                    out.append({**record, "event_time": fn(record)})
                except Exception as exc:
                    self.ctx.fail(record, exc)
            batch = out
        if not len(batch):
            return None
        try:
            values, missing = event_time.timestamps(batch)
        except ValueError as exc:
            raise RecordError(str(exc)) from None
        if missing is not None:
            batch, values = without_time(batch, values, missing, event_time.column, self.ctx)
        if len(values):
            now = time.time()
            generator = self.generator
            if generator is None:
                self._take_actions(self.clock.records("records", int(values.max()), now))
            else:
                promise = promise_after(generator, event_time, batch, values)
                self._take_actions(self.clock.promised("records", promise, now))
            if not self._unit_checked:
                self._unit_checked = True
                said = event_time.seconds_like(values)
                if said is not None and self.ctx.warn is not None:
                    self.ctx.warn(f"{self.ctx.name}: {said}")
        return batch

    def on_watermark(self, watermark: int) -> Batch | None:
        if watermark == MAX_WATERMARK:  # the end of the input: everything fires downstream
            self._pending = MAX_WATERMARK
        return None

    def take_watermark(self) -> int | None:
        pending, self._pending = self._pending, None
        return pending


# ----------------------------------------------------------------------------- keyed


def key_getter(key: str | Callable[[Any], Hashable]) -> Callable[[Any], Hashable]:
    if callable(key):
        return key

    def column(record: Any) -> Hashable:
        try:
            return record[key]  # type: ignore[no-any-return]
        except (KeyError, TypeError, IndexError):
            raise RecordError(
                f"the record has no key field {key!r}: {_repr.repr(record)}"
            ) from None

    return column


class _Keyed(RunningOperator):
    """A running keyed operator: its state backend owns this subtask's key groups."""

    def __init__(self, ctx: OperatorContext, state: Any, key: str | Callable[[Any], Hashable]):
        self.ctx = ctx
        self.key = key
        self.get_key = key_getter(key)
        groups = key_group_range(ctx.subtask, ctx.parallelism, ctx.max_parallelism)
        self.backend = new_backend(ctx.state, ctx.max_parallelism, groups)
        self.restored: list[Mapping[str, Any]] = []
        """The keyed state handles it was restored from (what their ``extra`` kept)."""
        if state:
            try:
                if ctx.restore_store is None:
                    raise RecordError("keyed state to restore, but nowhere to read it from")
                handles = state if isinstance(state, list) else [state]
                self.restored = handles
                self.backend.restore(
                    handles, ctx.restore_store, checkpoint_id=ctx.restore_checkpoint
                )
            except BaseException:
                self.backend.close()  # (the disk backend's working database goes)
                raise

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
        timer_service: TimerService | None = None,
    ) -> None:
        self._backend = backend
        self.subtask = subtask
        """This subtask's index (0 .. parallelism - 1)."""
        self.parallelism = parallelism
        self.timer_service = timer_service if timer_service is not None else TimerService(backend)
        """Timers of the current key: ``register_event_time_timer(t)``,
        ``register_processing_time_timer(t)``, ``delete_event_time_timer(t)``,
        ``delete_processing_time_timer(t)``, ``current_watermark()``,
        ``current_processing_time()`` (epoch milliseconds)."""
        self.time_domain: str | None = None
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
        self.timers = TimerService(self.backend)
        self.pctx = ProcessContext(self.backend, ctx.subtask, ctx.parallelism, self.timers)
        try:
            function.open(self.pctx)
        except Exception as exc:
            ctx.fail("(none: in open())", exc)

    def on_watermark(self, watermark: int) -> Batch | None:
        self.timers.watermark = watermark
        fired = self._fire(EVENT, watermark)
        if watermark == MAX_WATERMARK:  # the end of the input: the clock's timers fire too
            pending = self._fire(PROCESSING, MAX_WATERMARK)
            if pending:
                fired = [*(fired or []), *pending]
        return fired

    def figures(self) -> dict[str, int] | None:
        return {"timers": len(self.timers)}

    def on_processing_time(self, now: int) -> Batch | None:
        self.timers.now = now
        if not len(self.timers.indexes[PROCESSING]):
            return None
        return self._fire(PROCESSING, now)

    def _fire(self, domain: str, upto: int) -> Batch | None:
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
        # _flat_map's loop, with the key set in line: a call less per record is about a tenth
        # of a per-record job's throughput (bench B1, "process()")
        out: list[Any] = []
        set_key, get_key, fn, pctx = (
            self.backend.set_current_key,
            self.get_key,
            self.function.process,
            self.pctx,
        )
        for record in rows(batch):
            try:
                set_key(get_key(record))  # (a key not of this subtask fails the record too)
                produced = fn(record, pctx)
                if produced is not None:
                    out.extend(list(produced))  # all of a record's output, or none of it
            except Exception as exc:
                self.ctx.fail(record, exc)
        return out


@dataclass(frozen=True)
class RollingLogic(Logic):
    """Flink's rolling aggregations per key: for every record, emit it with ``field`` replaced by
    its key's running ``sum``/``min``/``max``, or with a ``count`` field added; or ``reduce``."""

    how: str  # sum, min, max, count, reduce
    key: str | Callable[[Any], Hashable]
    field: str | int | None = None
    fn: Callable[[Any, Any], Any] | None = None
    keyed = True

    def open(self, ctx: OperatorContext, state: Any) -> RunningOperator:
        return _Rolling(self, ctx, state)


_EXACT_INTEGERS = frozenset(
    [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32()]
)
_INT64_SAFE = 2**62

_COMBINE: dict[str, Callable[[Any, Any], Any]] = {
    "sum": lambda a, b: a + b,
    "min": lambda a, b: b if b < a else a,
    "max": lambda a, b: b if b > a else a,
}


def _replace(record: Any, field: str | int, value: Any) -> Any:
    if isinstance(record, dict):
        return {**record, field: value}
    if isinstance(record, tuple) and isinstance(field, int):
        return (*record[:field], value, *record[field + 1 :])
    if isinstance(record, list) and isinstance(field, int):
        return [*record[:field], value, *record[field + 1 :]]
    raise RecordError(f"cannot set field {field!r} of record {_repr.repr(record)}")


class _Rolling(_Keyed):
    def __init__(self, logic: RollingLogic, ctx: OperatorContext, state: Any) -> None:
        super().__init__(ctx, state, logic.key)
        self.how = logic.how
        self.field = "count" if logic.how == "count" else logic.field
        self.fn = logic.fn
        self.table = self.backend.value_table(logic.how)
        self.targets: dict[Hashable, int] = {}

    def process(self, batch: Batch) -> Batch | None:
        if (
            self.how in ("sum", "count")
            and isinstance(batch, pa.RecordBatch)
            and isinstance(self.key, str)
            and batch.num_rows
        ):
            vectorized = self._vectorized(batch)
            if vectorized is not None:
                return vectorized
        return self._per_record(rows(batch))

    def _per_record(self, records: list[Any]) -> list[Any]:
        out = []
        table, get_key, field, how = self.table, self.get_key, self.field, self.how
        missing = object()
        for record in records:
            try:
                key = get_key(record)
                self._check_key(key)
                previous = table.get(key, missing)
                if how == "count":
                    value = 1 if previous is missing else previous + 1
                    table[key] = value
                    out.append(_replace(record, "count", value))
                    continue
                if how == "reduce":
                    assert self.fn is not None
                    # a copy: a function that changes its accumulator in place must not change
                    # records already emitted, nor the state a pending snapshot holds
                    value = record if previous is missing else self.fn(copy.copy(previous), record)
                    table[key] = value
                    out.append(value)
                    continue
                assert field is not None
                try:
                    current = record[field]
                except (KeyError, IndexError, TypeError):
                    raise RecordError(
                        f"the record has no field {field!r}: {_repr.repr(record)}"
                    ) from None
                if how == "sum" and not isinstance(current, numbers.Number):
                    raise RecordError(  # (text would concatenate, silently)
                        f"{field!r} is {type(current).__name__} {_repr.repr(current)}, not a "
                        "number (sum needs numbers)"
                    )
                value = current if previous is missing else _COMBINE[how](previous, current)
                table[key] = value
                out.append(_replace(record, field, value))
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
        if self.how == "sum":
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
        target = "count" if self.how == "count" else self.field
        assert isinstance(target, str)
        if target in names:
            return batch.set_column(names.index(target), target, result)
        return batch.append_column(target, result)


# ----------------------------------------------------------------------------- sinks


@dataclass(frozen=True)
class SinkLogic(Logic):
    """A sink operator: any connector's :class:`~cutline.connectors.Sink` (the file sinks and
    ``collect`` are sinks of the API), its writer committing at every checkpoint."""

    sink: Sink

    def open(self, ctx: OperatorContext, state: Any) -> RunningOperator:
        restored = RescaledStates.of(state, ctx.subtask)
        context = SinkContext(
            ctx.name,
            ctx.subtask,
            ctx.parallelism,
            ctx.generation,
            ctx.run,
            ctx.checkpoint_dir,
            ctx.storage_options,
            ctx.job,
            ctx.uid,
        )
        return _Sink(self.sink.writer(context, restored), self.sink.columnar, ctx)


class _Sink(RunningOperator):
    def __init__(self, writer: SinkWriter, columnar: bool, ctx: OperatorContext) -> None:
        self.writer, self.columnar, self.ctx = writer, columnar, ctx

    def process(self, batch: Batch) -> Batch | None:
        try:
            self.writer.write(to_arrow(batch, f"{self.ctx.name}") if self.columnar else batch)
        except RecordError as exc:
            self.ctx.fail(exc.record, exc)
        except Exception as exc:
            self.ctx.fail(f"a batch of {len(batch)} records", exc)
        return None

    def snapshot(
        self, checkpoint_id: int, *, base: int | None = None, savepoint: bool = False
    ) -> Any:
        return self.writer.prepare_commit(checkpoint_id)

    def notify_complete(self, checkpoint_id: int) -> None:
        self.writer.commit(checkpoint_id)

    def abort(self) -> None:
        self.writer.abort()

    def close(self) -> None:
        self.writer.close()


@dataclass
class Partitioner:
    """Splits a batch between the subtasks of a hash edge, by key group."""

    key: str | Callable[[Any], Hashable]
    parallelism: int
    max_parallelism: int
    _targets: dict[Hashable, int] = field(default_factory=dict)

    def target(self, key: Hashable) -> int:
        target = self._targets.get(key)
        if target is None:
            group = key_group(key, self.max_parallelism)
            target = subtask_for_key_group(group, self.parallelism, self.max_parallelism)
            if len(self._targets) < 1_000_000:
                self._targets[key] = target
        return target

    def split(
        self, batch: Batch, fail: Callable[[Any, BaseException], None] | None = None
    ) -> list[Batch]:
        """One batch per downstream subtask (empty ones included); a record whose key cannot be
        taken goes to ``fail(record, error)`` (by default the error is raised)."""
        n = self.parallelism
        if n == 1 and isinstance(self.key, str):
            return [batch]
        if isinstance(batch, pa.RecordBatch) and isinstance(self.key, str):
            if self.key not in batch.schema.names:
                raise RecordError(
                    f"key_by({self.key!r}): the records have no such column "
                    f"(columns: {', '.join(batch.schema.names)})",
                    batch.slice(0, 1).to_pylist()[0] if batch.num_rows else None,
                )
            encoded = pc.dictionary_encode(batch.column(self.key))
            indices = encoded.indices
            if indices.null_count:
                raise RecordError(f"key_by({self.key!r}): a record has no key (null)")
            groups = key_groups(encoded.dictionary, self.max_parallelism)
            targets = groups * n // self.max_parallelism  # (subtask_for_key_group, vectorized)
            per_row = targets[indices.to_numpy()] if len(targets) else np.zeros(0, np.int64)
            return [batch.filter(pa.array(per_row == t)) for t in range(n)]
        out: list[list[Any]] = [[] for _ in range(n)]
        get_key = key_getter(self.key)
        target = self.target
        for record in rows(batch):
            try:
                out[target(get_key(record))].append(record)
            except Exception as exc:
                if fail is None:
                    raise
                fail(record, exc)
        return list(out)
