"""The two layouts of what a window operator keeps, and how each is read as the other.

A window operator (:mod:`cutline.runtime.eventtime`) keeps its windows in one of two layouts,
chosen by what it computes and the state backend it **runs** with:

* **keyed** (a user's function or a key function, ``early_records``, and the disk backend's
  sessions): keyed state ``windows``, per key ``{window start: (accumulator, fired)}``, or
  for session windows a sorted tuple of ``(start, end, accumulator, fired)``. A built-in's
  accumulator is its count, sum, least or greatest value, or for ``mean`` ``(sum, count)``.
* **columnar** (for a built-in of a key column), beside the (empty) keyed state: per window
  ``(start, keys, accumulators, counts, fired)`` (``counts`` only for a mean; ``fired`` one
  flag for the window, or one per key), or, for sessions, one row per open session
  (``keys``, ``start``, ``end``, ``acc``, ``count``, ``fired``). The disk backend keeps a
  window's columns as **runs** (:mod:`~cutline.runtime.eventtime.run_windows`): several
  parts, each key once in each, that merge per key into the window's columns.

The columnar layout is checkpointed as a chain of segments of its own
(:class:`~cutline.runtime.state.columns.ColumnChain`), named by the handle's ``columns``:
a full segment holds every window, an incremental one only what changed since the checkpoint
it builds on (of each window, the keys whose accumulators changed, or the runs made since; of
sessions, every session of the keys that changed). :func:`read_windows` reads a chain of
either kind of segment, or of both (a chain restored under the other backend goes on), and
:func:`read_session_rows` the sessions' (and both the handles of older checkpoints, which held
the columns themselves).

A checkpoint or savepoint written under one backend is restored under the other: the
operator reads whichever layout it finds and keeps its own. The functions here turn one into
the other; the checkpoint reader shows both as the keyed layout. Nothing here knows a backend.
"""

from __future__ import annotations

import pickle
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cutline.runtime.eventtime.assigners import Sliding
from cutline.runtime.eventtime.slicing import Part, merge_parts, slices_in
from cutline.runtime.state.columns import read_chain
from cutline.runtime.state.segments import SegmentSource

WINDOWS = "windows"
"""The name of the keyed state of the keyed layout."""

WindowParts = tuple[int, pa.Array, np.ndarray, np.ndarray | None, np.ndarray]
"""One window of the columnar layout: its start, its keys, their accumulators, their counts (a
mean's), and per key whether it fired."""


def fired_flags(fired: Any, keys: int) -> np.ndarray:
    """A pane's ``fired`` (one flag for the window, or one per key) as one flag per key."""
    if isinstance(fired, bool | np.bool_):
        return np.full(keys, bool(fired))
    return np.asarray(fired, dtype=bool)


def columnar_size(part: Mapping[str, Any]) -> int:
    """Bytes of the windows a keyed state handle of an older checkpoint keeps as columns
    (inside the subtask's state file, not in segments); 0 for the others."""
    columns = [part[name] for name in ("panes", "sessions") if part.get(name) is not None]
    return len(pickle.dumps(columns, protocol=5)) if columns else 0


COLUMNS_FORMAT = 1

WindowState = tuple[int, pa.Array, np.ndarray, np.ndarray | None, np.ndarray, bool, Any, int]
"""What a snapshot keeps of one window of the columnar layout (arrays it shares, unchanged
from then on): start, keys, accumulators, counts, per key the snapshot that last changed it,
whether the window fired, the positions of its keys not fired yet (``None``: none), and the
snapshot that made the window."""


@dataclass(frozen=True)
class Slicing:
    """What a segment of sliding windows kept as slices (:mod:`.slicing`) says besides them:
    how they merge into windows, and which windows are live (not past)."""

    assigner: Sliding
    kind: str
    live: tuple[int, ...]


def encode_windows(
    panes: list[WindowState],
    since: int | None,
    slices: list[WindowState] | None = None,
    slicing: Slicing | None = None,
) -> bytes:
    """A segment of the columnar windows: every key of every window (``since`` None), or of
    each window the keys changed after snapshot ``since`` (a window made after it: all of
    them, replacing one of the same start the chain held). Every window is named, with or
    without keys: a window the segment does not name was dropped. Sliding windows kept as
    slices: the same of each slice, and ``slicing``."""
    return pickle.dumps(
        {
            "format": COLUMNS_FORMAT,
            "panes": _entries(panes, since),
            "slices": _entries(slices or [], since),
            "slicing": slicing,
        },
        protocol=5,
    )


def _entries(panes: list[WindowState], since: int | None) -> list[tuple[Any, ...]]:
    entries: list[tuple[Any, ...]] = []
    for start, keys, acc, count, version, fired, waiting, born in panes:
        replace = since is None or born > since
        if replace:
            entries.append((start, True, fired, waiting, keys, acc, count))
            continue
        changed = np.flatnonzero(version > since)
        entries.append(
            (
                start,
                False,
                fired,
                waiting,
                keys.take(pa.array(changed)),
                acc[changed],
                None if count is None else count[changed],
            )
        )
    return entries


RunState = tuple[int, bool, Any, list[tuple[Part, int]], int]
"""What a snapshot keeps of one window kept as runs: its start, whether it fired, the keys it
has not fired for yet (``None``: none), its runs with the snapshot each goes into, and the
snapshot that made the window."""


def encode_runs(
    windows: list[RunState],
    since: int | None,
    kind: str,
    slices: list[RunState] | None = None,
    slicing: Slicing | None = None,
) -> bytes:
    """A segment of windows kept as runs (built-in ``kind``): every run of every window
    (``since`` None), or of each window the runs made after snapshot ``since`` (a window made
    after it: all of them, replacing one of the same start the chain held), merged into one
    run per window. Every window is
    named, with or without runs: a window the segment does not name was dropped. Sliding
    windows kept as slices: the same of each slice, and ``slicing``."""
    return pickle.dumps(
        {
            "format": COLUMNS_FORMAT,
            "runs": _run_entries(windows, since, kind),
            "slice_runs": _run_entries(slices or [], since, kind),
            "slicing": slicing,
            "kind": kind,
        },
        protocol=5,
    )


def _run_entries(windows: list[RunState], since: int | None, kind: str) -> list[tuple[Any, ...]]:
    """Of each window, the runs a segment writes, merged into one (each key once)."""
    entries = []
    for start, fired, waiting, runs, born in windows:
        replace = since is None or born > since
        added = [part for part, number in runs if since is None or replace or number > since]
        merged = merge_parts(added, kind) if len(added) > 1 else None
        entries.append((start, replace, fired, waiting, added if merged is None else [merged]))
    return entries


def read_windows(handle: Mapping[str, Any], store: SegmentSource) -> list[WindowParts]:
    """The columnar windows a keyed state handle holds (its chain of segments applied in
    order, whichever columnar layout wrote each; an older checkpoint's handle held them
    itself), each key's ``fired`` flag apart."""
    if handle.get("panes"):
        return [
            (start, keys, acc, count, fired_flags(fired, len(keys)))
            for start, keys, acc, count, fired in handle["panes"]
        ]
    panes: dict[int, _Held] = {}
    slices: dict[int, _Held] = {}
    slicing: Slicing | None = None
    kind = "sum"  # (how runs merge: the chain's runs segments say)
    for data in read_chain(handle, store):
        found = pickle.loads(data)
        if not isinstance(found, dict):
            continue
        if "runs" in found:
            kind = found["kind"]
            panes = _added(panes, found["runs"])
            slices = _added(slices, found.get("slice_runs") or [])
            slicing = found.get("slicing")
        elif "panes" in found:  # (not the sessions' chain)
            panes = _applied(panes, found["panes"], kind)
            slices = _applied(slices, found.get("slices") or [], kind)
            slicing = found.get("slicing")
    parts = {start: _whole(start, held, kind) for start, held in panes.items()}
    if slicing is not None:
        columns = {start: _whole(start, held, kind)[1:4] for start, held in slices.items()}
        for start in slicing.live:
            fired = start in panes and panes[start][1]
            parts[start] = _window_of_slices(slicing, start, parts.get(start), fired, columns)
    return [parts[start] for start in sorted(parts) if len(parts[start][1])]


_Held = tuple[list[Part], bool, pa.Array | None]
"""A window (or slice) as the chain holds it so far: parts that merge per key into its columns
(a columnar window's whole columns, or a window's runs), whether it fired, and the keys it has
not fired for yet (``None``: none)."""


def _applied(held: dict[int, _Held], entries: list[tuple[Any, ...]], kind: str) -> dict[int, _Held]:
    """A segment of the columnar windows (or slices) applied to what the chain held before it
    (its parts merged by built-in ``kind``): the keys it names set to their accumulators (a
    window it replaces, or a new one, whole)."""
    now: dict[int, _Held] = {}
    for start, replace, fired, waiting, keys, acc, count in entries:
        old = None if replace or start not in held else merge_parts(held[start][0], kind)
        if old is not None:
            keys, acc, count = _upsert(*old, keys, acc, count)
        now[start] = ([(keys, acc, count)], fired, _positions(keys, waiting))
    return now


def _added(held: dict[int, _Held], entries: list[tuple[Any, ...]]) -> dict[int, _Held]:
    """A segment of windows kept as runs (:mod:`~cutline.runtime.eventtime.run_windows`)
    applied to what the chain held before it: of each window, its runs added since (a window
    it replaces, or a new one: all of them)."""
    now: dict[int, _Held] = {}
    for start, replace, fired, waiting, runs in entries:
        old = [] if replace or start not in held else held[start][0]
        now[start] = ([*old, *runs], fired, waiting)
    return now


def _positions(keys: pa.Array, waiting: Any) -> pa.Array | None:
    """The keys at a columnar window's ``waiting`` positions (``None``: none)."""
    return None if waiting is None else keys.take(pa.array(np.asarray(waiting, dtype=np.int64)))


def _whole(start: int, held: _Held, kind: str) -> WindowParts:
    """A window as the chain held it, its parts merged per key (built-in ``kind``), each
    key's flag apart."""
    runs, fired, waiting = held
    merged = merge_parts(runs, kind)
    if merged is None:  # (a window without keys)
        merged = (runs[0][0], runs[0][1], runs[0][2]) if runs else (pa.array([]), _NO_ACC, None)
    keys, acc, count = merged
    flags = np.full(len(keys), bool(fired))
    if waiting is not None and len(keys):
        flags[_where(keys, waiting)] = False
    return start, keys, acc, count, flags


def _where(keys: pa.Array, among: pa.Array) -> np.ndarray:
    """Which of ``keys`` are ``among`` those."""
    if among.type != keys.type:
        among = among.cast(keys.type)
    return np.asarray(pc.is_in(keys, value_set=among).to_numpy(zero_copy_only=False))


def _window_of_slices(
    slicing: Slicing,
    start: int,
    pane: WindowParts | None,
    fired: bool,
    slices: Mapping[int, Part],
) -> WindowParts:
    """A live sliding window, whole: what it kept itself (restored whole, or fired) merged
    with its slices; a key only its slices hold has fired if the window has."""
    found = [slices[s][:3] for s in slices_in(slicing.assigner, start) if s in slices]
    own = [] if pane is None else [pane[1:4]]
    merged = merge_parts([*own, *found], slicing.kind)
    if merged is None:
        return pane if pane is not None else (start, pa.array([]), np.zeros(0), None, _NONE)
    keys, acc, count = merged
    flags = np.full(len(keys), fired)
    if pane is not None and len(pane[1]) and not pane[4].all():
        at = np.asarray(
            pc.fill_null(pc.index_in(keys, value_set=pane[1]), -1).to_numpy(zero_copy_only=False)
        )
        own_key = at >= 0
        flags[own_key] = pane[4][at[own_key]]
    return start, keys, acc, count, flags


_NONE = np.zeros(0, dtype=bool)
_NO_ACC = np.zeros(0, dtype=np.int64)


def _upsert(
    keys: pa.Array,
    acc: np.ndarray,
    count: np.ndarray | None,
    new_keys: pa.Array,
    new_acc: np.ndarray,
    new_count: np.ndarray | None,
) -> tuple[pa.Array, np.ndarray, np.ndarray | None]:
    """A window's columns with the changed keys' accumulators set (the keys it had keep
    their places; new ones come after them, in order)."""
    if not len(new_keys):
        return keys, acc, count
    if new_keys.type != keys.type:
        new_keys = new_keys.cast(keys.type)
    found = np.asarray(
        pc.fill_null(pc.index_in(new_keys, value_set=keys), -1).to_numpy(zero_copy_only=False)
    )
    old, new = found >= 0, found < 0
    common = np.result_type(acc.dtype, new_acc.dtype)
    acc = acc.astype(common, copy=True)
    acc[found[old]] = new_acc[old]
    acc = np.concatenate([acc, new_acc[new].astype(common, copy=False)])
    if count is not None and new_count is not None:
        count = count.copy()
        count[found[old]] = new_count[old]
        count = np.concatenate([count, new_count[new]])
    keys = pa.concat_arrays([keys, new_keys.filter(pa.array(new))])
    return keys, acc, count


def encode_session_rows(
    rows: Mapping[str, Any] | None, touched: list[pa.Array], since: int | None
) -> bytes:
    """A segment of the columnar sessions: every row (``since`` None), or every row of the
    keys ``touched`` after snapshot ``since`` (which replace the chain's rows of those keys:
    a key none of whose sessions is left has none)."""
    if since is None:
        return pickle.dumps(
            {"format": COLUMNS_FORMAT, "sessions": rows, "touched": None}, protocol=5
        )
    keys = pc.unique(pa.concat_arrays(touched)) if touched else pa.array([])
    if rows is not None and len(keys):
        if keys.type != rows["keys"].type:
            keys = keys.cast(rows["keys"].type)
        mask = np.asarray(pc.is_in(rows["keys"], value_set=keys).to_numpy(zero_copy_only=False))
        rows = take_rows(rows, mask)
    else:
        rows = None
    return pickle.dumps({"format": COLUMNS_FORMAT, "sessions": rows, "touched": keys}, protocol=5)


def read_session_rows(handle: Mapping[str, Any], store: SegmentSource) -> dict[str, Any] | None:
    """The columnar sessions a keyed state handle holds (its chain applied in order; an older
    checkpoint's handle held them itself); ``None``: none."""
    if handle.get("sessions") is not None:
        return dict(handle["sessions"])
    rows: dict[str, Any] | None = None
    for data in read_chain(handle, store):
        found = pickle.loads(data)
        if not isinstance(found, dict) or "sessions" not in found:
            continue
        touched = found["touched"]
        if touched is None:
            rows = found["sessions"]
            continue
        if rows is not None and len(touched):
            if touched.type != rows["keys"].type:
                touched = touched.cast(rows["keys"].type)
            gone = np.asarray(
                pc.is_in(rows["keys"], value_set=touched).to_numpy(zero_copy_only=False)
            )
            rows = take_rows(rows, ~gone)
        parts = [p for p in (rows, found["sessions"]) if p is not None and len(p["keys"])]
        rows = concat_rows(parts) if parts else None
    return rows if rows is not None and len(rows["keys"]) else None


def take_rows(rows: Mapping[str, Any], mask: np.ndarray) -> dict[str, Any]:
    """The rows of the columnar sessions where ``mask`` holds."""
    return {
        name: (
            None
            if value is None
            else value.filter(pa.array(mask))
            if isinstance(value, pa.Array)
            else value[mask]
        )
        for name, value in rows.items()
    }


def concat_rows(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Rows of the columnar sessions one after another."""
    first = parts[0]
    out: dict[str, Any] = {}
    for name in first:
        values = [p[name] for p in parts]
        if values[0] is None:
            out[name] = None
        elif isinstance(values[0], pa.Array):
            out[name] = pa.concat_arrays([v.cast(values[0].type) for v in values])
        else:
            kinds = {v.dtype for v in values}
            common = values[0].dtype if len(kinds) == 1 else np.result_type(*kinds)
            out[name] = np.concatenate([v.astype(common, copy=False) for v in values])
    return out


def columns_as_keyed(panes: Iterable[tuple[Any, ...]]) -> dict[Hashable, dict[int, Any]]:
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


def keyed_as_columns(
    entries: Iterable[tuple[Hashable, Mapping[int, tuple[Any, bool]]]], mean: bool
) -> Iterator[WindowParts]:
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
