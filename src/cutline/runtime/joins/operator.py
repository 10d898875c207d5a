"""The join operator: one for every built-in join, driving its *kernel* (the state and the
rule that pairs rows: ``interval.py``, ``regular.py``, ``window.py``, ``asof.py``).

It decides what the kernel sees: each batch of either input as Arrow columns, with its
records' event times (epoch ms, from each side's event-time column) and key groups; a record
without event time fails (the job's ``on_error``); a record **late** when it arrives (its time
at or before the operator's watermark, or, after a restore at another parallelism, the
watermark its key's old subtask had reached) goes to the side output ``late`` (``.late()``)
as it came, and is counted, never given to the kernel: its partners may be gone. The
watermark (the least of both inputs', the runtime's valve) is passed on to the kernel, which
emits what it completes and drops what no later row can pair with. A window join's
``window_start`` and ``window_end`` come back in the type of the left's event-time column.

The kernel keeps its rows itself (:class:`~cutline.runtime.joins.rows.SideRows`); on the
disk backend, beyond half of ``StateConfig.memory``, in Arrow files of the subtask's state
folder (the keyed backend's, removed with it), named ``join-<subtask>-<generation>-<n>.arrow``
(:class:`~cutline.runtime.joins.chunks.Spill`), mapped back when read.

A checkpoint holds the keyed state backend's snapshot (empty: the kernel keeps its rows
itself), the watermark and the late count, and the kernel's tables, written as a segment of
their own (a full one every time: every row kept, spilled or not, encoded in memory on the
snapshot thread); a restore reads every old subtask's tables whose key groups overlap this
subtask's, and the kernel keeps the rows of its own key groups.

An incremental checkpoint would take: chunks are immutable, so a segment could hold only the
chunks made since the checkpoint it builds on (a spilled chunk could even be referenced by its
file rather than copied, were files kept for checkpoints), plus the per-row arrays that change
(which rows are alive, which matched) as deltas; compaction would have to keep a chunk's
identity (or write the chunks it makes as new ones), and a restore would replay the chain:
the chunks in order, then the drops. What the operator lacks for it today is a
:class:`~cutline.runtime.state.columns.ColumnChain` encoding of the kernel's chunks by
generation, as the window runs have (:func:`~cutline.runtime.eventtime.layouts.encode_runs`).
"""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from cutline.protocol.watermarks import MIN_WATERMARK
from cutline.runtime.eventtime.lateness import restored_marks
from cutline.runtime.eventtime.output import LateRecords
from cutline.runtime.eventtime.timestamps import EventTimeError, TimeColumn
from cutline.runtime.joins.chunks import Spill
from cutline.runtime.joins.output import Side
from cutline.runtime.operators import (
    Batch,
    Logic,
    OperatorContext,
    RecordError,
    RunningOperator,
    to_arrow,
)
from cutline.runtime.state.backend import KeyedSnapshot
from cutline.runtime.state.columns import ColumnChain, read_chain
from cutline.runtime.state.keygroups import key_group, key_groups
from cutline.runtime.state.segments import SegmentStore

LATE_SIDES = {Side.LEFT: "late_left", Side.RIGHT: "late_right"}
"""The side outputs of a join's late records, per input (``.late("left")``)."""


class JoinKernel(Protocol):
    """One subtask's state of one join and the rule that pairs its rows (see the kernels)."""

    def add(
        self, side: Side, batch: pa.RecordBatch, times: np.ndarray, key_groups: np.ndarray
    ) -> pa.RecordBatch | None: ...

    def advance(self, watermark: int) -> pa.RecordBatch | None: ...

    def snapshot(self) -> dict[str, pa.Table]: ...

    def kept(self) -> dict[str, int]: ...


@dataclass(frozen=True)
class KeyColumns:
    """A key of several columns, as a function of a record (the hash edge's key): the tuple
    of their values."""

    names: tuple[str, ...]

    @property
    def __name__(self) -> str:
        return "+".join(self.names)

    def __call__(self, record: Any) -> Hashable:
        return tuple(record[name] for name in self.names)


def edge_key(columns: tuple[str, ...]) -> str | KeyColumns:
    """How a join's input edge finds a record's key: its one column, or the tuple of them."""
    return columns[0] if len(columns) == 1 else KeyColumns(columns)


@dataclass(frozen=True)
class JoinLogic(Logic):
    """A built-in join of two inputs: ``make(spill=...)`` its kernel, or ``restore(snapshots,
    key_groups, spill=...)`` one from old subtasks' tables (``spill``: where its rows go
    beyond memory, ``None`` on the memory backend); ``keys`` each side's key columns,
    ``times`` each side's event time; ``window_time``: a window join's, the type its
    ``window_start`` and ``window_end`` come back in."""

    make: Callable[..., JoinKernel]
    restore: Callable[..., JoinKernel]
    keys: tuple[tuple[str, ...], tuple[str, ...]]
    times: tuple[TimeColumn | None, TimeColumn | None]
    """(``None``: a side without event time, in a regular join without a ``ttl``: its records
    are never late.)"""
    window_time: TimeColumn | None = None
    holds_back: int = 0
    """Milliseconds the watermark it passes on stays behind its own (an outer interval
    join's: its unmatched rows come out that far behind)."""
    keyed = True
    two_inputs = True
    null_keys = True
    """A record with a null key is sent to it (it pairs with nothing; an outer join emits
    it), not refused on the way."""

    def open(self, ctx: OperatorContext, state: Any) -> RunningOperator:
        return JoinOperator(self, ctx, state)


class JoinOperator(RunningOperator):
    """The running join of one subtask."""

    def __init__(self, logic: JoinLogic, ctx: OperatorContext, state: Any) -> None:
        self.logic = logic
        self.ctx = ctx
        self.holds_back = logic.holds_back
        self.backend, restored = ctx.open_keyed_state(state)
        try:
            self._open(restored)
        except BaseException:
            self.backend.close()
            raise

    def _open(self, restored: list[Mapping[str, Any]]) -> None:
        ctx, mine = self.ctx, self.backend.key_groups
        self.floors: np.ndarray | None = None
        """After a restore at another parallelism: per key group, the watermark its old
        subtask had reached (a record at or before it is late), until the watermark passes
        them all."""
        marks, late = restored_marks(restored, mine)
        snapshots: list[dict[str, pa.Table]] = []
        for handle in restored:
            if ctx.restore_store is not None:
                snapshots += [pickle.loads(data) for data in read_chain(handle, ctx.restore_store)]
        if marks:
            ctx.advance(min(mark for _, mark in marks))
            if len({mark for _, mark in marks}) > 1:
                self.floors = np.full(ctx.max_parallelism, MIN_WATERMARK, dtype=np.int64)
                for groups, mark in marks:
                    self.floors[groups.start : groups.stop] = mark
        spill = Spill.of(ctx.state, self.backend.path, f"join-{ctx.subtask}-{ctx.generation}")
        self.kernel = (
            self.logic.restore(snapshots, mine, spill=spill)
            if snapshots
            else self.logic.make(spill=spill)
        )
        self.lates = (
            LateRecords(LATE_SIDES[Side.LEFT] in ctx.side_outputs, late),
            LateRecords(LATE_SIDES[Side.RIGHT] in ctx.side_outputs),
        )
        """Each input's late records: counted, and held for its side output when the job
        reads it (``.late("left")``); the count restored is the left's (it is their sum)."""
        self.chain = ColumnChain(dataclasses.replace(ctx.state, incremental=False))

    # ---------------------------------------------------------------- records

    def process(self, batch: Batch) -> Batch | None:
        raise AssertionError("a two-input operator is given its batches with their port")

    def process_from(self, port: int, batch: Batch) -> Batch | None:
        side = Side(port)
        try:
            columns = to_arrow(batch, self.ctx.name)
        except RecordError as exc:
            for record in batch:
                self.ctx.fail(record, exc)
            return None
        if not columns.num_rows:
            return None
        time = self.logic.times[port]
        if time is None:  # (a regular join's side without event time: never late)
            groups = self._key_groups(side, columns)
            if groups is None:
                return None
            zeros = np.zeros(columns.num_rows, dtype=np.int64)
            return self._out(self.kernel.add(side, columns, zeros, groups))
        try:
            times, missing = time.timestamps(columns)
        except EventTimeError as exc:
            self.ctx.fail(columns.slice(0, 1).to_pylist()[0], exc)
            return None
        if missing is not None:
            for record in columns.filter(pa.array(missing)).to_pylist():
                self.ctx.fail(record, RecordError(f"{self._side(side)}: no event time", record))
            columns, times = columns.filter(pa.array(~missing)), times[~missing]
        groups = self._key_groups(side, columns)
        if groups is None:
            return None
        late = self._late(side, times)
        if self.floors is not None:
            late |= times <= self.floors[groups]
        if late.any():
            self.lates[side].add(columns.filter(pa.array(late)))
            on_time = ~late
            columns, times, groups = (
                columns.filter(pa.array(on_time)),
                times[on_time],
                groups[on_time],
            )
            if not columns.num_rows:
                return None
        return self._out(self.kernel.add(side, columns, times, groups))

    def _late(self, side: Side, times: np.ndarray) -> np.ndarray:
        """Which records are late: the kernel's rule where it has one (a window join's: every
        window of the record fired), else at or before the operator's watermark."""
        rule = getattr(self.kernel, "late", None)
        if rule is not None:
            late: np.ndarray = rule(side, times)
            return late
        return times <= self.ctx.watermark

    def _side(self, side: Side) -> str:
        return f"{self.ctx.name} ({side.name.lower()} input)"

    def _key_groups(self, side: Side, columns: pa.RecordBatch) -> np.ndarray | None:
        """Each record's key group (of its key columns); a missing column fails the batch."""
        names = self.logic.keys[side]
        for name in names:
            if columns.schema.get_field_index(name) < 0:
                record = columns.slice(0, 1).to_pylist()[0]
                self.ctx.fail(
                    record,
                    RecordError(
                        f"{self._side(side)}: the records have no key column {name!r} "
                        f"(columns: {', '.join(columns.schema.names)})",
                        record,
                    ),
                )
                return None
        maximum = self.ctx.max_parallelism
        if len(names) == 1:
            return key_groups(columns.column(names[0]), maximum)
        values = zip(*(columns.column(n).to_pylist() for n in names), strict=True)
        return np.array([key_group(tuple(v), maximum) for v in values], dtype=np.int64)

    def _out(self, out: pa.RecordBatch | None) -> Batch | None:
        """A kernel's results: a window join's window bounds in the event time's type."""
        if out is None or not out.num_rows:
            return None
        window = self.logic.window_time
        if window is not None:
            for name in ("window_start", "window_end"):
                index = out.schema.get_field_index(name)
                values = out.column(index).to_numpy(zero_copy_only=False)
                out = out.set_column(index, name, window.to_column(values))
        return out

    # ---------------------------------------------------------------- event time

    def on_watermark(self, watermark: int) -> Batch | None:
        if self.floors is not None and watermark >= int(self.floors.max()):
            self.floors = None
        return self._out(self.kernel.advance(watermark))

    def side_output(self, side: str) -> Batch | None:
        for which, name in LATE_SIDES.items():
            if side == name:
                return self.lates[which].take()
        return None

    @property
    def late_count(self) -> int:
        return self.lates[0].count + self.lates[1].count

    def figures(self) -> dict[str, int] | None:
        kept = self.kernel.kept()
        return {"late": self.late_count, "kept": sum(kept.values())}

    # ---------------------------------------------------------------- checkpoints

    def snapshot(
        self, checkpoint_id: int, *, base: int | None = None, savepoint: bool = False
    ) -> KeyedSnapshot:
        taken = self.backend.snapshot(checkpoint_id, base=base, savepoint=savepoint)
        taken.extra["watermark"] = self.ctx.watermark
        taken.extra["late"] = self.late_count
        taken.extra["kept"] = self.kernel.kept()
        tables = self.kernel.snapshot()
        chain = self.chain
        ticket = chain.snapshot(checkpoint_id, base, savepoint)

        def write(store: SegmentStore, name: str) -> dict[str, Any]:
            return chain.write(ticket, store, name, lambda _: pickle.dumps(tables, protocol=5))

        taken.attached.append(write)
        return taken

    def close(self) -> None:
        self.backend.close()
