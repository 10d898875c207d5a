"""The store of windows by their start (tumbling and sliding windows of a built-in): one
*bucketing* (:mod:`.bucketing`: which piece a record goes into, which pieces a window is made
of) over one *storage* (:class:`Storage`: what a piece holds and how it merges: columns in
memory, :mod:`.columnar_windows`; runs on disk, :mod:`.run_windows`), held together by
:class:`WindowsByStart`: what every window by its start does alike, whatever it is kept in.

A window fires through one timer for all its keys (the timer's key is ``None``, its namespace
the window's start), is kept fired for the allowed lateness, then dropped; a slice shared by
windows is dropped when the last of them is past. A record within the lateness of a fired
window makes it fire again for the record's key. What fires goes out as one batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cutline.runtime.eventtime.assigners import Session, end_of
from cutline.runtime.eventtime.bucketing import Bucketing
from cutline.runtime.eventtime.layouts import (
    WINDOWS,
    Slicing,
    WindowParts,
    keyed_as_columns,
    read_windows,
)
from cutline.runtime.eventtime.slicing import Part, distinct_keys, restrict, window_result
from cutline.runtime.eventtime.store import StoreContext
from cutline.runtime.eventtime.timers import Timer
from cutline.runtime.operators import Batch
from cutline.runtime.state.backend import KeyedSnapshot
from cutline.runtime.state.columns import COLUMNS, ColumnChain
from cutline.runtime.state.segments import SegmentStore

Result = tuple[pa.Array, np.ndarray]
"""A window's (or piece's) keys and their results."""


class Piece(Protocol):
    """What a storage keeps of one window or slice: its start, whether it fired (and is kept
    for the allowed lateness), the keys it has not fired for yet (restored so; in the
    storage's own form), and the snapshot that made it."""

    start: int
    fired: bool
    waiting: Any
    born: int


P = TypeVar("P", bound=Piece)


class Storage(Protocol[P]):
    """How the pieces of windows by their start are kept, whatever the bucketing: what a
    piece holds, how records merge into it, its results, and how pieces are checkpointed."""

    chain: ColumnChain
    """The pieces' chain of segments (checkpoints beside the keyed state)."""
    kind: str
    """The built-in, as a checkpoint of slices names it."""

    def merge(
        self,
        into: dict[int, P],
        add: Callable[[P], None],
        keys: pa.Array,
        starts: np.ndarray,
        values: Any,
    ) -> list[tuple[P, pa.Array, np.ndarray | None]]:
        """(key, piece start, value) triples merged into the pieces ``into`` (a piece new here
        is given to ``add``): per piece they went into, the keys that came, and where they are
        in it (``None``: the storage cannot tell, or the piece is new)."""
        ...

    def restored(self, start: int, parts: list[WindowParts]) -> P:
        """A restored window, of its parts (one per old subtask that held it)."""
        ...

    def parts(self, piece: P) -> list[Part]:
        """What a piece holds, as parts that merge per key."""
        ...

    def result(
        self, piece: P, keys: pa.Array | None = None, positions: np.ndarray | None = None
    ) -> Result | None:
        """A piece's results per key: of ``keys`` only (``positions``: where they are in it,
        when known), or of all; ``None``: it holds none (but given ``positions``)."""
        ...

    def fire(self, piece: P, keep: bool) -> Result | None:
        """A piece that is a whole window fires: its results (``None``: none); ``keep``: it is
        kept fired (what it holds may be compacted)."""
        ...

    def waiting(self, piece: P) -> pa.Array | None:
        """The keys a window restored fired for some keys has not fired for (``None``: none)."""
        ...

    def empty(self, start: int, like: Result | None) -> P:
        """A window without parts of its own (it fired, and keeps the flag); ``like``: its
        result (the type of its keys)."""
        ...

    def release(self, piece: P | None) -> None:
        """A piece dropped: what it held given back."""
        ...

    def settle(self, pieces: Callable[[], list[P]]) -> None:
        """After records came (or a restore): the pieces held (``pieces()``, every one) may be
        moved (spilled)."""
        ...

    def encoder(
        self, windows: Iterable[P], slices: Iterable[P], slicing: Slicing | None
    ) -> Callable[[int | None], bytes]:
        """What a snapshot holds of the pieces (shared from now on), and how it is encoded
        as a segment of the chain (all of it, or what changed after a snapshot)."""
        ...


class WindowsByStart(Generic[P]):
    """Windows by their start (tumbling or sliding) of a built-in: a ``bucketing`` over a
    ``storage``. It holds the windows' own pieces (``windows``: a tumbling window's records,
    or a sliding window's restored whole, and once fired its flag) and the slices shared by
    windows (``slices``), registers their timers, and fires, keeps, drops and counts them."""

    def __init__(self, context: StoreContext, storage: Storage[P], bucketing: Bucketing) -> None:
        assert not isinstance(context.assigner, Session)
        self.context = context
        self.storage = storage
        self.bucketing = bucketing
        self.assigner = context.assigner
        self.lateness = context.lateness
        self.output = context.output
        self.kind = str(context.aggregation.kind)
        self.timers = context.timers
        self.windows: dict[int, P] = {}
        """Each window's own piece, by its start."""
        self.slices: dict[int, P] = {}
        """The slices windows share, by their start."""
        self._scheduled: set[int] = set()
        """The windows with a timer to fire (each once): those not fired yet, or fired for
        some of their keys only (restored so)."""
        for start, parts in restored_parts(context, storage.chain, bucketing.adopts).items():
            self._add_window(storage.restored(start, parts))
        storage.settle(self._holders)

    def _holders(self) -> list[P]:
        """Every piece held (the windows', the slices')."""
        return [*self.windows.values(), *self.slices.values()]

    # ------------------------------------------------------------------ timers

    def _add_window(self, piece: P) -> None:
        """A window's own piece is held, with its timers."""
        self.windows[piece.start] = piece
        if piece.fired:
            self._keep(piece.start)
        if not piece.fired or piece.waiting is not None:
            self._schedule(piece.start)

    def _add_slice(self, piece: P) -> None:
        """A new slice: its windows that are not past nor fired fire at their ends; it is
        dropped when the last of them is past."""
        self.slices[piece.start] = piece
        for window in self.bucketing.windows_of(piece.start):
            own = self.windows.get(window)
            if not self.lateness.is_past(end_of(self.assigner, window)) and (
                own is None or not own.fired
            ):
                self._schedule(window)
        past = self.bucketing.slice_past(self.lateness, piece.start)
        self.timers.parts.add(past, None, piece.start)

    def _schedule(self, window: int) -> None:
        """The window (of all its keys: the timer's key is ``None``) fires when the watermark
        reaches its last millisecond (once)."""
        if window not in self._scheduled:
            self._scheduled.add(window)
            self.timers.to_fire.add(end_of(self.assigner, window) - 1, None, window)

    def _keep(self, window: int) -> None:
        """The fired window is kept for the allowed lateness, then dropped."""
        past = self.lateness.cleanup_time(end_of(self.assigner, window))
        self.timers.to_drop.add(past, None, window)

    def holds_windows(self) -> bool:
        """Whether a window waits to fire, or a fired window or a slice to be dropped."""
        return bool(self.windows or self.slices or self._scheduled)

    # ---------------------------------------------------------------- results

    def _slices_of(self, window: int) -> list[P]:
        """The slices of the window that are held."""
        slices = self.slices
        return [slices[s] for s in self.bucketing.slices_in(window) if s in slices]

    def _result(self, window: int, keys: pa.Array | None = None) -> Result | None:
        """The window's results per key (of ``keys`` only): its own piece's, merged with its
        slices'; ``None``: it holds none."""
        own = self.windows.get(window)
        slices = self._slices_of(window)
        if not slices:
            return None if own is None else self.storage.result(own, keys)
        parts = [] if own is None else self.storage.parts(own)
        for piece in slices:
            parts += self.storage.parts(piece)
        if keys is not None:
            parts = [restrict(part, keys) for part in parts]
        return window_result(parts, self.kind)

    @property
    def open_windows(self) -> int:
        """The keys of each window not fired yet, added up (exact up to
        :data:`~cutline.runtime.eventtime.slicing.COUNTED` keys in all its parts). Read from
        the thread that reports the figures: it copies what it reads first."""
        scheduled, held, slices = list(self._scheduled), dict(self.windows), dict(self.slices)
        found: list[list[pa.Array]] = []
        for window in scheduled:
            own = held.get(window)
            if own is not None and own.fired:  # (fired for some keys: the others wait)
                waiting = self.storage.waiting(own)
                found.append([] if waiting is None else [waiting])
                continue
            keys = [] if own is None else [part[0] for part in self.storage.parts(own)]
            for start in self.bucketing.slices_in(window):
                if start in slices:
                    keys += [part[0] for part in self.storage.parts(slices[start])]
            found.append(keys)
        return distinct_keys(found)

    # ---------------------------------------------------------------- records

    def add(self, batch: Batch, ts: np.ndarray) -> Batch | None:
        """Records into their pieces; the fired windows (kept for the lateness) they update
        fire again for their keys."""
        placed, shared = self.bucketing.place(self.context, batch, ts)
        if placed is None:
            return None
        into, add = (self.slices, self._add_slice) if shared else (self.windows, self._add_window)
        merged = self.storage.merge(into, add, *placed)
        again: dict[int, list[tuple[pa.Array, np.ndarray | None]]] = {}
        for piece, keys, positions in merged:
            for window in self.bucketing.windows_of(piece.start) if shared else (piece.start,):
                own = self.windows.get(window)
                if own is not None and own.fired:
                    again.setdefault(window, []).append((keys, None if shared else positions))
        self.storage.settle(self._holders)
        fired: list[tuple[int, pa.Array, np.ndarray]] = []
        for window, came in sorted(again.items()):
            result = self._again(window, came)
            if result is not None:
                fired.append((window, *result))
        return self.output.by_start(fired) if fired else None

    def _again(self, window: int, came: list[tuple[pa.Array, np.ndarray | None]]) -> Result | None:
        """A fired window's results for the keys that came (but those it has not fired for
        yet: they fire when the watermark passes its end)."""
        waiting = self.storage.waiting(self.windows[window])
        keys, positions = came[0]
        if len(came) == 1 and positions is not None and not self._slices_of(window):
            # (its own piece, and where they are in it)
            if waiting is not None:
                fresh = pc.invert(pc.is_in(keys, value_set=waiting.cast(keys.type)))
                keys, positions = (
                    keys.filter(fresh),
                    positions[fresh.to_numpy(zero_copy_only=False)],
                )
            return self.storage.result(self.windows[window], keys, positions)
        first = came[0][0].type
        these = pc.unique(pa.concat_arrays([keys.cast(first) for keys, _ in came]))
        if waiting is not None:
            these = these.filter(pc.invert(pc.is_in(these, value_set=waiting.cast(first))))
        return self._result(window, these)

    # ----------------------------------------------------------------- firing

    def so_far(self) -> Batch | None:
        found: list[tuple[int, pa.Array, np.ndarray]] = []
        for window in sorted(self._scheduled):
            own = self.windows.get(window)
            result = None if own is not None and own.fired else self._result(window)
            if result is not None:
                found.append((window, *result))
        return self.output.by_start(found, final=False) if found else None

    def fire(self, due: Iterable[Timer]) -> Batch | None:
        fired: list[tuple[int, pa.Array, np.ndarray]] = []
        keep = self.lateness.keeps_fired
        for _, _, window in due:
            self._scheduled.discard(window)
            own = self.windows.get(window)
            if own is not None and own.fired:  # (restored fired for some keys: the others)
                waiting = self.storage.waiting(own)
                if waiting is not None:
                    own.waiting = None
                    result = self._result(window, waiting)
                    if result is not None:
                        fired.append((window, *result))
                continue
            if self._slices_of(window):
                result = self._result(window)
            elif own is not None:
                result = self.storage.fire(own, keep)
            else:
                continue
            if result is not None:
                fired.append((window, *result))
            if not keep:
                self.storage.release(self.windows.pop(window, None))
                continue
            if own is None:  # (it keeps its fired flag)
                own = self.windows[window] = self.storage.empty(window, result)
            own.fired = True
            self._keep(window)
        return self.output.by_start(fired) if fired else None

    def drop(self, due: Iterable[Timer]) -> None:
        """The fired windows past, and then the slices whose last window is past."""
        for _, _, start in due:
            own = self.windows.get(start)
            if own is not None and own.fired:
                self.storage.release(self.windows.pop(start))
        for _, _, start in self.timers.parts_due(self.lateness.watermark):
            self.storage.release(self.slices.pop(start, None))

    # ---------------------------------------------------------------- snapshots

    def attach(
        self, taken: KeyedSnapshot, checkpoint_id: int, base: int | None, savepoint: bool
    ) -> None:
        """The pieces' chain of segments (:class:`ColumnChain`) takes a segment: what changed
        since ``base``, or all."""
        live = tuple(sorted(self._scheduled | set(self.windows)))
        slicing = self.bucketing.slicing(self.storage.kind, live)
        encode = self.storage.encoder(self.windows.values(), self.slices.values(), slicing)
        chain = self.storage.chain
        ticket = chain.snapshot(checkpoint_id, base, savepoint)

        def write(store: SegmentStore, name: str) -> dict[str, Any]:
            return chain.write(ticket, store, name, encode)

        taken.attached.append(write)


def restored_parts(
    context: StoreContext, chain: ColumnChain, adopts: bool
) -> dict[int, list[WindowParts]]:
    """Every restored window of a columnar layout, per start its parts (one per old subtask
    whose handle held it): those kept as columns, and those the keyed layout wrote, taken out
    of keyed state. Restored at another parallelism, the keys of this subtask's key groups
    only. With ``adopts``, and exactly one handle of exactly this subtask's key groups, later
    checkpoints of ``chain`` may build on the restored chain."""
    parts: dict[int, list[WindowParts]] = {}
    backend, restored = context.backend, context.restored
    mine = backend.key_groups
    store = restored.store
    for handle in restored.handles:
        start, stop = handle.get("key_groups", (0, 0))
        whole = range(start, stop) == mine
        for window_start, keys, acc, count, flags in (
            read_windows(handle, store) if store is not None else ()
        ):
            if not whole:  # rescaled: the keys of my key groups only
                keep = context.records.owned(keys)
                if not keep.any():
                    continue
                keys, acc, flags = keys.filter(pa.array(keep)), acc[keep], flags[keep]
                count = count[keep] if count is not None else None
            parts.setdefault(window_start, []).append((window_start, keys, acc, count, flags))
    table = backend.value_table(WINDOWS)
    keyed = [(key, table.get(key)) for key in list(backend.keys(WINDOWS))]
    for found in keyed_as_columns(keyed, context.aggregation.mean):
        parts.setdefault(found[0], []).append(found)
    for key, _ in keyed:
        table.delete(key)
    checkpoint = restored.checkpoint
    if checkpoint is not None and len(restored.handles) == 1 and not keyed and adopts:
        handle = restored.handles[0]
        if range(*handle.get("key_groups", (0, 0))) == mine and handle.get(COLUMNS):
            chain.adopt(checkpoint, handle[COLUMNS])  # (later ones build on it)
    return parts


def joined(pieces: list[WindowParts]) -> tuple[pa.Array, np.ndarray, np.ndarray | None, np.ndarray]:
    """The parts of one restored window (of old subtasks: disjoint keys) one after another:
    its keys, accumulators, counts (a mean's) and each key's ``fired`` flag."""
    first = pieces[0][1].type
    counts = [piece[3] for piece in pieces if piece[3] is not None]
    return (
        pa.concat_arrays([piece[1].cast(first) for piece in pieces]),
        np.concatenate([piece[2] for piece in pieces]),
        np.concatenate(counts) if counts else None,
        np.concatenate([piece[4] for piece in pieces]),
    )
