"""The join kernels' one row store (:class:`~cutline.runtime.joins.rows.SideRows`) against a
plain list of rows: random appends, drops, compactions and spills (a budget of 0 bytes: every
chunk held in memory written to a file and mapped back), the rows taken and gathered as a
result takes them, snapshots restored; and the files, each removed once none of its rows is
alive."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from cutline.runtime.joins.chunks import Spill
from cutline.runtime.joins.output import Side
from cutline.runtime.joins.rows import SideRows
from cutline.runtime.state.config import StateConfig
from cutline.runtime.state.spill import SpillFiles

SCHEMA = pa.schema([("k", pa.int64()), ("id", pa.int64()), ("s", pa.string())])


def batch(first: int, n: int) -> pa.RecordBatch:
    ids = list(range(first, first + n))
    data = {"k": [i % 5 for i in ids], "id": ids, "s": [f"r{i}" for i in ids]}
    return pa.RecordBatch.from_pydict(data, schema=SCHEMA)


def ids_of(table: pa.Table, positions: np.ndarray) -> list[int | None]:
    column = table.column("id").to_pylist()
    return [None if p < 0 else column[p] for p in positions.tolist()]


ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, 40)),
        st.tuples(st.just("drop"), st.floats(0, 1)),
        st.tuples(st.just("compact"), st.just(0)),
        st.tuples(st.just("spill"), st.just(0)),
        st.tuples(st.just("read"), st.integers(0, 2**32)),
        st.tuples(st.just("restore"), st.just(0)),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ops=ops, eager=st.booleans())
def test_the_store_keeps_what_a_list_of_rows_does_spilled_or_not(
    ops: list[tuple[str, Any]], eager: bool, tmp_path_factory: Any
) -> None:
    folder = str(tmp_path_factory.mktemp("spills"))
    spill = Spill(SpillFiles(folder, "t"), budget=0)
    rows = SideRows(Side.LEFT, ("k",), matched=True, eager=eager)
    index: list[int] = []  # the id at each index
    alive: dict[int, int] = {}  # id: time, of the rows alive
    ids = 0
    restored = False
    rng = np.random.default_rng(len(ops))
    for what, arg in ops:
        match what:
            case "append":
                first = rows.append(batch(ids, arg), np.arange(ids, ids + arg), np.zeros(arg))
                assert first == len(index)
                index += range(ids, ids + arg)
                alive.update({i: i for i in range(ids, ids + arg)})
                ids += arg
            case "drop":
                living = rows.alive_rows()
                gone = living[rng.random(len(living)) < arg]
                rows.drop(gone)
                for at in gone.tolist():
                    del alive[index[at]]
            case "compact":
                keep = rows.compact()
                if keep is not None:
                    index = [i for i, k in zip(index, keep.tolist(), strict=True) if k]
            case "spill":
                spill.settle(rows)  # (every chunk with a row alive: a budget of 0 bytes)
                in_files = sum(c.alive for c in rows._chunks if c.file is not None)
                assert in_files == rows.count
            case "read" if index:
                at = np.random.default_rng(arg).integers(-1, len(index), 12)
                taken = rows.take(np.maximum(at, 0))
                assert taken.column("id").to_pylist() == [index[max(a, 0)] for a in at]
                table, positions = rows.gather(at)
                assert ids_of(table, positions) == [None if a < 0 else index[a] for a in at]
            case "restore":
                rows = SideRows.restore(
                    Side.LEFT, ("k",), None, [rows.snapshot()], range(8), matched=True, spill=spill
                )[0]
                rows.eager = eager
                index = sorted(alive)
                restored = True
        assert rows.count == len(alive) and rows.size == len(index)
        assert [index[i] for i in rows.alive_rows()] == sorted(alive)
        assert rows.times[rows.alive_rows()].tolist() == sorted(alive.values())
    rows.drop(rows.alive_rows())
    rows.compact()
    assert rows.count == rows.spilled == 0
    if not restored:  # (else the store replaced still holds its files)
        assert spill.files.paths == [] and os.listdir(folder) == []


def test_spilled_chunks_go_back_to_memory_when_mostly_dropped_and_their_file_when_all(
    tmp_path: Path,
) -> None:
    spill = Spill(SpillFiles(str(tmp_path), "t"), budget=0)
    rows = SideRows(Side.LEFT, ("k",))
    for first in (0, 100):
        rows.append(batch(first, 100), np.arange(first, first + 100), np.zeros(100))
        spill.settle(rows)
    assert rows.spilled == 200 and rows.held == 0 and len(os.listdir(tmp_path)) == 2
    rows.drop(np.arange(0, 50))  # half of the first: it stays as it is, mapped
    assert rows.compact() is None
    rows.drop(np.arange(100, 151))  # more than half of the second
    rows.drop(np.arange(50, 100))  # all of the first
    keep = rows.compact()
    assert keep is not None and keep.sum() == 49
    assert rows.spilled == 0 and rows.held > 0, "the second's 49 rows back in memory"
    assert os.listdir(tmp_path) == [], "both files removed"
    assert rows.take(np.arange(49)).column("id").to_pylist() == list(range(151, 200))


def test_a_join_spills_on_the_disk_backend_beyond_half_its_memory(tmp_path: Path) -> None:
    assert Spill.of(StateConfig(), str(tmp_path), "join-0-1") is None
    spill = Spill.of(StateConfig(backend="disk", memory=1 << 20), str(tmp_path), "join-0-1")
    assert spill is not None and spill.budget == 1 << 19
    rows = SideRows(Side.LEFT, ("k",))
    for first in range(0, 40_000, 10_000):
        rows.append(batch(first, 10_000), np.arange(first, first + 10_000), np.zeros(10_000))
        spill.settle(rows)
    assert rows.held <= spill.budget and rows.spilled
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == [f"join-0-1-{n}.arrow" for n in range(spill.files.spills)] and files
