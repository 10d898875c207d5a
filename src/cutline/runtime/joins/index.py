"""An index of a side's kept rows by an integer key (:class:`IntKeyIndex`), so that a batch
finds its partners by binary search instead of a hash join over everything kept.

A join on one integer column (the usual key: an id) keeps, beside the rows, their keys sorted
(``int64``; an unsigned 64-bit key is read as the signed integer of the same bits: equal keys
stay equal) and for each the row it is of. A batch's rows then find the kept rows of their
key with two ``np.searchsorted`` each, ``O(n log m)``; the batch's own keys are merged in
(sorted, then ``np.insert``: a copy of the index, no hashing of it). A hash join would build
or probe a hash table of every kept row for every batch: the regular join, whose state only
grows, would slow down as it grows.

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
    """The kept rows of one side, by their integer key: ``keys`` sorted, ``rows[i]`` the row
    (its position among the kept rows) whose key is ``keys[i]``."""

    def __init__(self) -> None:
        self.keys = np.zeros(0, np.int64)
        self.rows = np.zeros(0, np.int64)

    def add(self, keys: np.ndarray, nulls: np.ndarray, first_row: int) -> None:
        """Index rows ``first_row, first_row + 1, ...`` whose keys are ``keys`` (those where
        ``nulls`` is true left out)."""
        rows = np.arange(first_row, first_row + len(keys), dtype=np.int64)
        if nulls.any():
            keys, rows = keys[~nulls], rows[~nulls]
        order = np.argsort(keys, kind="stable")
        keys, rows = keys[order], rows[order]
        at = np.searchsorted(self.keys, keys, side="right")
        self.keys = np.insert(self.keys, at, keys)
        self.rows = np.insert(self.rows, at, rows)

    def keep(self, mask: np.ndarray) -> None:
        """The kept rows became those where ``mask`` (over the old rows) is true, renumbered
        in order."""
        staying = mask[self.rows]
        renumbered = np.cumsum(mask) - 1
        self.keys = self.keys[staying]
        self.rows = renumbered[self.rows[staying]]

    def pairs(self, keys: np.ndarray, nulls: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every (position in ``keys``, kept row) of equal keys (none for a null)."""
        order = np.argsort(keys, kind="stable")  # sorted queries search faster
        wanted = keys[order]
        start = np.searchsorted(self.keys, wanted, side="left")
        end = np.searchsorted(self.keys, wanted, side="right")
        counts = end - start
        counts[nulls[order]] = 0
        total = int(counts.sum())
        if not total:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        ours = np.repeat(order.astype(np.int64, copy=False), counts)
        # the i-th candidate of query q is kept position start[q] + (i - first[q])
        first = np.cumsum(counts) - counts
        positions = np.arange(total, dtype=np.int64) + np.repeat(start - first, counts)
        return ours, self.rows[positions]
