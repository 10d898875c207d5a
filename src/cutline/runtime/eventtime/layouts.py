"""The two layouts of what a window operator keeps, and how each is read as the other.

A window operator (:mod:`cutline.runtime.eventtime`) keeps its windows in one of two layouts,
chosen by the state backend it **runs** with:

* **keyed** (the disk backend's, and the memory backend's for a user's function or a key
  function): keyed state ``windows``, per key ``{window start: (accumulator, fired)}``, or
  for session windows a sorted tuple of ``(start, end, accumulator, fired)``. A built-in's
  accumulator is its count, sum, least or greatest value, or for ``mean`` ``(sum, count)``.
* **columnar** (the memory backend's, for a built-in of a key column), beside the (empty)
  keyed state in the handle's extra fields: ``panes``, per window ``(start, keys,
  accumulators, counts, fired)`` (``counts`` only for a mean; ``fired`` one flag for the
  window, or one per key), or ``sessions``, one row per open session (``keys``, ``start``,
  ``end``, ``acc``, ``count``, ``fired``).

A checkpoint or savepoint written under one backend is restored under the other: the
operator reads whichever layout it finds and keeps its own. The functions here turn one into
the other; the checkpoint reader shows both as the keyed layout. Nothing here knows a backend.
"""

from __future__ import annotations

import pickle
from collections.abc import Hashable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

WINDOWS = "windows"
"""The name of the keyed state of the keyed layout."""

PaneParts = tuple[int, pa.Array, np.ndarray, np.ndarray | None, np.ndarray]
"""One window of the columnar layout: its start, its keys, their accumulators, their counts (a
mean's), and per key whether it fired."""


def fired_flags(fired: Any, keys: int) -> np.ndarray:
    """A pane's ``fired`` (one flag for the window, or one per key) as one flag per key."""
    if isinstance(fired, bool | np.bool_):
        return np.full(keys, bool(fired))
    return np.asarray(fired, dtype=bool)


def columnar_size(part: Mapping[str, Any]) -> int:
    """Bytes of the windows a keyed state handle keeps as columns (inside the subtask's state
    file, not in segments); 0 for the keyed layout."""
    columns = [part[name] for name in ("panes", "sessions") if part.get(name) is not None]
    return len(pickle.dumps(columns, protocol=5)) if columns else 0


def panes_as_windows(panes: Iterable[tuple[Any, ...]]) -> dict[Hashable, dict[int, Any]]:
    """Columnar windows (``panes`` of a handle) in the keyed layout: per key, ``{window start:
    (accumulator, fired)}``."""
    windows: dict[Hashable, dict[int, Any]] = {}
    for start, keys, acc, count, fired in panes:
        values = (
            acc.tolist() if count is None else list(zip(acc.tolist(), count.tolist(), strict=True))
        )
        flags = fired_flags(fired, len(keys)).tolist()
        for key, value, flag in zip(keys.to_pylist(), values, flags, strict=True):
            windows.setdefault(key, {})[start] = (value, flag)
    return windows


def session_rows_as_windows(rows: Mapping[str, Any]) -> dict[Hashable, tuple[Any, ...]]:
    """Columnar sessions (``sessions`` of a handle) in the keyed layout: per key, its sessions
    ``(start, end, accumulator, fired)``, sorted."""
    accs = rows["acc"].tolist()
    if rows.get("count") is not None:
        accs = list(zip(accs, rows["count"].tolist(), strict=True))
    found: dict[Hashable, list[tuple[int, int, Any, bool]]] = {}
    for key, start, end, acc, fired in zip(
        rows["keys"].to_pylist(),
        rows["start"].tolist(),
        rows["end"].tolist(),
        accs,
        rows["fired"].tolist(),
        strict=True,
    ):
        found.setdefault(key, []).append((start, end, acc, bool(fired)))
    return {key: tuple(sorted(sessions)) for key, sessions in found.items()}


def windows_as_panes(
    entries: Iterable[tuple[Hashable, Mapping[int, tuple[Any, bool]]]], mean: bool
) -> Iterator[PaneParts]:
    """Keyed-layout windows (``(key, {start: (accumulator, fired)})``) as columnar panes, one
    per window start."""
    by_start: dict[int, tuple[list[Any], list[Any], list[bool]]] = {}
    for key, windows in entries:
        for start, (acc, fired) in windows.items():
            keys, accs, flags = by_start.setdefault(start, ([], [], []))
            keys.append(key)
            accs.append(acc)
            flags.append(bool(fired))
    for start, (keys, accs, flags) in sorted(by_start.items()):
        yield (start, pa.array(keys), *_accumulators(accs, mean), np.array(flags, dtype=bool))


def windows_as_session_rows(
    entries: Iterable[tuple[Hashable, Iterable[tuple[int, int, Any, bool]]]], mean: bool
) -> dict[str, Any] | None:
    """Keyed-layout sessions (``(key, ((start, end, accumulator, fired), ...))``) as the
    columnar layout's rows; ``None``: there are none."""
    keys: list[Any] = []
    sessions: list[tuple[int, int, Any, bool]] = []
    for key, found in entries:
        for session in found:
            keys.append(key)
            sessions.append(session)
    if not keys:
        return None
    starts, ends, accs, flags = zip(*sessions, strict=True)
    acc, count = _accumulators(list(accs), mean)
    return {
        "keys": pa.array(keys),
        "start": np.array(starts, dtype=np.int64),
        "end": np.array(ends, dtype=np.int64),
        "acc": acc,
        "count": count,
        "fired": np.array(flags, dtype=bool),
    }


def _accumulators(accs: list[Any], mean: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """Keyed-layout accumulators as the columnar layout's: a mean's ``(sum, count)`` pairs as
    two columns."""
    if not mean:
        return numbers(accs), None
    return numbers([a[0] for a in accs]), numbers([a[1] for a in accs])


def numbers(values: list[Any]) -> np.ndarray:
    """Accumulators as the columnar layout keeps them: int64 while every one is an integer
    that fits, Python ints (an object array) for larger ones, else float64."""
    if all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in values):
        if all(-(2**63) <= v < 2**63 for v in values):
            return np.array(values, dtype=np.int64)
        return np.array([int(v) for v in values], dtype=object)
    return np.array(values, dtype=np.float64)
