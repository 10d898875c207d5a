"""Tumbling windows of a built-in on the disk backend, kept as **runs** (the write path of a
log-structured merge tree): a batch's records are grouped by key and window with Arrow, and
each window's groups are appended to it as one immutable run of partial results (keys and
their accumulators, as columns). Nothing is looked up when records come: a run is not merged
with the window's others until the window fires, when they merge per key (counts and sums
add, the least of the least values is the least, a mean adds its sums and its counts).

* **Larger than memory.** Runs held in memory beyond half the backend's ``memory`` are
  written (spilled), all at once into one Arrow file of the backend's local folder, and
  mapped back: the operating system pages them in and out as the window's merge reads them.
  A file is removed once no window holds a run of it.
* **Compaction.** A window with more than :data:`MOST_RUNS` runs merges them into fewer,
  size-tiered, among those of one snapshot, or those no later incremental checkpoint needs
  apart (made before the checkpoint later ones build on:
  :attr:`~cutline.runtime.state.columns.ColumnChain.settled`); beyond :data:`MOST_CLASSES`
  runs (checkpoints that do not complete), all of them, the window then written whole.
* **What must fit.** A window's keys when it fires (it merges its runs at once, and its
  result is one batch), and what a restore reads (the restored windows, merged, before they
  are spilled again).
* **Incremental checkpoints.** A run never changes: a checkpoint writes, of each window, the
  runs made since the checkpoint it builds on (merged into one, on the snapshot thread), as
  a segment of the windows' chain
  (:class:`~cutline.runtime.state.columns.ColumnChain`, read back by
  :func:`~cutline.runtime.eventtime.layouts.read_windows`, as every columnar layout's).

A record within the lateness of a fired window adds a run to it, and the window fires again
for the record's key: its result over every run, restricted to the keys that came. A window
fires through one timer for all its keys (the timer's key is ``None``, its namespace the
window's start), as in :class:`~cutline.runtime.eventtime.columnar_windows.ColumnarWindows`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cutline.runtime.eventtime.aggregations import grouped_parts
from cutline.runtime.eventtime.columnar_windows import (
    WindowsByStart,
    joined,
    restored_parts,
    window_triples,
)
from cutline.runtime.eventtime.layouts import RunState, WindowParts, encode_runs
from cutline.runtime.eventtime.operator import WindowOperator
from cutline.runtime.eventtime.slicing import (
    Part,
    distinct_keys,
    merge_parts,
    restrict,
    results_of,
    window_result,
)
from cutline.runtime.eventtime.timers import Timer
from cutline.runtime.operators import Batch
from cutline.runtime.state.backend import KeyedSnapshot
from cutline.runtime.state.columns import ColumnChain
from cutline.runtime.state.segments import SegmentStore

MOST_RUNS = 16
"""A window with more runs than this compacts them."""

MOST_CLASSES = 64
"""Runs a window keeps apart at most, however many snapshots made them: beyond (checkpoints
that never complete), they are merged into one, and the next checkpoint writes the window
whole."""


@dataclass(frozen=True)
class Run:
    """Partial results of one window, each key once: immutable."""

    keys: pa.Array
    acc: np.ndarray
    """Per key: its count, sum, least or greatest value (mean: its sum)."""
    count: np.ndarray | None
    """Mean: per key, how many values its sum holds."""
    number: int
    """The snapshot it goes into (0: restored)."""
    file: str | None = None
    """Spilled: the local file its columns are mapped from."""

    @property
    def part(self) -> Part:
        return self.keys, self.acc, self.count

    @property
    def held(self) -> int:
        """Bytes it holds in memory (0: spilled)."""
        if self.file is not None:
            return 0
        count = 0 if self.count is None else self.count.nbytes
        return int(self.keys.nbytes + self.acc.nbytes + count)


@dataclass
class WindowRuns:
    """One window kept as runs."""

    start: int
    runs: tuple[Run, ...]
    """Replaced when a run comes or they are compacted, never changed: snapshots share it."""
    born: int
    """The snapshot the window was made for (0: restored)."""
    fired: bool = False
    """Fired, and kept for the allowed lateness."""
    waiting: pa.Array | None = field(default=None)
    """Of a fired window, the keys it has not fired for yet (restored so): they fire when the
    watermark passes its end."""


class RunWindows(WindowsByStart):
    """Tumbling windows computing a built-in aggregate (``count``, ``sum``, ``min``, ``max``,
    ``mean``) on the disk backend, as runs (see the module)."""

    def __init__(self, op: WindowOperator) -> None:
        super().__init__(op)
        self.windows: dict[int, WindowRuns] = {}
        self.folder = op.backend.path
        """Where runs are spilled (``None``: they stay in memory)."""
        self.budget = op.ctx.state.memory // 2
        """Bytes of runs held in memory beyond which they are spilled."""
        self.held = 0
        """Bytes of the live windows' runs held in memory."""
        self.spills = 0
        self._files = itertools.count()
        self._live: dict[str, int] = {}
        """Per spill file, the runs of it that windows hold."""
        self._stuck = 0
        """Bytes of runs that stayed in memory at the last spill (they cannot be spilled)."""
        for start, pieces in restored_parts(op, self.chain, self._adopts).items():
            self._restore(start, pieces)
        self._spill_if_full()

    _adopts = True
    """Whether later checkpoints may build on the restored chain (it holds the windows as
    this store does)."""

    def _restore(self, start: int, pieces: list[WindowParts]) -> None:
        """A restored window, one run (of the old subtasks that held it); fired if any of
        its keys had, the others waiting."""
        keys, acc, count, flags = joined(pieces)
        run = Run(keys, acc, count, 0)
        window = WindowRuns(start, (run,), born=0, fired=bool(flags.any()))
        if window.fired and not flags.all():
            window.waiting = keys.filter(pa.array(~flags))
        self.held += run.held
        self._add_window(window)

    def _holders(self) -> list[WindowRuns]:
        """Everything that holds runs (the windows; sliding windows' slices too)."""
        return list(self.windows.values())

    # ---------------------------------------------------------------- figures

    @property
    def open_windows(self) -> int:
        """The keys of each window not fired yet, added up (exact up to
        :data:`~cutline.runtime.eventtime.slicing.COUNTED` rows of runs in all). Read from the
        thread that reports the figures: a copy first."""
        found = []
        for window in list(self.windows.values()):
            if window.fired:
                found.append([] if window.waiting is None else [window.waiting])
            else:
                found.append([run.keys for run in window.runs])
        return distinct_keys(found)

    # ---------------------------------------------------------------- records

    def add(self, batch: Batch, ts: np.ndarray) -> Batch | None:
        found = window_triples(self.op, batch, ts)
        return None if found is None else self._merge(*found)

    def _merge(self, keys: pa.Array, starts: np.ndarray, values: Any) -> Batch | None:
        """(key, window start, value) triples grouped by key and window, each window's groups
        appended to it as a run; the fired windows kept for the lateness that they update
        fire again for their keys."""
        again: list[tuple[int, pa.Array, np.ndarray]] = []
        for start, run in grouped_runs(keys, starts, values, self.aggregation.kind, self.chain):
            self.held += run.held
            window = self.windows.get(start)
            if window is None:
                self._add_window(WindowRuns(start, (run,), born=run.number))
                continue
            self._append(window, run)
            if window.fired:
                these = run.keys
                if window.waiting is not None:  # (those fire when the watermark passes)
                    waiting = window.waiting.cast(these.type)
                    these = these.filter(pc.invert(pc.is_in(these, value_set=waiting)))
                result = self._result(start, these)
                if result is not None:
                    again.append((start, *result))
        self._spill_if_full()
        return self._batch(again) if again else None

    def _result(self, start: int, keys: pa.Array | None = None) -> tuple[pa.Array, Any] | None:
        """The result per key (of ``keys`` only) of the window at ``start``; ``None``: it
        holds none."""
        parts = [run.part for run in self.windows[start].runs]
        if keys is not None:
            parts = [restrict(part, keys) for part in parts]
        return window_result(parts, self.aggregation.kind)

    # -------------------------------------------------------- compaction, spills

    def _append(self, holder: WindowRuns, run: Run) -> None:
        """A new run of a window (or slice), compacted with its others beyond
        :data:`MOST_RUNS`."""
        holder.runs = (*holder.runs, run)
        if len(holder.runs) > MOST_RUNS:
            self._compact(holder)

    def _compact(self, window: WindowRuns) -> None:
        """Merge the window's runs into fewer, size-tiered: of those no later incremental
        checkpoint needs apart (all those made up to :attr:`ColumnChain.settled`, or those of
        one later snapshot), the smallest, each next one as long as it is at most twice those
        taken before it together (a large run is not merged again for each small one)."""
        settled = self.chain.settled
        classes: dict[int, list[Run]] = {}
        for run in window.runs:
            classes.setdefault(max(run.number, settled), []).append(run)
        runs: list[Run] = []
        for found in classes.values():
            found.sort(key=lambda run: len(run.keys))
            taken = 2
            rows = sum(len(run.keys) for run in found[:2])
            while taken < len(found) and len(found[taken].keys) <= 2 * rows:
                rows += len(found[taken].keys)
                taken += 1
            merged = self._merged(found[:taken]) if len(found) > 1 else None
            runs.extend(found if merged is None else [merged, *found[taken:]])
        if len(runs) > MOST_CLASSES:  # (checkpoints that do not complete: one class each)
            merged = self._merged(runs)
            runs = [] if merged is None else [merged]
            window.born = self.chain.generation  # (the next segment writes it whole)
        window.runs = tuple(runs)

    def _merged(self, runs: list[Run], part: Part | None = None) -> Run | None:
        """One run of ``runs`` (of one class: see :meth:`_compact`); ``part``: their merge,
        already made. ``None``: they hold no key."""
        part = part or merge_parts([run.part for run in runs], self.aggregation.kind)
        if part is None:
            return None
        merged = Run(*part, number=max(run.number for run in runs))
        self.held += merged.held - sum(run.held for run in runs)
        self._forget(runs)
        return merged

    def _spill_if_full(self) -> None:
        """Beyond the budget (over what could not be spilled before), every run held in
        memory is written to the local folder and mapped back: one file per spill (and per
        shape of run), whatever the number of runs, so that a subtask holds few files and
        mappings. Runs of Python ints (sums beyond int64) stay in memory."""
        if self.held <= self.budget + self._stuck or self.folder is None:
            return
        holders = self._holders()
        shapes: dict[pa.Schema, list[tuple[WindowRuns, int]]] = {}
        for holder in holders:
            for at, run in enumerate(holder.runs):
                if run.file is None and run.acc.dtype != object and len(run.keys):
                    shapes.setdefault(_columns(run).schema, []).append((holder, at))
        for schema, found in shapes.items():
            path = os.path.join(self.folder, f"windows-{os.getpid()}-{next(self._files)}.arrow")
            with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
                for holder, at in found:
                    writer.write_batch(_columns(holder.runs[at]))
            with pa.memory_map(path) as source:
                reader = pa.ipc.open_file(source)
                mapped = [reader.get_batch(i) for i in range(reader.num_record_batches)]
            self._live[path] = len(found)
            changed: dict[int, tuple[WindowRuns, list[Run]]] = {}
            for (holder, at), batch in zip(found, mapped, strict=True):
                runs = changed.setdefault(id(holder), (holder, list(holder.runs)))[1]
                runs[at] = _from_columns(batch, runs[at].number, path)
            for holder, runs in changed.values():
                holder.runs = tuple(runs)
        self.held = sum(run.held for holder in holders for run in holder.runs)
        self._stuck = self.held
        self.spills += 1

    def _forget(self, runs: Iterable[Run]) -> None:
        """Runs no window holds any more: a file is removed once it holds none that a window
        holds (a snapshot being written still reads a mapped one: the mapping outlives the
        name)."""
        for run in runs:
            if run.file is None or run.file not in self._live:
                continue
            self._live[run.file] -= 1
            if not self._live[run.file]:
                del self._live[run.file]
                with contextlib.suppress(OSError):
                    os.remove(run.file)

    def _drop(self, start: int) -> None:
        self._release(self.windows.pop(start, None))

    def _release(self, holder: WindowRuns | None) -> None:
        """A window (or slice) dropped: its runs' memory and files given back."""
        if holder is not None:
            self.held -= sum(run.held for run in holder.runs)
            self._forget(holder.runs)

    # ---------------------------------------------------------------- snapshots

    def attach(
        self, taken: KeyedSnapshot, checkpoint_id: int, base: int | None, savepoint: bool
    ) -> None:
        """The windows' chain of segments takes a segment: the runs made since ``base``, or
        all."""
        encode = self._frozen()
        ticket = self.chain.snapshot(checkpoint_id, base, savepoint)

        def write(store: SegmentStore, name: str) -> dict[str, Any]:
            return self.chain.write(ticket, store, name, encode)

        taken.attached.append(write)

    def _frozen(self) -> Callable[[int | None], bytes]:
        """What a snapshot holds of the windows (their runs, immutable), and how it is
        encoded as a segment (:func:`~cutline.runtime.eventtime.layouts.encode_runs`)."""
        held, kind = runs_of(self.windows.values()), str(self.aggregation.kind)
        return lambda since: encode_runs(held, since, kind)

    # ----------------------------------------------------------------- firing

    def so_far(self) -> Batch | None:
        found = []
        for window in self.windows.values():
            result = None if window.fired else self._result(window.start)
            if result is not None:
                found.append((window.start, *result))
        return self._batch(found, final=False) if found else None

    def fire(self, due: Iterable[Timer]) -> Batch | None:
        fired: list[tuple[int, pa.Array, np.ndarray]] = []
        keep = self.op.keeps_fired
        for _, _, start in due:
            window = self.windows.get(start)
            if window is None:
                continue
            if window.fired:  # (restored fired for some keys: now for the others)
                if window.waiting is not None:
                    waiting, window.waiting = window.waiting, None
                    result = self._result(start, waiting)
                    if result is not None:
                        fired.append((start, *result))
                continue
            merged = merge_parts([run.part for run in window.runs], self.aggregation.kind)
            if merged is not None:
                fired.append((start, *results_of(merged)))
            if not keep:
                self._drop(start)
                continue
            window.fired = True
            self._keep(start)
            settled = self.chain.settled
            if len({max(run.number, settled) for run in window.runs}) == 1:  # (one class)
                kept = self._merged(list(window.runs), merged)
                window.runs = () if kept is None else (kept,)
        return self._batch(fired) if fired else None


def runs_of(holders: Iterable[WindowRuns]) -> list[RunState]:
    """Windows (or slices) as a snapshot holds them: their runs, immutable."""
    return [
        (w.start, w.fired, w.waiting, [(run.part, run.number) for run in w.runs], w.born)
        for w in holders
    ]


def grouped_runs(
    keys: pa.Array, starts: np.ndarray, values: Any, kind: str, chain: ColumnChain
) -> Iterator[tuple[int, Run]]:
    """(key, window start, value) triples grouped by key and window (or slice): per start,
    its groups as a run of the snapshot the changes now go into."""
    group_keys, group_starts, parts, counts = grouped_parts(keys, starts, values, kind)
    for start in np.unique(group_starts).tolist():
        mask = group_starts == start
        run = Run(
            group_keys.filter(pa.array(mask)),
            parts[mask],
            None if counts is None else counts[mask],
            chain.generation,
        )
        yield start, run


def _columns(run: Run) -> pa.RecordBatch:
    """A run as an Arrow batch (to spill it)."""
    columns = {"k": run.keys, "a": pa.array(run.acc)}
    if run.count is not None:
        columns["c"] = pa.array(run.count)
    return pa.record_batch(columns)


def _from_columns(batch: pa.RecordBatch, number: int, path: str) -> Run:
    """A run spilled to ``path``, its columns mapped from there (zero-copy)."""
    count = batch.column("c").to_numpy() if "c" in batch.schema.names else None
    return Run(batch.column("k"), batch.column("a").to_numpy(), count, number, path)
