"""The as-of join's kernel (:class:`~cutline.runtime.joins.asof.AsofJoin`) against a
plain-Python reference of its semantics: over random rows of both sides (keys of one or two
columns with nulls, times out of order within the watermark's promise), watermarks that
advance in random steps, ``how`` inner and left, and a snapshot restored at a random point
into one, two or three subtasks' key groups, every ``advance`` emits exactly the reference's
rows (each left row at the call whose watermark reaches its time, with the newest version at
or before it, the last come of equal times), and the kernel keeps exactly the pending left
rows and the versions the docstring's rule keeps (the reference keeps every version)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from join_harness import (
    LEFT_SCHEMA,
    RIGHT_SCHEMA,
    Row,
    Subtasks,
    batch_of,
    layout_of,
    rows_at,
    steps,
    through_ipc,
)

from cutline.protocol.watermarks import MAX_WATERMARK, MIN_WATERMARK
from cutline.runtime.joins.asof import AsofJoin
from cutline.runtime.joins.how import How
from cutline.runtime.joins.output import Side
from cutline.runtime.joins.rows import SLACK, JoinError

Result = tuple[Any, ...]


class Reference:
    """The as-of join, row by row, keeping every right version it was given."""

    def __init__(self, how: How) -> None:
        self.how = how
        self.watermark = MIN_WATERMARK
        self.pending: list[Row] = []
        self.versions: list[Row] = []  # (in the order they came)

    def late(self, t: int) -> bool:
        return t <= self.watermark

    def add(self, side: Side, rows: list[Row]) -> None:
        assert not any(self.late(row.time) for row in rows)
        (self.pending if side is Side.LEFT else self.versions).extend(rows)

    def answer(self, row: Row) -> Row | None:
        best = None
        for version in self.versions:
            same = version.key == row.key and not row.null_key
            if same and version.time <= row.time and (best is None or version.time >= best.time):
                best = version
        return best

    def advance(self, watermark: int) -> list[Result]:
        if watermark <= self.watermark:
            return []
        self.watermark = watermark
        ready = [row for row in self.pending if row.time <= watermark]
        self.pending = [row for row in self.pending if row.time > watermark]
        out = []
        for row in ready:
            found = self.answer(row)
            if found is not None or self.how is How.LEFT:
                out.append((row.key, row.id, None if found is None else found.id))
        return out

    def kept(self) -> dict[str, int]:
        """The pending left rows, and the versions that no newer one of their key at or
        below the horizon (the watermark, and every pending row's time) hides."""
        if self.watermark == MAX_WATERMARK:
            return {"left": len(self.pending), "right": 0}
        horizon = min([self.watermark, *(row.time for row in self.pending)])
        kept = 0
        for i, version in enumerate(self.versions):
            if version.null_key:
                continue
            hidden = any(
                newer.key == version.key
                and newer.time <= horizon
                and (newer.time > version.time or (newer.time == version.time and j > i))
                for j, newer in enumerate(self.versions)
            )
            kept += not hidden
        return {"left": len(self.pending), "right": kept}


def result(row: dict[str, Any], columns: int) -> Result:
    key = (row["k"],) if columns == 1 else (row["k"], row["s"])
    assert row["v"] == f"l{row['lid']}"
    if row["rid"] is not None:
        assert row["v_right"] == row["rid"] / 2
    return (key, row["lid"], row["rid"])


def run(how: How, columns: int, drawn: list[tuple[str, Any]], rescale_at: int, parts: int) -> None:
    layout = layout_of(columns, windows=False)
    schemas = (LEFT_SCHEMA[columns], RIGHT_SCHEMA[columns])

    def restore(snapshots: list[dict[str, pa.Table]], owned: range) -> AsofJoin:
        return AsofJoin.restore(layout, how, snapshots, owned, schemas=schemas)

    subtasks = Subtasks(AsofJoin(layout, how, schemas=schemas), columns)
    reference = Reference(how)
    watermark, ids = 0, [0]
    assert subtasks.advance(watermark) == reference.advance(watermark) == []
    for i, (what, arg) in enumerate(drawn):
        if i == rescale_at:
            subtasks.rescale(parts, restore)
        if what == "watermark":
            watermark += arg
            got = Counter(result(r, columns) for r in subtasks.advance(watermark))
            assert got == Counter(reference.advance(watermark)), f"at step {i}"
        else:
            side = Side.LEFT if what == "left" else Side.RIGHT
            rows = rows_at(arg, watermark, ids)
            late = [reference.late(row.time) for row in rows]
            for _, kernel in subtasks.kernels:
                assert isinstance(kernel, AsofJoin)
                times = np.array([row.time for row in rows], dtype=np.int64)
                assert kernel.late(side, times).tolist() == late
            on_time = [row for row, is_late in zip(rows, late, strict=True) if not is_late]
            subtasks.add(side, on_time)
            reference.add(side, on_time)
        assert subtasks.kept() == reference.kept(), f"at step {i}"
    got = Counter(result(r, columns) for r in subtasks.advance(MAX_WATERMARK))
    assert got == Counter(reference.advance(MAX_WATERMARK))
    assert subtasks.kept() == {"left": 0, "right": 0}


PROPERTY = {
    "how": st.sampled_from([How.INNER, How.LEFT]),
    "columns": st.sampled_from([1, 2]),
    "data": st.data(),
    "parts": st.integers(1, 3),
}


@settings(max_examples=150, deadline=None)  # (make soak: 2 000, below)
@given(**PROPERTY)
def test_the_asof_join_emits_what_the_reference_does_at_the_same_watermark(
    how: How, columns: int, data: st.DataObject, parts: int
) -> None:
    drawn = data.draw(steps(columns))
    rescale_at = data.draw(st.integers(0, len(drawn)))
    run(how, columns, drawn, rescale_at, parts)


@pytest.mark.slow
def test_the_asof_join_emits_what_the_reference_does_soak() -> None:
    """``make soak``: the property above over 2 000 examples."""
    inner = test_the_asof_join_emits_what_the_reference_does_at_the_same_watermark
    settings(max_examples=2_000, deadline=None, database=None)(
        given(**PROPERTY)(inner.hypothesis.inner_test)  # type: ignore[attr-defined]
    )()


def one(side: Side, join: AsofJoin, key: int, t: int, id: int) -> None:
    batch = batch_of(side, [Row((key,), t, id)], 1)
    join.add(side, batch, np.array([t]), np.zeros(1, dtype=np.int64))


def answers(out: pa.RecordBatch | None) -> list[tuple[int, int | None]]:
    return [] if out is None else [(r["lid"], r["rid"]) for r in out.to_pylist()]


def test_a_version_that_comes_before_the_watermark_passes_a_row_still_counts() -> None:
    join = AsofJoin(layout_of(1, windows=False), "left")
    one(Side.RIGHT, join, 1, 5, 100)
    one(Side.LEFT, join, 1, 10, 1)
    assert join.advance(8) is None  # (the left row waits: a newer version may come)
    one(Side.RIGHT, join, 1, 9, 101)
    one(Side.RIGHT, join, 1, 11, 102)  # (after the row: not its answer)
    assert answers(join.advance(10)) == [(1, 101)]
    assert join.kept() == {"left": 0, "right": 2}  # (5 is hidden by 9, at the watermark)


def test_of_two_versions_at_one_time_the_last_come_is_the_answer_also_after_a_restore() -> None:
    layout = layout_of(1, windows=False)
    join = AsofJoin(layout, "inner")
    one(Side.RIGHT, join, 1, 5, 100)
    one(Side.RIGHT, join, 1, 5, 101)
    one(Side.LEFT, join, 1, 7, 1)
    assert answers(join.advance(7)) == [(1, 101)]
    one(Side.RIGHT, join, 1, 8, 102)
    one(Side.RIGHT, join, 1, 8, 103)
    one(Side.LEFT, join, 1, 9, 2)
    restored = AsofJoin.restore(layout, "inner", [through_ipc(join.snapshot())], range(8))
    assert answers(restored.advance(9)) == [(2, 103)]
    assert restored.kept() == {"left": 0, "right": 1}


def test_state_stays_bounded_over_a_long_steady_input_and_is_empty_at_the_end() -> None:
    """Orders and rates of 1 000 currencies, 500 of each every 100 ms of event time over 2
    minutes, times up to 50 ms out of order, the watermark 60 ms behind the latest: the left
    rows kept are those within the delay, the versions per key those above the watermark and
    one at or below it."""
    rng = np.random.default_rng(11)
    join = AsofJoin(layout_of(1, windows=False), "left")
    most = {"left": 0, "right": 0}
    for step in range(1_200):
        now = step * 100
        for side in Side:
            times = now + rng.integers(-50, 50, 500)
            keys = rng.integers(0, 1_000, 500)
            ids = np.arange(500) + 500 * (2 * step + side)
            schema = (LEFT_SCHEMA if side is Side.LEFT else RIGHT_SCHEMA)[1]
            values = ids.astype(str) if side is Side.LEFT else ids / 2
            batch = pa.RecordBatch.from_arrays([keys, ids, values], schema=schema)
            join.add(side, batch, times, keys % 8)
        join.advance(now - 60)
        for side, count in join.kept().items():
            most[side] = max(most[side], count)
        for kept_rows in join.rows:
            assert kept_rows.size <= 2 * kept_rows.count + SLACK + 500
    assert most["left"] <= 2 * 500
    assert most["right"] <= 1_000 + 2 * 500
    join.advance(MAX_WATERMARK)
    assert join.kept() == {"left": 0, "right": 0}


def test_what_an_asof_join_refuses_is_named() -> None:
    layout = layout_of(1, windows=False)
    with pytest.raises(
        ValueError, match="an as-of join has no how='full': it is one of 'inner', 'left'"
    ):
        AsofJoin(layout, "full")
    with pytest.raises(JoinError, match="has window_start"):
        AsofJoin(layout_of(1, windows=True), "inner")
    join = AsofJoin(layout, "left")
    join.advance(100)
    with pytest.raises(JoinError, match="1 of a right batch's 1 rows are late"):
        one(Side.RIGHT, join, 1, 100, 1)
    one(Side.LEFT, join, 1, 101, 2)
    with pytest.raises(JoinError, match="the right side's columns are not known"):
        join.advance(101)
    snapshot = through_ipc(AsofJoin(layout, "left").snapshot())
    with pytest.raises(JoinError, match="a join how='left' cannot be restored as one how='inner'"):
        AsofJoin.restore(layout, "inner", [snapshot], range(8))
