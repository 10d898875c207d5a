"""Sliding windows by slicing: each record goes into one **slice**, and a window's result is
the merge of its slices' when it fires.

``Sliding(size, every=slide)`` puts a record into ``size / slide`` windows. Time cut into
slices of ``gcd(size, slide)`` ms (aligned as the windows are) gives every window as whole
slices, and every slice in the same windows, so a record is merged into one slice instead of
into each of its windows; a window merges its ``size / gcd`` slices once, when it fires (the
idea of Flink's sliced window aggregation, and of "Cutty" and "Scotty" before it). A built-in
merges: counts and sums add, the least of the least values is the least, a mean adds its
sums and its counts.

The functions here are pure: what a slice is, which windows hold it, and how parts of
windows (slices, or windows restored whole) merge per key.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cutline.runtime.eventtime.aggregations import SAFE, UFUNCS, adds, largest
from cutline.runtime.eventtime.assigners import Sliding

Part = tuple[pa.Array, np.ndarray, np.ndarray | None]
"""Keys, their accumulators, and (a mean's) their counts: a slice, or a window, as columns."""


def slice_width(assigner: Sliding) -> int:
    """The length of a slice: the greatest common divisor of the size and the slide."""
    size: int = assigner.size
    return math.gcd(size, assigner.every)


def slices_of(assigner: Sliding, ts: np.ndarray) -> np.ndarray:
    """The start of each timestamp's slice."""
    width = slice_width(assigner)
    starts: np.ndarray = ts - np.mod(ts - assigner.offset, width)
    return starts


Times = TypeVar("Times", int, np.ndarray)


def last_window_of(assigner: Sliding, start: Times) -> Times:
    """The start of the last window that holds the slice (or timestamp) at ``start`` (or at
    each of an array of them)."""
    every: int = assigner.every
    offset: int = assigner.offset
    last: Times = start - (start - offset) % every
    return last


def slices_in(assigner: Sliding, window: int) -> range:
    """The starts of the slices of the window starting at ``window``."""
    return range(window, window + assigner.size, slice_width(assigner))


def merge_parts(parts: Sequence[Part], kind: str) -> Part | None:
    """Parts of one window merged per key (built-in ``kind``); ``None``: no key in any."""
    parts = [part for part in parts if len(part[0])]
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    first = parts[0][0].type
    keys = pa.concat_arrays([part[0].cast(first) for part in parts])
    accs = [part[1] for part in parts]
    common = np.result_type(*(a.dtype for a in accs))
    acc = np.concatenate([a.astype(common, copy=False) for a in accs])
    encoded = pc.dictionary_encode(keys)
    codes = np.asarray(encoded.indices.to_numpy(zero_copy_only=False))
    order = np.argsort(codes, kind="stable")
    codes = codes[order]
    at = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
    acc = acc[order]
    if adds(kind) and acc.dtype.kind in "iu" and largest(acc) >= SAFE // len(parts):
        acc = acc.astype(object)  # (Python ints: no overflow)
    merged = UFUNCS[kind].reduceat(acc, at)
    count = None
    if parts[0][2] is not None:
        counts = np.concatenate([part[2] for part in parts if part[2] is not None])
        count = np.add.reduceat(counts[order], at)
    return encoded.dictionary.take(pa.array(codes[at])), merged, count


def window_result(parts: Sequence[Part], kind: str) -> tuple[pa.Array, np.ndarray] | None:
    """Parts of one window merged per key (built-in ``kind``), as its results: each key's
    accumulator (a mean's sum divided by its count); ``None``: no key in any."""
    merged = merge_parts(parts, kind)
    return None if merged is None else results_of(merged)


def results_of(part: Part) -> tuple[pa.Array, np.ndarray]:
    """A window's keys and results, of its columns: each key's accumulator (a mean's sum
    divided by its count)."""
    keys, acc, count = part
    if count is not None:  # (a mean)
        means: np.ndarray = acc.astype(float) / count
        return keys, means
    return keys, acc


COUNTED = 200_000
""":func:`distinct_keys` counts exactly up to this many keys in all."""


def distinct_keys(windows: Iterable[list[pa.Array]]) -> int:
    """The distinct keys of each window (given as the keys of its parts), added up: exact
    while the parts hold at most :data:`COUNTED` keys in all, else each window's largest
    part's, a lower bound (counting the keys of windows of millions would cost as much as
    merging them)."""
    found = [[keys for keys in parts if len(keys)] for parts in windows]
    exact = sum(len(keys) for parts in found for keys in parts) <= COUNTED
    count = 0
    for parts in found:
        if not parts:
            continue
        if len(parts) == 1 or not exact:
            count += max(len(keys) for keys in parts)
        else:
            first = parts[0].type
            count += len(pc.unique(pa.concat_arrays([k.cast(first) for k in parts])))
    return count


def restrict(part: Part, keys: pa.Array) -> Part:
    """The rows of ``part`` whose key is one of ``keys``."""
    if keys.type != part[0].type:
        keys = keys.cast(part[0].type)
    mask = np.asarray(pc.is_in(part[0], value_set=keys).to_numpy(zero_copy_only=False))
    count = part[2]
    return (
        part[0].filter(pa.array(mask)),
        part[1][mask],
        None if count is None else count[mask],
    )
