"""Join keys as integers, and the pairs of rows with equal ones, on NumPy arrays.

:func:`key_codes` gives the rows of both sides (their key columns, one or more) one integer
per row, equal exactly where the keys are equal, and says which rows have a null in a key
(those never pair, as in SQL; they still group: two rows whose keys are both ``(1, null)``
have the same code, which a session window needs, as ``GROUP BY`` puts nulls together).
:func:`pair_up` gives all pairs of a left and a right row in the same group, and, for an
outer join, the rows of a side that found none.

The codes are made afresh for the rows given (a dictionary encoding of both sides' keys
together): they mean nothing across calls, so a kernel encodes the rows it joins when it
joins them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_BOUND = 2**62
"""Codes of several columns are combined while their product of counts stays below this."""


@dataclass(frozen=True)
class KeyCodes:
    """One integer per row of each side, equal where the keys are (nulls equal to nulls);
    ``count``: the codes are in ``range(count)`` (at most one more than the rows);
    ``*_valid``: the rows without a null in a key, which alone may pair."""

    left: np.ndarray
    right: np.ndarray
    count: int
    left_valid: np.ndarray
    right_valid: np.ndarray


def key_codes(
    left: pa.Table, left_on: Sequence[str], right: pa.Table, right_on: Sequence[str]
) -> KeyCodes:
    """The codes of the keys ``left_on`` of ``left``'s rows and ``right_on`` of ``right``'s
    (as many columns, in the same order; a right key column of another type than the left's
    is cast to it)."""
    n = left.num_rows
    codes = np.zeros(n + right.num_rows, dtype=np.int64)
    valid = np.ones(n + right.num_rows, dtype=bool)
    count = 1
    for left_name, right_name in zip(left_on, right_on, strict=True):
        column = _both(left.column(left_name), right.column(right_name))
        encoded = pc.dictionary_encode(column, null_encoding="encode")
        assert isinstance(encoded, pa.DictionaryArray)
        more = np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
        size = max(1, len(encoded.dictionary))
        if column.null_count:
            valid &= np.asarray(column.is_valid().to_numpy(zero_copy_only=False))
        if count * size >= _BOUND:  # (as few codes as there are distinct keys so far)
            _, codes = np.unique(codes, return_inverse=True)
            count = int(codes.max()) + 1 if len(codes) else 1
        codes = codes * size + more
        count *= size
    if count > len(codes) + 1:  # (codes below the number of rows: a kernel multiplies them)
        _, codes = np.unique(codes, return_inverse=True)
        count = int(codes.max()) + 1 if len(codes) else 1
    return KeyCodes(codes[:n], codes[n:], count, valid[:n], valid[n:])


def _both(left: pa.ChunkedArray | pa.Array, right: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Both sides' key column as one array (dictionaries decoded, the right's in the left's
    type)."""
    parts = []
    for part in (left, right):
        if isinstance(part, pa.ChunkedArray):
            part = part.combine_chunks() if part.num_chunks != 1 else part.chunk(0)
        if pa.types.is_dictionary(part.type):
            part = part.cast(part.type.value_type)
        parts.append(part)
    if parts[1].type != parts[0].type:
        parts[1] = parts[1].cast(parts[0].type)
    return pa.concat_arrays(parts)


def pair_up(
    left: np.ndarray, right: np.ndarray, keep_left: bool = False, keep_right: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """The pairs ``(i, j)`` of a left row ``i`` and a right row ``j`` of the same group
    (``left[i] == right[j] >= 0``; ``-1``: a row that pairs with nothing), every such pair
    once, as two arrays of positions; then, with ``keep_left``, each left row of no pair as
    ``(i, -1)``, and with ``keep_right`` each right row of none as ``(-1, j)``.

    The right rows are sorted by group once; each left row's partners are then a run of them,
    found by counting the rows of each group (groups are numbered densely first if they are
    many more than the rows)."""
    groups = int(max(left.max(initial=0), right.max(initial=0))) + 1
    if groups > 4 * (len(left) + len(right)) + 1024:
        both = np.concatenate([left, right])
        valid = both >= 0
        dense = np.full(len(both), -1, dtype=np.int64)
        _, dense[valid] = np.unique(both[valid], return_inverse=True)
        left, right = dense[: len(left)], dense[len(left) :]
        groups = int(dense.max(initial=0)) + 1
    right_valid = right >= 0
    right_order = np.flatnonzero(right_valid)
    right_order = right_order[np.argsort(right[right_order], kind="stable")]
    right_counts = np.bincount(right[right_valid], minlength=groups)
    right_starts = np.cumsum(right_counts) - right_counts
    left_valid = left >= 0
    grouped = np.where(left_valid, left, 0)
    counts = np.where(left_valid, right_counts[grouped], 0)
    ends = np.cumsum(counts)
    total = int(ends[-1]) if len(ends) else 0
    left_rows = [np.repeat(np.arange(len(left), dtype=np.int64), counts)]
    at = np.arange(total, dtype=np.int64) + np.repeat(
        right_starts[grouped] - (ends - counts), counts
    )
    right_rows = [right_order[at]]
    if keep_left:
        alone = np.flatnonzero(counts == 0)
        left_rows.append(alone)
        right_rows.append(np.full(len(alone), -1, dtype=np.int64))
    if keep_right:
        left_counts = np.bincount(left[left_valid], minlength=groups)
        alone = np.flatnonzero(~right_valid | (left_counts[np.where(right_valid, right, 0)] == 0))
        left_rows.append(np.full(len(alone), -1, dtype=np.int64))
        right_rows.append(alone)
    return (
        np.concatenate(left_rows).astype(np.int64, copy=False),
        np.concatenate(right_rows).astype(np.int64, copy=False),
    )
