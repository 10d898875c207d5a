"""A source subtask's connector at work (Flink's ``SourceOperator``): its reader, its splits,
and the watermarks it makes from them.

:class:`SourceOperator` drives any :class:`~cutline.connectors.Source` the same way: it asks the
source for its splits (when the subtask opens, then every ``discovery_interval``), keeps the
subtask's own in a :class:`~cutline.protocol.splits.SplitBook` (the splits of a restored
checkpoint first, from their positions), hands them to the reader, and turns each read's
outcome into records and watermark actions: one generator per split
(:class:`~cutline.protocol.watermarks.SplitWatermarks`), fed as splits are added, show
records and finish. Its state in a checkpoint is a :class:`~cutline.protocol.splits.SplitState`
per split. Whatever a connector does wrong (raises, returns something else than a read's
outcome, gives a position that cannot be pickled) fails the subtask with a
:class:`~cutline.connectors.SourceError` naming the source and the split.
"""

from __future__ import annotations

import copy
import datetime as dt
import pickle
import time
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, assert_never

import numpy as np
import pyarrow as pa

from cutline.connectors.source import (
    Finished,
    Nothing,
    Records,
    Source,
    SourceContext,
    SourceError,
    SplitReader,
)
from cutline.protocol.splits import (
    AddSplit,
    Split,
    SplitAction,
    SplitBook,
    SplitChanged,
    SplitError,
    SplitState,
    merge_split_states,
)
from cutline.protocol.watermarks import SplitWatermarks, WatermarkAction, lowest_after
from cutline.runtime.durations import said_ms
from cutline.runtime.eventtime.timestamps import EventTimeError
from cutline.runtime.eventtime.watermarks import (
    WatermarkGenerator,
    WatermarkStrategy,
    jumps,
    promise_after,
)
from cutline.runtime.operators import OperatorContext

SOURCE_STATE = 2
"""The format of a source subtask's state: ``{"format": 2, "splits": {id: SplitState}}``."""
ALL = "all"
"""The one split of a subtask's event time when its reader reads its splits together."""


class SourceOperator:
    """The connector of one source subtask: see the module's docstring.

    :param state: the source's part of the restored checkpoint (merged over the old subtasks
        at another parallelism: :func:`merge_source_states`), or ``None``.
    :param strategy: how it makes watermarks (``None``: it makes none).
    """

    def __init__(
        self,
        source: Source,
        context: SourceContext,
        state: Any,
        strategy: WatermarkStrategy | None,
    ) -> None:
        self.source = source
        self.context = context
        self.name = context.name
        self.strategy = strategy
        self.reader: SplitReader = self._call("open its reader", source.reader, context)
        self.book = SplitBook(context.subtask, context.parallelism)
        self.generator: SplitWatermarks[str] | None = None
        self.watermarks: list[WatermarkAction] = []
        """Watermark actions made since the subtask last took them (:meth:`take_watermarks`)."""
        self.wait = 0.0
        """How long to wait before the next read (the reader had nothing)."""
        self._unit_checked = False
        self._latest: dict[str, int] = {}
        self._generators: dict[str, WatermarkGenerator] = {}
        """Per split (of event time), its copy of the user's watermark generator."""
        """Per split (of event time), the latest time read, this attempt."""
        self._jumped: set[str] = set()
        """The splits whose jumps were warned about."""
        """Whether the first event times were looked at (seconds read as milliseconds?)."""
        if strategy is not None:
            self.generator = SplitWatermarks(
                strategy.bound_ms, strategy.idle_timeout_s, bounded=source.bounded
            )
            if not source.watermarks_per_split:
                self.generator.split_added(ALL)
        listing = self._listing()
        if state:
            numbered = [split for split in listing if split.ordinal is not None]
            self._add(self.book.restored(source_split_states(state, self.name), numbered))
        self._add(self.book.discovered(listing))
        interval = source.discovery_interval
        self._discover_at = None if interval is None else time.monotonic() + interval
        self._caught_up_at = 0.0
        self._quiet()

    # -------------------------------------------------------------------- reading

    @property
    def exhausted(self) -> bool:
        """A bounded source whose splits here all finished."""
        return self.source.bounded and self.book.done

    def read(self, max_records: int) -> Any:
        """One read: a batch of records, or ``None`` (nothing now: :attr:`wait` says how long
        to wait; or a split finished; or nothing is left: :attr:`exhausted`)."""
        self.wait = 0.0
        if self.exhausted:
            return None
        outcome = self._call("read", self.reader.read, max_records)
        match outcome:
            case Records(batch=batch, split=split):
                self._check_records(batch, split)
                if self.generator is not None and len(batch):
                    key = ALL if not self.source.watermarks_per_split else split
                    assert key is not None and self.strategy is not None
                    try:
                        times, missing = self.strategy.column.timestamps(batch)
                    except EventTimeError as exc:
                        raise SourceError(f"source {self.name}: {exc}") from None
                    values = times if missing is None else times[~missing]
                    if self.strategy.max_jump_ms is not None and len(values):
                        batch, values = self._without_jumps(key, batch, split, times, missing)
                    if len(values):
                        highest = int(values.max())
                        self._latest[key] = max(highest, self._latest.get(key, highest))
                        self.watermarks += self._promise(key, batch, values, highest)
                        if not self._unit_checked:
                            self._unit_checked = True
                            said = self.strategy.column.seconds_like(values)
                            if said is not None:
                                self._warn(f"source {self.name}: {said}")
                return batch if len(batch) else None
            case Finished(split=split):
                self._finish(split)
                return None
            case Nothing(wait=wait):
                self.wait = max(0.0, min(float(wait), 1.0))
                return None
        raise SourceError(
            f"source {self.name}: its reader's read() returned {outcome!r}, not Records, "
            "Nothing or Finished (cutline.connectors)"
        )

    def _promise(
        self, key: str, batch: Any, values: np.ndarray, highest: int
    ) -> list[WatermarkAction]:
        """What a split's records move: by bounded out-of-orderness, or by the user's
        generator (a copy of it per split) and what it promises after them."""
        assert self.generator is not None and self.strategy is not None
        now_s = time.monotonic()
        prototype = self.strategy.generator
        if prototype is None:
            return self.generator.records(key, highest, now_s)
        mine = self._generators.get(key)
        if mine is None:
            mine = self._generators[key] = copy.deepcopy(prototype)
        try:
            promise = promise_after(mine, self.strategy.column, batch, values)
        except Exception as exc:
            raise SourceError(
                f"source {self.name}: its watermark generator {prototype!r} failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        return self.generator.promised(key, promise, now_s)

    def _without_jumps(
        self,
        key: str,
        batch: Any,
        split: str | None,
        times: np.ndarray,
        missing: np.ndarray | None,
    ) -> tuple[Any, Any]:
        """The batch without the records whose time (``times``, ``missing`` where it has
        none) jumps more than ``max_jump`` ahead of their split
        (:func:`~cutline.runtime.eventtime.watermarks.jumps`), which go to the dead letters
        (``on_error="dead_letter"``); else all of it, and a warning, once per split. Returns
        the batch and its present times."""
        strategy = self.strategy
        assert strategy is not None and strategy.max_jump_ms is not None
        present = np.ones(len(times), dtype=bool) if missing is None else ~missing
        jumped = np.zeros(len(times), dtype=bool)
        jumped[present] = jumps(times[present], self._latest.get(key), strategy.max_jump_ms)
        if not jumped.any():
            return batch, times[present]
        where = f"split {split}" if split is not None else "its records"
        latest = self._latest.get(key)
        since = "the others of its batch" if latest is None else f"its latest ({_utc(latest)})"
        first = int(times[jumped].min())
        why = (
            f"event time {_utc(first)} jumps more than max_jump="
            f"{said_ms(strategy.max_jump_ms)} ahead of {since}"
        )
        if self.context.rejected is None:
            if key not in self._jumped:
                self._jumped.add(key)
                self._warn(
                    f"source {self.name}: {where}: {int(jumped.sum())} record(s) whose {why}: "
                    "the watermark follows them and later records may be late (on_error="
                    "'dead_letter' sends such records to the dead letters instead)"
                )
            return batch, times[present]
        records = batch.to_pylist() if isinstance(batch, pa.RecordBatch) else list(batch)
        for index in np.flatnonzero(jumped).tolist():
            self.context.rejected(records[index], f"{where}: {why}")
        kept = ~jumped
        if isinstance(batch, pa.RecordBatch):
            batch = batch.filter(pa.array(kept))
        else:
            batch = [r for r, keep in zip(records, kept.tolist(), strict=True) if keep]
        return batch, times[kept & present]

    def take_watermarks(self) -> list[WatermarkAction]:
        taken, self.watermarks = self.watermarks, []
        return taken

    def tick(self, now_s: float) -> list[WatermarkAction]:
        """Processing time is ``now_s`` (monotonic seconds): splits idle for ``idle_timeout``
        stop holding the watermark back (a split that never showed a record counts from when
        its reader said it read all there is); an unbounded source lists its splits again
        when its ``discovery_interval`` has passed."""
        if self._discover_at is not None and now_s >= self._discover_at:
            interval = self.source.discovery_interval
            assert interval is not None
            self._discover_at = now_s + interval
            self._add(self.book.discovered(self._listing()))
        generator = self.generator
        if generator is not None:
            timeout = generator.idle_timeout
            if timeout is not None and now_s >= self._caught_up_at:
                self._caught_up_at = now_s + min(0.05, timeout / 4)
                asked = "say which splits it read to their end"
                for split in self._call(asked, self.reader.caught_up):
                    if self.book.reads(split):
                        self.watermarks += generator.caught_up(split, now_s)
            self.watermarks += generator.tick(now_s)
        return self.take_watermarks()

    def end(self) -> list[WatermarkAction]:
        """The input ended (every split finished): the watermark goes to its end."""
        if self.generator is None:
            return []
        return self.generator.exhausted()

    # ---------------------------------------------------------------- checkpoints

    def snapshot(self, checkpoint_id: int | None = None) -> dict[str, Any]:
        """The state of every split of this subtask, for checkpoint ``checkpoint_id``."""
        positions = {
            split: self._call(f"give its position in split {split!r}", self.reader.position, split)
            for split in self.book.unfinished
        }
        try:
            pickle.dumps(positions)
        except Exception:  # (now, naming the split, rather than when the state file is written)
            self._check_picklable(positions)
        if checkpoint_id is not None:
            taken = self.reader.positions_taken
            self._call("take the positions of a checkpoint", taken, checkpoint_id, positions)
        return {"format": SOURCE_STATE, "splits": self.book.snapshot(positions)}

    def _check_picklable(self, positions: Mapping[str, Any]) -> None:
        for split, position in positions.items():
            try:
                pickle.dumps(position)
            except Exception as exc:
                raise SourceError(
                    f"source {self.name}: the position of split {split!r} cannot be pickled "
                    f"({type(exc).__name__}: {exc}): a position must be small and picklable "
                    f"(it was {position!r:.200})"
                ) from None

    def checkpoint_complete(self, checkpoint_id: int) -> None:
        self._call("take a completed checkpoint", self.reader.checkpoint_complete, checkpoint_id)

    def close(self) -> None:
        self.reader.close()

    # ------------------------------------------------------------------- helpers

    def _listing(self) -> list[Split]:
        splits: list[Split] = self._call("list its splits", lambda: list(self.source.splits()))
        wrong = [s for s in splits if not isinstance(s, Split)]
        if wrong:
            raise SourceError(
                f"source {self.name}: splits() gave {wrong[0]!r}, not a cutline.connectors.Split"
            )
        return splits

    def _add(self, actions: Iterable[SplitAction]) -> None:
        for action in actions:
            match action:
                case AddSplit(split=split, position=position):
                    self._call(f"add split {split.id!r}", self.reader.add_split, split, position)
                    if self.generator is not None and self.source.watermarks_per_split:
                        self.generator.split_added(split.id, self._lowest(split.id))
                case SplitChanged(split=split, before=before, finished=finished):
                    read = "was read" if finished else "is being read"
                    self._warn(
                        f"source {self.name}: split {split.id} changed after it {read} "
                        f"(it was {before}, it is {split.version}): what changed is not read "
                        "(a split is read once; put new data in a new file)"
                    )
                case _:
                    assert_never(action)

    def _warn(self, message: str) -> None:
        if self.context.warn is not None:
            self.context.warn(message)
        else:
            warnings.warn(message, stacklevel=2)

    def _finish(self, split: str) -> None:
        try:
            self.book.finished(split)
        except SplitError as exc:
            raise SourceError(f"source {self.name}: its reader finished {exc}") from None
        if self.generator is not None and self.source.watermarks_per_split:
            self.watermarks += self.generator.split_finished(split)
        self._quiet()

    def _quiet(self) -> None:
        """An unbounded source with nothing to read here holds nothing back."""
        generator = self.generator
        if generator is not None and not self.source.bounded and not generator.splits:
            self.watermarks += generator.quiet()

    def _lowest(self, split: str) -> int | None:
        """What a split not started holds the watermark at: its lowest timestamp when the
        reader knows it, else what its first records and the bound allow."""
        strategy = self.strategy
        assert strategy is not None
        column = strategy.column
        if column.offset == 0:
            lowest = self._call(
                "give a split's lowest timestamp",
                self.reader.lowest_timestamp,
                split,
                column.column,
            )
            if lowest is not None and column.unit not in (None, "ms") and column.integers:
                return int(lowest * column.per_unit)  # (the reader read integers as ms)
            if lowest is not None and (column.unit in (None, "ms") or column.type is not None):
                return int(lowest)
        if strategy.generator is not None:
            return None  # (how far out of order a split's first records come: unknown)
        head = self._call(f"read the head of split {split!r}", self.reader.head, split)
        if head is None or not len(head):
            return None
        values = column.present(head)
        if not len(values):
            return None
        return lowest_after(int(values.min()), int(values.max()), strategy.bound_ms)

    def _check_records(self, batch: Any, split: str | None) -> None:
        if not hasattr(batch, "__len__"):
            raise SourceError(
                f"source {self.name}: its reader returned Records of {type(batch).__name__}, "
                "not a pyarrow.RecordBatch or a list of records"
            )
        if split is None and self.source.watermarks_per_split:
            raise SourceError(
                f"source {self.name}: its reader returned Records without a split: name the "
                "split the records are of, or set watermarks_per_split = False on the source "
                "(its reader reads its splits together)"
            )
        if split is not None and not self.book.reads(split):
            raise SourceError(
                f"source {self.name}: its reader returned records of split {split!r}, which "
                "it was not given or which finished"
            )

    def _call(self, what: str, method: Any, *args: Any) -> Any:
        """A call into the connector; what it raises fails the subtask naming the source."""
        try:
            return method(*args)
        except SourceError:
            raise
        except Exception as exc:
            raise SourceError(
                f"source {self.name} failed to {what}: {type(exc).__name__}: {exc}"
            ) from exc


@dataclass(frozen=True)
class SourceLogic:
    """A source operator: any connector's :class:`~cutline.connectors.Source`, run by a
    :class:`SourceOperator` on each subtask. The records its reader rejects (a malformed row,
    one not of the job's schema) fail the job naming their split (a file source: file and
    line), or, with ``on_error="dead_letter"``, go to the dead-letter output."""

    source: Source
    watermarks: WatermarkStrategy | None = None
    """How its subtasks make watermarks (``event_time=``); ``None``: they make none."""

    def open(self, ctx: OperatorContext, state: Any) -> SourceOperator:
        rejected = None
        dead = ctx.dead_letters
        if ctx.on_error == "dead_letter" and dead is not None:

            def rejected(record: Any, error: str) -> None:
                dead.add(ctx.name, ctx.subtask, record, error, "")

        context = SourceContext(
            ctx.name, ctx.subtask, ctx.parallelism, rejected, ctx.warn, ctx.skipped
        )
        return SourceOperator(self.source, context, state, self.watermarks)


def source_split_states(state: Any, name: str) -> dict[str, SplitState]:
    """The split states of a source's restored state (merged or not): this format, or the
    per-split counts of the built-in sources before it (a sequence's records per split, a
    file source's rows per file), which their readers' positions still are."""
    if isinstance(state, Mapping) and state.get("format") == SOURCE_STATE:
        splits = state.get("splits")
        if isinstance(splits, Mapping) and all(isinstance(s, SplitState) for s in splits.values()):
            return dict(splits)
    if isinstance(state, Mapping):
        counts = state.get("splits") if "splits" in state else state.get("rows")
        if isinstance(counts, Mapping) and all(
            isinstance(n, int) and not isinstance(n, bool) for n in counts.values()
        ):
            return {str(s): SplitState(_ordinal(str(s)), int(n)) for s, n in counts.items()}
    raise SourceError(
        f"source {name}: the checkpoint holds a source state this version cannot read "
        f"({state!r:.200}): restore it with the cutline that wrote it, or start afresh"
    )


def _ordinal(split: str) -> int | None:
    """A built-in split's ordinal before this format: a sequence's split number."""
    return int(split) if split.isdigit() else None


def merge_source_states(states: Iterable[Any], name: str) -> dict[str, Any]:
    """One source state from those of several old subtasks (a restore at another
    parallelism): every split's state, for the new subtasks to deal again."""
    merged = merge_split_states(source_split_states(s, name) for s in states)
    return {"format": SOURCE_STATE, "splits": merged}


def _utc(ms: int) -> str:
    """An event time for a message: its UTC date and time."""
    try:
        moment = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(milliseconds=ms)
    except OverflowError:
        return f"{ms} ms after the epoch"
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")
