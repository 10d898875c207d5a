"""An index of a side's kept rows by an integer key (:class:`IntKeyIndex`), so that a batch
finds its partners by binary search instead of a hash join over everything kept.

A join on one integer column (the usual key: an id) keeps, beside the rows, their keys and
times sorted by key, then time (``int64``; an unsigned 64-bit key is read as the signed
integer of the same bits: equal keys stay equal) and for each the row it is of. A batch's
rows then find the kept rows of their key *and* of the times they can pair with by binary
search (:func:`search`), ``O(n log m)``, and no kept row outside those times is even looked
at (an interval join whose kept rows span more time than its interval does not pay for
them). The batch's own keys are merged in (sorted, then ``np.insert``: a copy of the index,
no hashing of it). A hash join would build or probe a hash table of every kept row for every
batch: the regular join, whose state only grows, would slow down as it grows.

Rows whose key is null are not in the index (they pair with nothing).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def int_codes(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The values of an integer column as ``int64`` (unsigned ones bit for bit), and which are
    null (their value then is meaningless)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    nulls = (
        np.asarray(pc.is_null(column).to_numpy(zero_copy_only=False))
        if column.null_count
        else np.zeros(len(column), np.bool_)
    )
    if column.null_count:
        column = column.fill_null(0)
    values = np.asarray(column.to_numpy())
    if values.dtype == np.uint64:
        return values.view(np.int64), nulls
    return values.astype(np.int64, copy=False), nulls


class IntKeyIndex:
    """The kept rows of one side, by their integer key and time: ``keys`` and ``times``
    sorted by key, then time, ``rows[i]`` the row (its position among the kept rows) whose
    key and time these are."""

    def __init__(self) -> None:
        self.keys = np.zeros(0, np.int64)
        self.times = np.zeros(0, np.int64)
        self.rows = np.zeros(0, np.int64)

    def add(self, keys: np.ndarray, nulls: np.ndarray, times: np.ndarray, first_row: int) -> None:
        """Index rows ``first_row, first_row + 1, ...`` whose keys are ``keys`` and times
        ``times`` (those where ``nulls`` is true left out)."""
        rows = np.arange(first_row, first_row + len(keys), dtype=np.int64)
        if nulls.any():
            keys, times, rows = keys[~nulls], times[~nulls], rows[~nulls]
        order = np.lexsort((times, keys))
        keys, times, rows = keys[order], times[order], rows[order]
        # where each goes among the old (in order: they are sorted), then among all
        at = search(self.keys, self.times, keys, times, "right") + np.arange(len(keys))
        old = np.ones(len(self.keys) + len(keys), np.bool_)
        old[at] = False
        self.keys = _merged(self.keys, keys, at, old)
        self.times = _merged(self.times, times, at, old)
        self.rows = _merged(self.rows, rows, at, old)

    def keep(self, mask: np.ndarray) -> None:
        """The kept rows became those where ``mask`` (over the old rows) is true, renumbered
        in order."""
        staying = mask[self.rows]
        renumbered = np.cumsum(mask) - 1
        self.keys = self.keys[staying]
        self.times = self.times[staying]
        self.rows = renumbered[self.rows[staying]]

    def pairs(
        self,
        keys: np.ndarray,
        nulls: np.ndarray,
        low: np.ndarray | None = None,
        high: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Every (position ``q`` in ``keys``, kept row) of equal keys and a kept time from
        ``low[q]`` to ``high[q]`` (inclusive; ``None``: any); none for a null key."""
        order = np.argsort(keys)  # sorted queries search faster
        wanted = keys[order]
        first = np.searchsorted(self.keys, wanted, side="left")
        after = np.searchsorted(self.keys, wanted, side="right")
        start = first if low is None else in_run(self.times, first, after, low[order], "left")
        end = after if high is None else in_run(self.times, first, after, high[order], "right")
        counts = np.maximum(end - start, 0)
        counts[nulls[order]] = 0
        total = int(counts.sum())
        if not total:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        ours = np.repeat(order.astype(np.int64, copy=False), counts)
        # the i-th partner of query q is at kept position start[q] + (i - before[q])
        before = np.cumsum(counts) - counts
        positions = np.arange(total, dtype=np.int64) + np.repeat(start - before, counts)
        return ours, self.rows[positions]


def search(
    keys: np.ndarray, times: np.ndarray, key: np.ndarray, time: np.ndarray, side: str
) -> np.ndarray:
    """``np.searchsorted`` of the pairs ``(key[i], time[i])`` in the pairs ``(keys, times)``
    sorted by key, then time: where each would go, before the equal pairs (``side="left"``)
    or after them (``"right"``)."""
    first = np.searchsorted(keys, key, side="left")
    after = np.searchsorted(keys, key, side="right")
    return in_run(times, first, after, time, side)


def in_run(
    times: np.ndarray, first: np.ndarray, after: np.ndarray, time: np.ndarray, side: str
) -> np.ndarray:
    """Where each ``time[i]`` would go in the sorted run ``times[first[i]:after[i]]``, as
    ``np.searchsorted`` says: a binary search of all at once, a step per halving of the
    longest run."""
    lo, hi = first.copy(), after.copy()
    right = side == "right"
    active = np.flatnonzero(lo < hi)
    while len(active):
        a, b = lo[active], hi[active]
        mid = (a + b) // 2
        goes_after = times[mid] <= time[active] if right else times[mid] < time[active]
        lo[active] = np.where(goes_after, mid + 1, a)
        hi[active] = np.where(goes_after, b, mid)
        active = active[lo[active] < hi[active]]
    return lo


def _merged(old: np.ndarray, new: np.ndarray, at: np.ndarray, is_old: np.ndarray) -> np.ndarray:
    """``old`` with ``new`` inserted so that ``new[i]`` ends at position ``at[i]``."""
    out = np.empty(len(is_old), old.dtype)
    out[at] = new
    out[is_old] = old
    return out
