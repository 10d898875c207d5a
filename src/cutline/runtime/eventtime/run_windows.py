"""Windows by their start (tumbling, sliding) of a built-in on the disk backend, kept as **runs** (the write path of a
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
for the record's key: its result over every run, restricted to the keys that came.

:class:`Runs` is this storage; :class:`RunWindows` is it under a bucketing (:mod:`.bucketing`):
tumbling windows, each its one slice (and, as
:class:`~cutline.runtime.eventtime.sliced_runs.SlicedRuns`, sliding windows' shared slices,
spilled and compacted as windows' runs are).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from cutline.runtime.eventtime.aggregations import grouped_parts
from cutline.runtime.eventtime.assigners import Session
from cutline.runtime.eventtime.bucketing import Bucketing, OneSlice
from cutline.runtime.eventtime.by_start import Result, WindowsByStart, joined
from cutline.runtime.eventtime.layouts import RunState, Slicing, WindowParts, encode_runs
from cutline.runtime.eventtime.slicing import (
    Part,
    merge_parts,
    restrict,
    results_of,
    window_result,
)
from cutline.runtime.eventtime.store import StoreContext
from cutline.runtime.state.columns import ColumnChain
from cutline.runtime.state.spill import SpillFiles

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


class Runs:
    """The storage of windows (and slices) by their start as runs, on the disk backend (see
    the module): a piece is a :class:`WindowRuns`."""

    def __init__(self, context: StoreContext) -> None:
        self.kind = str(context.aggregation.kind)
        self.chain = ColumnChain(context.state)
        folder = context.backend.path
        self.files = None if folder is None else SpillFiles(folder, f"windows-{os.getpid()}")
        """Where runs are spilled (``None``: they stay in memory)."""
        self.budget = context.state.memory // 2
        """Bytes of runs held in memory beyond which they are spilled."""
        self.held = 0
        """Bytes of the live windows' runs held in memory."""
        self._stuck = 0
        """Bytes of runs that stayed in memory at the last spill (they cannot be spilled)."""

    # ------------------------------------------------------------------ pieces

    def restored(self, start: int, parts: list[WindowParts]) -> WindowRuns:
        """A restored window, one run (of the old subtasks that held it); fired if any of
        its keys had, the others waiting."""
        keys, acc, count, flags = joined(parts)
        run = Run(keys, acc, count, 0)
        window = WindowRuns(start, (run,), born=0, fired=bool(flags.any()))
        if window.fired and not flags.all():
            window.waiting = keys.filter(pa.array(~flags))
        self.held += run.held
        return window

    def parts(self, piece: WindowRuns) -> list[Part]:
        return [run.part for run in piece.runs]

    def waiting(self, piece: WindowRuns) -> pa.Array | None:
        return piece.waiting

    def empty(self, start: int, like: Result | None) -> WindowRuns:
        return WindowRuns(start, (), born=self.chain.generation)

    def release(self, piece: WindowRuns | None) -> None:
        """A window (or slice) dropped: its runs' memory and files given back."""
        if piece is not None:
            self.held -= sum(run.held for run in piece.runs)
            self._forget(piece.runs)

    # ---------------------------------------------------------------- results

    def result(
        self,
        piece: WindowRuns,
        keys: pa.Array | None = None,
        positions: np.ndarray | None = None,
    ) -> Result | None:
        """The result per key (of ``keys`` only) of the window's runs (``positions`` unused:
        runs are not looked up)."""
        parts = self.parts(piece)
        if keys is not None:
            parts = [restrict(part, keys) for part in parts]
        return window_result(parts, self.kind)

    def fire(self, piece: WindowRuns, keep: bool) -> Result | None:
        """The window's runs merge per key into its result; kept fired, they are kept as that
        one run if no later incremental checkpoint needs them apart."""
        merged = merge_parts([run.part for run in piece.runs], self.kind)
        if keep:
            settled = self.chain.settled
            if len({max(run.number, settled) for run in piece.runs}) == 1:  # (one class)
                kept = self._merged(list(piece.runs), merged)
                piece.runs = () if kept is None else (kept,)
        return None if merged is None else results_of(merged)

    # ---------------------------------------------------------------- records

    def merge(
        self,
        into: dict[int, WindowRuns],
        add: Callable[[WindowRuns], None],
        keys: pa.Array,
        starts: np.ndarray,
        values: Any,
    ) -> list[tuple[WindowRuns, pa.Array, np.ndarray | None]]:
        """(key, start, value) triples grouped by key and start, each start's groups appended
        to its window (or slice) in ``into`` as a run (new ones made and given to ``add``):
        per start, its window, and the keys that came."""
        found: list[tuple[WindowRuns, pa.Array, np.ndarray | None]] = []
        for start, run in grouped_runs(keys, starts, values, self.kind, self.chain):
            self.held += run.held
            piece = into.get(start)
            if piece is None:
                piece = WindowRuns(start, (run,), born=run.number)
                add(piece)
            else:
                self._append(piece, run)
            found.append((piece, run.keys, None))
        return found

    # -------------------------------------------------------- compaction, spills

    def settle(self, pieces: Callable[[], list[WindowRuns]]) -> None:
        """Beyond the budget, the runs held in memory are spilled (:meth:`_spill_if_full`)."""
        self._spill_if_full(pieces)

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
        part = part or merge_parts([run.part for run in runs], self.kind)
        if part is None:
            return None
        merged = Run(*part, number=max(run.number for run in runs))
        self.held += merged.held - sum(run.held for run in runs)
        self._forget(runs)
        return merged

    def _spill_if_full(self, pieces: Callable[[], list[WindowRuns]]) -> None:
        """Beyond the budget (over what could not be spilled before), every run held in
        memory is written to the local folder and mapped back: one file per spill (and per
        shape of run), whatever the number of runs, so that a subtask holds few files and
        mappings. Runs of Python ints (sums beyond int64) stay in memory."""
        if self.held <= self.budget + self._stuck or self.files is None:
            return
        holders = pieces()
        shapes: dict[pa.Schema, list[tuple[WindowRuns, int]]] = {}
        for holder in holders:
            for at, run in enumerate(holder.runs):
                if run.file is None and run.acc.dtype != object and len(run.keys):
                    shapes.setdefault(_columns(run).schema, []).append((holder, at))
        for found in shapes.values():
            path, mapped = self.files.write([_columns(holder.runs[at]) for holder, at in found])
            changed: dict[int, tuple[WindowRuns, list[Run]]] = {}
            for (holder, at), batch in zip(found, mapped, strict=True):
                runs = changed.setdefault(id(holder), (holder, list(holder.runs)))[1]
                runs[at] = _from_columns(batch, runs[at].number, path)
            for holder, runs in changed.values():
                holder.runs = tuple(runs)
        self.held = sum(run.held for holder in holders for run in holder.runs)
        self._stuck = self.held

    def _forget(self, runs: Iterable[Run]) -> None:
        """Runs no window holds any more: their spill files are told (one is removed once it
        holds none that a window holds)."""
        if self.files is not None:
            for run in runs:
                if run.file is not None:
                    self.files.release(run.file)

    # ---------------------------------------------------------------- snapshots

    def encoder(
        self, windows: Iterable[WindowRuns], slices: Iterable[WindowRuns], slicing: Slicing | None
    ) -> Callable[[int | None], bytes]:
        """What a snapshot holds of the windows and slices (their runs, immutable), and how it
        is encoded as a segment (:func:`~cutline.runtime.eventtime.layouts.encode_runs`)."""
        held, sliced, kind = runs_of(windows), runs_of(slices), self.kind
        return lambda since: encode_runs(held, since, kind, sliced, slicing)


class RunWindows(WindowsByStart[WindowRuns]):
    """Windows by their start computing a built-in aggregate (``count``, ``sum``, ``min``,
    ``max``, ``mean``) on the disk backend, as runs (:class:`Runs`) under a ``bucketing``:
    tumbling windows (:class:`~cutline.runtime.eventtime.bucketing.OneSlice`) unless told
    otherwise."""

    def __init__(self, context: StoreContext, bucketing: Bucketing | None = None) -> None:
        assert not isinstance(context.assigner, Session)
        self.runs = Runs(context)
        super().__init__(context, self.runs, bucketing or OneSlice(context.assigner))

    @property
    def held(self) -> int:
        """Bytes of the live windows' runs held in memory."""
        return self.runs.held

    @property
    def budget(self) -> int:
        """Bytes of runs held in memory beyond which they are spilled."""
        return self.runs.budget

    @property
    def spills(self) -> int:
        """How many times runs were spilled (files written)."""
        return 0 if self.runs.files is None else self.runs.files.spills


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
