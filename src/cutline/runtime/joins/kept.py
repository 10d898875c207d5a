"""What the interval and regular joins keep of each side, and how an arriving batch finds its
partners among it.

:class:`KeptRows` is one side's kept rows: the rows as they came (an Arrow table, the side's
columns untouched), and beside them, row for row, NumPy arrays of each row's event time
(``int64`` ms), its key group (so that a restore at another parallelism keeps its own) and,
for a side whose unmatched rows an outer join emits, whether it has paired yet. Those arrays
are replaced, never changed in place, but for ``matched``, which a snapshot copies.

:func:`partners` finds, for a batch arriving on one side, every (arriving row, kept row)
with equal keys and a kept time within the bounds asked: by a hash join of the key columns
alone (Arrow's ``pyarrow.Table.join``, on this thread: a subtask has its core; the hash
table is built of the smaller side, the batch as a rule) and a filter of the times; no
Python per row. A null in any key column never equals anything (as in SQL): such a row
pairs with nothing. (Measured against an index of the kept rows sorted by key and time,
searched with ``np.searchsorted``, on 10^6 rows a side: the hash join was faster by 1.2 to
2x on batches of 10^3 to 10^4 rows, also for a regular join keeping 10^6 rows: keeping a
sorted index costs a copy of it per batch.)

:func:`check_batch` refuses, with an error naming the side and the column, a batch that
lacks a key column, whose key types differ from the other side's, or whose times or key
groups are not one per row.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cutline.runtime.joins.output import JoinLayout, Side

_TIDY_CHUNKS = 16
"""A side's table is made one chunk again once appends have split it into more than this."""


def side_name(side: Side) -> str:
    """``"left"`` or ``"right"``: how errors, snapshots and :meth:`kept` name a side."""
    return "left" if side is Side.LEFT else "right"


def key_columns(layout: JoinLayout, side: Side) -> tuple[str, ...]:
    """The key columns of ``side``."""
    return layout.left_on if side is Side.LEFT else layout.right_on


class KeptRows:
    """One side's kept rows (see the module's docstring).

    :param side: which side.
    :param on: its key columns.
    :param outer: whether an outer join emits its unmatched rows (then ``matched`` is kept).
    :param schema: its columns, if known before its first batch (else the first batch's).
    """

    def __init__(
        self, side: Side, on: tuple[str, ...], outer: bool, schema: pa.Schema | None = None
    ) -> None:
        self.side = side
        self.on = on
        self.outer = outer
        self.table: pa.Table | None = None
        """The rows (``None`` until the side's columns are known)."""
        self.times = np.zeros(0, np.int64)
        self.groups = np.zeros(0, np.int64)
        self.matched: np.ndarray | None = np.zeros(0, np.bool_) if outer else None
        if schema is not None:
            self.learn(schema)

    def __len__(self) -> int:
        return len(self.times)

    @property
    def schema(self) -> pa.Schema | None:
        """The side's columns, once known."""
        return None if self.table is None else self.table.schema

    def learn(self, schema: pa.Schema, what: str = "a batch") -> None:
        """Take the side's columns from ``what`` (a batch, a snapshot): the first sets them,
        every later one must have the same (its columns in the same order, of the same
        types)."""
        known = self.schema
        if known is None:
            missing = [name for name in self.on if schema.get_field_index(name) < 0]
            if missing:
                raise KeyError(
                    f"the join's {side_name(self.side)} side has no key column "
                    f"{missing[0]!r} (its columns: {', '.join(schema.names) or 'none'})"
                )
            self.table = schema.empty_table()
        elif not known.equals(schema):
            raise TypeError(
                f"{what} of the join's {side_name(self.side)} side has the columns "
                f"{_columns(schema)}, but they are {_columns(known)}: every batch of a side "
                "must have the same"
            )

    def append(
        self, rows: pa.Table, times: np.ndarray, groups: np.ndarray, matched: np.ndarray
    ) -> None:
        """Keep ``rows`` (of the side's columns), their times, key groups and whether each
        paired already."""
        if not rows.num_rows:
            return
        assert self.table is not None
        self.table = pa.concat_tables([self.table, rows])
        if self.table.num_columns and self.table.column(0).num_chunks > _TIDY_CHUNKS:
            self.table = self.table.combine_chunks()
        self.times = np.concatenate([self.times, times])
        self.groups = np.concatenate([self.groups, groups])
        if self.matched is not None:
            self.matched = np.concatenate([self.matched, matched])

    def keep(self, mask: np.ndarray) -> None:
        """Keep only the rows where ``mask`` is true (the others are dropped)."""
        if mask.all():
            return
        assert self.table is not None
        self.table = self.table.filter(pa.array(mask)).combine_chunks()
        self.times = self.times[mask]
        self.groups = self.groups[mask]
        if self.matched is not None:
            self.matched = self.matched[mask]

    def keys(self) -> list[pa.ChunkedArray]:
        """The key columns of the kept rows."""
        assert self.table is not None
        return [self.table.column(name) for name in self.on]

    def snapshot(self, into: dict[str, pa.Table]) -> None:
        """Put the kept rows into a kernel's snapshot: ``"<side>"`` the rows, and
        ``"<side>_state"`` per row its ``time``, ``key_group`` and (an outer side)
        ``matched``. Nothing is put while the side's columns are unknown (it kept nothing).
        """
        if self.table is None:
            return
        name = side_name(self.side)
        columns = {"time": pa.array(self.times), "key_group": pa.array(self.groups)}
        if self.matched is not None:
            columns["matched"] = pa.array(self.matched)  # a copy: ``matched`` changes in place
        into[name] = self.table
        into[f"{name}_state"] = pa.table(columns)

    @classmethod
    def restored(
        cls,
        side: Side,
        on: tuple[str, ...],
        outer: bool,
        snapshots: Sequence[dict[str, pa.Table]],
        key_groups: range,
        schema: pa.Schema | None = None,
    ) -> KeptRows:
        """The rows of ``side`` that any of ``snapshots`` kept whose key group is in
        ``key_groups``."""
        name = side_name(side)
        kept = cls(side, on, outer, schema)
        for number, snapshot in enumerate(snapshots):
            if name not in snapshot:
                continue
            rows, state = snapshot[name], snapshot.get(f"{name}_state")
            if state is None or state.num_rows != rows.num_rows:
                raise ValueError(
                    f"snapshot {number} of the join's {side_name(side)} rows has no "
                    f"{name}_state table of as many rows: it was not written by this join"
                )
            if outer and "matched" not in state.column_names:
                raise ValueError(
                    f"snapshot {number} does not say which {name} rows found a partner (it "
                    f"is of a join that does not emit unmatched {name} rows): it cannot be "
                    f"restored into one that does"
                )
            groups = state.column("key_group").to_numpy()
            mine = _in_range(groups, key_groups)
            kept.learn(rows.schema, f"snapshot {number}")
            kept.append(
                rows.filter(pa.array(mine)),
                state.column("time").to_numpy()[mine],
                groups[mine],
                state.column("matched").to_numpy()[mine]
                if outer
                else np.zeros(int(mine.sum()), np.bool_),
            )
        if kept.table is not None:
            kept.table = kept.table.combine_chunks()
        return kept


def check_batch(
    side: Side, batch: pa.RecordBatch, times: np.ndarray, key_groups: np.ndarray
) -> tuple[pa.Table, np.ndarray, np.ndarray]:
    """The batch as a table, and its times and key groups as ``int64`` arrays, each checked
    to be one per row."""
    n = batch.num_rows
    times = np.asarray(times, dtype=np.int64)
    key_groups = np.asarray(key_groups, dtype=np.int64)
    for what, values in (("times", times), ("key groups", key_groups)):
        if values.shape != (n,):
            raise ValueError(
                f"a batch of the join's {side_name(side)} side has {n} rows but "
                f"{values.size} {what}: one per row"
            )
    return pa.Table.from_batches([batch]), times, key_groups


def partners(
    layout: JoinLayout,
    side: Side,
    arriving: pa.Table,
    kept: KeptRows,
    low: np.ndarray | None = None,
    high: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Every pair of a row ``i`` of ``arriving`` (of ``side``) and a row of ``kept`` (the
    other side) whose keys are equal and not null and whose kept time is from ``low[i]`` to
    ``high[i]`` (inclusive; ``None``: any), as two arrays of row indices (``int64``), in no
    particular order."""
    if not len(kept) or not arriving.num_rows:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    ours, theirs = key_columns(layout, side), kept.on
    mine = [arriving.column(name) for name in ours]
    other = kept.keys()
    for our, their, a, b in zip(ours, theirs, mine, other, strict=True):
        if a.type != b.type:
            raise TypeError(
                f"the join's keys differ in type: the {side_name(side)} side's {our!r} is "
                f"{a.type}, the {side_name(kept.side)} side's {their!r} is {b.type}"
            )
    names = [f"k{i}" for i in range(len(ours))]
    probe = pa.table([*mine, pa.array(np.arange(arriving.num_rows))], names=[*names, "a"])
    build = pa.table([*other, pa.array(np.arange(len(kept)))], names=[*names, "b"])
    if probe.num_rows < build.num_rows:  # the hash table is built of the right one
        probe, build = build, probe
    joined = probe.join(build, keys=names, join_type="inner", use_threads=False)
    found, partner = _numpy(joined.column("a")), _numpy(joined.column("b"))
    if low is not None or high is not None:
        times = kept.times[partner]
        fit = np.ones(len(found), np.bool_)
        if low is not None:
            fit &= times >= low[found]
        if high is not None:
            fit &= times <= high[found]
        found, partner = found[fit], partner[fit]
    return found, partner


def gathered(table: pa.Table, rows: np.ndarray) -> tuple[pa.Table, np.ndarray]:
    """``table`` and ``rows`` (indices into it, ``-1``: none) as :meth:`JoinLayout.assemble
    <cutline.runtime.joins.output.JoinLayout.assemble>` takes them, made cheap: a table of
    many chunks (kept rows) is first cut down to the rows wanted (a ``take`` of the chunks,
    instead of their concatenation into one)."""
    if table.num_columns == 0 or table.column(0).num_chunks <= 1:
        return table, rows
    present = rows >= 0
    if not present.any():
        return table.slice(0, 0), rows
    taken = table.take(pa.array(np.where(present, rows, rows[present][0])))
    return taken, np.where(present, np.arange(len(rows), dtype=np.int64), -1)


def nulls_in(table: pa.Table, on: tuple[str, ...]) -> np.ndarray:
    """Which rows have a null in one of the key columns ``on`` (they never pair)."""
    mask = np.zeros(table.num_rows, np.bool_)
    for name in on:
        column = table.column(name)
        if column.null_count:
            mask |= _numpy(pc.is_null(column))
    return mask


def _numpy(column: pa.ChunkedArray) -> np.ndarray:
    return np.asarray(column.to_numpy())


def _in_range(groups: np.ndarray, key_groups: range) -> np.ndarray:
    if key_groups.step == 1:
        return (groups >= key_groups.start) & (groups < key_groups.stop)
    return np.isin(groups, np.asarray(key_groups, np.int64))


def _columns(schema: pa.Schema) -> str:
    return "(" + ", ".join(f"{f.name}: {f.type}" for f in schema) + ")"
