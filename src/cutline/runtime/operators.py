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

import json
import reprlib
import traceback
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias, get_args

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cutline.connectors.sink import RecordError as RecordError  # (the runtime's, too)
from cutline.connectors.sink import SinkWriter
from cutline.protocol.watermarks import EventClock
from cutline.runtime.state.backend import KeyedStateBackend
from cutline.runtime.state.config import StateConfig
from cutline.runtime.state.keygroups import (
    key_group,
    key_groups,
    subtask_for_key_group,
)
from cutline.runtime.state.opening import open_keyed_state
from cutline.runtime.state.segments import SegmentSource

Batch: TypeAlias = Any
"""A ``pyarrow.RecordBatch`` or a ``list`` of records (pyarrow has no type hints)."""
OnError: TypeAlias = Literal["fail", "dead_letter"]
"""What an operator does with a record it cannot process (a user function raised, a field is
missing): ``"fail"`` the job (it restarts as its restart strategy says, and fails if it keeps
failing) or send the record and its error to the ``"dead_letter"`` output and go on."""
ON_ERROR: tuple[OnError, ...] = get_args(OnError)
_repr = reprlib.Repr()  # records in messages: long ones shortened
_repr.maxstring = _repr.maxother = 200
_repr.maxlist = _repr.maxdict = 20


class UserFunctionError(Exception):
    """A user function raised while processing a record."""

    def __init__(
        self,
        operator: str,
        subtask: int,
        record: str,
        error: str,
        user_traceback: str,
        passing: bool = False,
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
        self.passing = passing
        """The error is of a kind that passes (an ``OSError``: a connection, a timeout)."""


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
    on_error: OnError = "fail"
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
    skipped: Callable[[str, int, str], None] | None = None
    """A source's: report records it will never read (``SourceContext.skipped``: split,
    records, why) to the driver, which counts them; ``None``: nowhere to (a test)."""
    clock: EventClock = field(default_factory=EventClock)
    """The subtask's event time (one place per subtask); the operator's is at ``position``."""
    position: int = 0
    """Where the operator is in its subtask's chain (its place on the ``clock``)."""

    @property
    def watermark(self) -> int:
        """The watermark this operator was last told (epoch ms; the least before any)."""
        return self.clock.reached(self.position)

    def advance(self, watermark: int) -> int:
        """This operator's time moves on to ``watermark`` if that is further (a restored
        window operator, a processing-time one); returns where it is."""
        return self.clock.advance(self.position, watermark)

    def open_keyed_state(self, state: Any) -> tuple[KeyedStateBackend, list[Mapping[str, Any]]]:
        """This subtask's keyed state backend, restored from ``state`` (see
        ``state/opening.py``), and the handles it was
        restored from."""
        return open_keyed_state(
            self.state,
            self.subtask,
            self.parallelism,
            self.max_parallelism,
            state,
            self.restore_store,
            self.restore_checkpoint,
        )

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
        raise UserFunctionError(
            self.name,
            self.subtask,
            _repr.repr(record),
            error,
            trace,
            passing=isinstance(exc, OSError),
        ) from exc


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
    holds_back = 0
    """Milliseconds by which the watermark it passes on stays behind the one it was told: it
    emits records up to that far behind the watermark (an outer interval join's unmatched
    rows, emitted when their last chance passed), which must not be late downstream."""

    def process(self, batch: Batch) -> Batch | None:
        raise NotImplementedError

    def process_from(self, port: int, batch: Batch) -> Batch | None:
        """(An operator of two inputs: its :class:`Logic` says ``two_inputs``.) ``batch``
        came on input ``port`` (0: the left or first, 1: the right or second): return the
        batch of records it emits, or ``None``."""
        raise NotImplementedError

    def on_watermark(self, watermark: int) -> Batch | None:
        """Event time reached ``watermark`` here (epoch ms; it only increases): return what
        that completes (an event-time window's result), or ``None``."""
        return None

    def on_processing_time(self, now_ms: int) -> Batch | None:
        """The wall clock is ``now_ms`` (epoch ms), called every few tens of milliseconds:
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


class Logic:
    """The picklable description of an operator's work."""

    keyed = False
    makes_watermarks = False
    """Its running operator makes watermarks from its records (``assign_timestamps``)."""
    two_inputs = False
    """It takes two inputs apart: each batch comes to ``process_from(port, batch)``."""
    restores_every_copy = False
    """At another parallelism, each subtask is given the state of every old subtask (a list,
    in the order of their indexes): broadcast state, the same in every subtask."""

    def open(self, ctx: OperatorContext, state: Any) -> RunningOperator:
        raise NotImplementedError


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
    """``map``: each record becomes what ``fn`` returns for it."""

    fn: Callable[[Any], Any]

    def open(self, ctx: OperatorContext, state: Any) -> RunningOperator:
        return _Map(self.fn, ctx)


class _Map(RunningOperator):
    def __init__(self, fn: Callable[[Any], Any], ctx: OperatorContext) -> None:
        self.fn, self.ctx = fn, ctx

    def process(self, batch: Batch) -> Batch | None:
        fn, out = self.fn, []
        for record in rows(batch):
            try:
                out.append(fn(record))
            except Exception as exc:
                self.ctx.fail(record, exc)
        return out


@dataclass(frozen=True)
class FilterLogic(Logic):
    """``filter``: the records for which ``fn`` is true, in order."""

    fn: Callable[[Any], Any]

    def open(self, ctx: OperatorContext, state: Any) -> RunningOperator:
        return _Filter(self.fn, ctx)


class _Filter(RunningOperator):
    def __init__(self, fn: Callable[[Any], Any], ctx: OperatorContext) -> None:
        self.fn, self.ctx = fn, ctx

    def process(self, batch: Batch) -> Batch | None:
        fn, out = self.fn, []
        for record in rows(batch):
            try:
                if fn(record):
                    out.append(record)
            except Exception as exc:
                self.ctx.fail(record, exc)
        return out


@dataclass(frozen=True)
class FlatMapLogic(Logic):
    """``flat_map``: each record becomes the records ``fn`` yields for it (``None``: none)."""

    fn: Callable[[Any], Iterable[Any] | None]

    def open(self, ctx: OperatorContext, state: Any) -> RunningOperator:
        return _FlatMap(self.fn, ctx)


class _FlatMap(RunningOperator):
    def __init__(self, fn: Callable[[Any], Iterable[Any] | None], ctx: OperatorContext) -> None:
        self.fn, self.ctx = fn, ctx

    def process(self, batch: Batch) -> Batch | None:
        return _flat_map(batch, self.fn, self.ctx)


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


STATELESS: tuple[type[Logic], ...] = (
    PassLogic,
    MapLogic,
    FilterLogic,
    FlatMapLogic,
    MapBatchesLogic,
)
"""The logics that keep no state (a checkpoint holds nothing of them)."""


# ----------------------------------------------------------------------------- keys


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


@dataclass
class Partitioner:
    """Splits a batch between the subtasks of a hash edge, by key group."""

    key: str | Callable[[Any], Hashable]
    parallelism: int
    max_parallelism: int
    nulls: bool = False
    """Whether a null key is a key (a join's: it pairs with nothing, but an outer join emits
    it), sent to the subtask of the key ``None``; else a record without a key fails."""
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
            if indices.null_count and not self.nulls:
                raise RecordError(f"key_by({self.key!r}): a record has no key (null)")
            groups = key_groups(encoded.dictionary, self.max_parallelism)
            targets = groups * n // self.max_parallelism  # (subtask_for_key_group, vectorized)
            if indices.null_count:  # (the subtask of the key None, at the end)
                targets = np.append(targets, self.target(None))
                indices = pc.fill_null(indices, len(targets) - 1)
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
