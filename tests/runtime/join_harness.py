"""What the join kernels' tests share: rows of two sides with keys of one or two columns,
hypothesis strategies for them and for the steps of a run, and :class:`Subtasks`, a kernel
(or, after a snapshot restored at another parallelism, several, each with its key groups)
driven as the join operator drives it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
from hypothesis import strategies as st

from cutline.runtime.joins.output import JoinLayout, Side

KEY_GROUPS = 8
"""The key groups of the tests' jobs (a subtask of ``n`` holds a range of them)."""

LEFT_SCHEMA = {
    1: pa.schema([("k", pa.int64()), ("lid", pa.int64()), ("v", pa.string())]),
    2: pa.schema([("k", pa.int64()), ("s", pa.string()), ("lid", pa.int64()), ("v", pa.string())]),
}
RIGHT_SCHEMA = {
    1: pa.schema([("rk", pa.int64()), ("rid", pa.int64()), ("v", pa.float64())]),
    2: pa.schema(
        [("rk", pa.int64()), ("s", pa.string()), ("rid", pa.int64()), ("v", pa.float64())]
    ),
}


def layout_of(columns: int, windows: bool) -> JoinLayout:
    """A join on ``k`` = ``rk`` (and ``s`` = ``s``: two key columns)."""
    if columns == 1:
        return JoinLayout(("k",), ("rk",), windows=windows)
    return JoinLayout(("k", "s"), ("rk", "s"), windows=windows)


@dataclass(frozen=True)
class Row:
    """A row of either side: its key (a tuple, ``None`` for a null), time and id (unique in a
    run: the result names rows by their ids)."""

    key: tuple[Any, ...]
    time: int
    id: int

    @property
    def null_key(self) -> bool:
        return any(part is None for part in self.key)

    @property
    def key_group(self) -> int:
        k = self.key[0]
        s = self.key[1] if len(self.key) > 1 else ""
        return ((7 if k is None else k) * 3 + (5 if s is None else len(s))) % KEY_GROUPS


def batch_of(side: Side, rows: Sequence[Row], columns: int) -> pa.RecordBatch:
    """A batch of ``side``'s rows in its schema."""
    ids = [row.id for row in rows]
    data: dict[str, list[Any]] = {("k" if side is Side.LEFT else "rk"): [r.key[0] for r in rows]}
    if columns == 2:
        data["s"] = [r.key[1] for r in rows]
    if side is Side.LEFT:
        data["lid"] = ids
        data["v"] = [f"l{i}" for i in ids]
        schema = LEFT_SCHEMA[columns]
    else:
        data["rid"] = ids
        data["v"] = [i / 2 for i in ids]
        schema = RIGHT_SCHEMA[columns]
    return pa.RecordBatch.from_pydict(data, schema=schema)


keys_1 = st.tuples(st.one_of(st.none(), st.integers(0, 3)))
keys_2 = st.tuples(st.one_of(st.none(), st.integers(0, 2)), st.sampled_from([None, "a", "bb"]))


@st.composite
def steps(draw: st.DrawFn, columns: int, spread: int = 12) -> list[tuple[str, Any]]:
    """A run: batches of a side (rows as (key, time offset from the watermark)) and watermark
    steps, in a random order."""
    keys = keys_1 if columns == 1 else keys_2
    row = st.tuples(keys, st.integers(-spread, spread))
    step = st.one_of(
        st.tuples(st.sampled_from(["left", "right"]), st.lists(row, min_size=1, max_size=6)),
        st.tuples(st.just("watermark"), st.integers(0, spread)),
    )
    return draw(st.lists(step, min_size=1, max_size=30))


class Kernel(Protocol):
    def add(
        self, side: Side, batch: pa.RecordBatch, times: np.ndarray, key_groups: np.ndarray
    ) -> pa.RecordBatch | None: ...

    def advance(self, watermark: int) -> pa.RecordBatch | None: ...

    def snapshot(self) -> dict[str, pa.Table]: ...

    def kept(self) -> dict[str, int]: ...


def through_ipc(tables: dict[str, pa.Table]) -> dict[str, pa.Table]:
    """The tables written and read back (as the operator writes a snapshot)."""
    out = {}
    for name, table in tables.items():
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        out[name] = pa.ipc.open_stream(sink.getvalue()).read_all()
    return out


def split(parts: int) -> list[range]:
    """The key groups of ``parts`` subtasks (Flink's ranges)."""
    return [range(i * KEY_GROUPS // parts, (i + 1) * KEY_GROUPS // parts) for i in range(parts)]


class Subtasks:
    """One kernel, or after :meth:`rescale` several, driven as an operator drives them: a
    batch's rows go to the subtask of their key group, a watermark to all, and their results
    are merged."""

    def __init__(self, kernel: Kernel, columns: int) -> None:
        self.kernels: list[tuple[range, Kernel]] = [(range(KEY_GROUPS), kernel)]
        self.columns = columns

    def add(self, side: Side, rows: Sequence[Row]) -> None:
        groups = np.array([row.key_group for row in rows], dtype=np.int64)
        for owned, kernel in self.kernels:
            mine = [row for row, g in zip(rows, groups, strict=True) if g in owned]
            if not mine:
                continue
            out = kernel.add(
                side,
                batch_of(side, mine, self.columns),
                np.array([row.time for row in mine], dtype=np.int64),
                np.array([row.key_group for row in mine], dtype=np.int64),
            )
            assert out is None

    def advance(self, watermark: int) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for _, kernel in self.kernels:
            out = kernel.advance(watermark)
            if out is not None:
                assert out.num_rows
                found += out.to_pylist()
        return found

    def kept(self) -> dict[str, int]:
        total: Counter[str] = Counter()
        for _, kernel in self.kernels:
            total.update(kernel.kept())
        return {"left": total["left"], "right": total["right"]}

    def rescale(
        self, parts: int, restore: Callable[[list[dict[str, pa.Table]], range], Kernel]
    ) -> None:
        """Snapshot every subtask, and restore the snapshots into ``parts`` subtasks."""
        snapshots = [through_ipc(kernel.snapshot()) for _, kernel in self.kernels]
        self.kernels = [(owned, restore(snapshots, owned)) for owned in split(parts)]


def rows_at(drawn: Sequence[tuple[tuple[Any, ...], int]], base: int, ids: list[int]) -> list[Row]:
    """Drawn (key, offset) pairs as rows at ``base + offset``, numbered on from ``ids[0]``."""
    rows = []
    for key, offset in drawn:
        ids[0] += 1
        rows.append(Row(key, base + offset, ids[0]))
    return rows
