"""The window join's kernel (:class:`~cutline.runtime.joins.window.WindowJoin`) against a
plain-Python reference of its semantics: over random rows of both sides (keys of one or two
columns with nulls, times out of order within the watermark's promise), watermarks that
advance in random steps, every assigner and every ``how``, and a snapshot restored at a random
point into one, two or three subtasks' key groups, every ``advance`` emits exactly the
reference's rows (as a multiset: pairs, and outer rows at the call where their window fires),
and the kernel keeps exactly the rows the reference says are in an open window."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterator
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
from cutline.runtime.eventtime.assigners import Session, Sliding, Tumbling
from cutline.runtime.joins.how import How
from cutline.runtime.joins.keycodes import key_codes, pair_up
from cutline.runtime.joins.output import Side
from cutline.runtime.joins.rows import SLACK, JoinError
from cutline.runtime.joins.window import WindowJoin

Assigner = Tumbling | Sliding | Session
Result = tuple[Any, ...]


def windows_of(assigner: Tumbling | Sliding, t: int) -> Iterator[tuple[int, int]]:
    """The windows (start, end) holding time ``t``, from their definition."""
    if isinstance(assigner, Tumbling):
        start = t - (t - assigner.offset) % assigner.size
        yield start, start + assigner.size
        return
    start = t - (t - assigner.offset) % assigner.every
    while start + assigner.size > t:
        yield start, start + assigner.size
        start -= assigner.every


class Reference:
    """The window join, row by row: each row in its windows that have not fired (tumbling,
    sliding), or pending until its session (of both sides' pending rows of its key) fires."""

    def __init__(self, assigner: Assigner, how: How) -> None:
        self.assigner = assigner
        self.how = how
        self.watermark = MIN_WATERMARK
        self.windows: dict[tuple[int, int], tuple[list[Row], list[Row]]] = {}
        self.pending: tuple[list[Row], list[Row]] = ([], [])

    def late(self, t: int) -> bool:
        if isinstance(self.assigner, Session):
            return t + self.assigner.gap - 1 <= self.watermark
        return all(end - 1 <= self.watermark for _, end in windows_of(self.assigner, t))

    def add(self, side: Side, rows: list[Row]) -> None:
        for row in rows:
            assert not self.late(row.time)
            if isinstance(self.assigner, Session):
                self.pending[side].append(row)
                continue
            for window in windows_of(self.assigner, row.time):
                if window[1] - 1 > self.watermark:
                    self.windows.setdefault(window, ([], []))[side].append(row)

    def advance(self, watermark: int) -> list[Result]:
        if watermark <= self.watermark:
            return []
        self.watermark = watermark
        out: list[Result] = []
        if isinstance(self.assigner, Session):
            for window, (left, right) in self._sessions():
                if window[1] - 1 <= watermark:
                    out += self._pairs(window, left, right)
                    for side, rows in ((0, left), (1, right)):
                        for row in rows:
                            self.pending[side].remove(row)
            return out
        for window in sorted(self.windows):
            if window[1] - 1 <= watermark:
                out += self._pairs(window, *self.windows.pop(window))
        return out

    def _sessions(self) -> Iterator[tuple[tuple[int, int], tuple[list[Row], list[Row]]]]:
        assert isinstance(self.assigner, Session)
        gap = self.assigner.gap
        rows = [(row.key, row.time, side, row) for side in (0, 1) for row in self.pending[side]]
        by_key: dict[tuple[Any, ...], list[tuple[int, int, Row]]] = {}
        for key, t, side, row in rows:
            by_key.setdefault(key, []).append((t, side, row))
        for found in by_key.values():
            found.sort(key=lambda item: item[0])
            session: list[tuple[int, int, Row]] = []
            for item in found:
                if session and item[0] - session[-1][0] > gap:
                    yield self._session(session, gap)
                    session = []
                session.append(item)
            yield self._session(session, gap)

    @staticmethod
    def _session(
        items: list[tuple[int, int, Row]], gap: int
    ) -> tuple[tuple[int, int], tuple[list[Row], list[Row]]]:
        window = (items[0][0], max(t for t, _, _ in items) + gap)
        return window, ([r for _, s, r in items if s == 0], [r for _, s, r in items if s == 1])

    def _pairs(self, window: tuple[int, int], left: list[Row], right: list[Row]) -> list[Result]:
        out = []
        paired_left, paired_right = set(), set()
        for a in left:
            for b in right:
                if a.key == b.key and not a.null_key:
                    out.append((a.key, *window, a.id, b.id))
                    paired_left.add(a.id)
                    paired_right.add(b.id)
        if self.how in (How.LEFT, How.FULL):
            out += [(a.key, *window, a.id, None) for a in left if a.id not in paired_left]
        if self.how in (How.RIGHT, How.FULL):
            out += [(b.key, *window, None, b.id) for b in right if b.id not in paired_right]
        return out

    def kept(self) -> dict[str, int]:
        if isinstance(self.assigner, Session):
            return {"left": len(self.pending[0]), "right": len(self.pending[1])}
        ids: tuple[set[int], set[int]] = (set(), set())
        for sides in self.windows.values():
            for side in (0, 1):
                ids[side].update(row.id for row in sides[side])
        return {"left": len(ids[0]), "right": len(ids[1])}


def result(row: dict[str, Any], columns: int) -> Result:
    """A result row as the reference names it; its other columns checked on the way."""
    key = (row["k"],) if columns == 1 else (row["k"], row["s"])
    if row["lid"] is not None:
        assert row["v"] == f"l{row['lid']}"
    if row["rid"] is not None:
        assert row["v_right"] == row["rid"] / 2
    return (key, row["window_start"], row["window_end"], row["lid"], row["rid"])


@st.composite
def assigners(draw: st.DrawFn) -> Assigner:
    kind = draw(st.sampled_from(["tumbling", "sliding", "session"]))
    if kind == "tumbling":
        size = draw(st.integers(1, 12))
        return Tumbling(f"{size}ms", offset=f"{draw(st.integers(0, size - 1))}ms")
    if kind == "sliding":
        every = draw(st.integers(1, 6))
        size = draw(st.integers(every, 4 * every))
        offset = draw(st.integers(0, every - 1))
        return Sliding(f"{size}ms", every=f"{every}ms", offset=f"{offset}ms")
    return Session(gap=f"{draw(st.integers(1, 8))}ms")


def run(
    assigner: Assigner,
    how: How,
    columns: int,
    drawn: list[tuple[str, Any]],
    rescale_at: int,
    parts: int,
) -> None:
    layout = layout_of(columns, windows=True)
    schemas = (LEFT_SCHEMA[columns], RIGHT_SCHEMA[columns])

    def restore(snapshots: list[dict[str, pa.Table]], owned: range) -> WindowJoin:
        return WindowJoin.restore(layout, assigner, how, snapshots, owned, schemas=schemas)

    subtasks = Subtasks(WindowJoin(layout, assigner, how, schemas=schemas), columns)
    reference = Reference(assigner, how)
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
                assert isinstance(kernel, WindowJoin)
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
    "assigner": assigners(),
    "how": st.sampled_from(How),
    "columns": st.sampled_from([1, 2]),
    "data": st.data(),
    "parts": st.integers(1, 3),
}


@settings(max_examples=120, deadline=None)  # (make soak: 2 000, below)
@given(**PROPERTY)
def test_the_window_join_emits_what_the_reference_does_at_the_same_watermark(
    assigner: Assigner, how: How, columns: int, data: st.DataObject, parts: int
) -> None:
    drawn = data.draw(steps(columns))
    rescale_at = data.draw(st.integers(0, len(drawn)))
    run(assigner, how, columns, drawn, rescale_at, parts)


@pytest.mark.slow
def test_the_window_join_emits_what_the_reference_does_soak() -> None:
    """``make soak``: the property above over 2 000 examples."""
    inner = test_the_window_join_emits_what_the_reference_does_at_the_same_watermark
    settings(max_examples=2_000, deadline=None, database=None)(
        given(**PROPERTY)(inner.hypothesis.inner_test)  # type: ignore[attr-defined]
    )()


def test_a_pair_in_two_sliding_windows_is_emitted_once_per_window_when_each_fires() -> None:
    layout = layout_of(1, windows=True)
    join = WindowJoin(layout, Sliding("10ms", every="5ms"), "inner")
    zero = np.zeros(1, dtype=np.int64)
    join.add(Side.LEFT, batch_of(Side.LEFT, [Row((1,), 7, 1)], 1), np.array([7]), zero)
    join.add(Side.RIGHT, batch_of(Side.RIGHT, [Row((1,), 8, 2)], 1), np.array([8]), zero)
    assert join.advance(8) is None
    first = join.advance(9)  # [0, 10) fires at 9
    assert first is not None
    assert [(r["window_start"], r["window_end"]) for r in first.to_pylist()] == [(0, 10)]
    assert join.kept() == {"left": 1, "right": 1}  # ([5, 15) is open)
    assert join.advance(13) is None
    second = join.advance(14)
    assert second is not None
    assert [(r["window_start"], r["window_end"]) for r in second.to_pylist()] == [(5, 15)]
    assert join.kept() == {"left": 0, "right": 0}


@pytest.mark.parametrize(
    "assigner",
    [Tumbling("1s"), Sliding("1s", every="250ms"), Session(gap="20ms")],
    ids=str,
)
def test_state_stays_bounded_over_a_long_steady_input_and_is_empty_at_the_end(
    assigner: Assigner,
) -> None:
    """Two sides of 400 rows every 100 ms of event time over 2 minutes, 2 000 keys, times
    up to 50 ms out of order, the watermark 60 ms behind the latest time: the rows kept never
    exceed those of the longest span a row waits (a window and the delay), and the rows the
    kernel holds (dropped ones not yet taken out) stay within twice those and its slack."""
    rng = np.random.default_rng(7)
    layout = layout_of(1, windows=True)
    join = WindowJoin(layout, assigner, "full")
    span = 1_000 if not isinstance(assigner, Session) else 200
    bound = 2 * 400 * (span + 200) // 100
    most = 0
    for step in range(1_200):
        now = step * 100
        for side in Side:
            times = now + rng.integers(-50, 50, 400)
            keys = rng.integers(0, 2_000, 400)
            ids = np.arange(400) + 400 * (2 * step + side)
            schema = (LEFT_SCHEMA if side is Side.LEFT else RIGHT_SCHEMA)[1]
            values = ids.astype(str) if side is Side.LEFT else ids / 2
            batch = pa.RecordBatch.from_arrays([keys, ids, values], schema=schema)
            join.add(side, batch, times, keys % 8)
        join.advance(now - 60)
        kept = join.kept()
        most = max(most, kept["left"], kept["right"])
        for kept_rows in join.rows:
            assert kept_rows.size <= 2 * kept_rows.count + SLACK + 400
    assert most <= bound
    join.advance(MAX_WATERMARK)
    assert join.kept() == {"left": 0, "right": 0}


def test_a_restore_of_subtasks_at_different_watermarks_fires_no_window_twice() -> None:
    """Keys 1 and 2 in two subtasks, the second ahead: a sliding window it fired holds its
    rows still (their later windows are open); restored together (at the lower watermark) it
    does not fire again. The results of all three equal one kernel's."""
    layout = layout_of(1, windows=True)
    sliding = Sliding("10ms", every="5ms")
    rows = [Row((k,), t, 10 * k + t) for k in (1, 2) for t in (6, 8)]

    def fed(keys: set[int]) -> WindowJoin:
        join = WindowJoin(layout, sliding, "inner")
        for side in Side:
            mine = [r for r in rows if r.key[0] in keys]
            times = np.array([r.time for r in mine], dtype=np.int64)
            join.add(side, batch_of(side, mine, 1), times, np.array([r.key[0] for r in mine]))
        return join

    def results(out: pa.RecordBatch | None) -> list[Result]:
        return [] if out is None else [result(r, 1) for r in out.to_pylist()]

    alone = fed({1, 2})
    want = Counter(results(alone.advance(MAX_WATERMARK)))
    first, second = fed({1}), fed({2})
    got = Counter(results(first.advance(3)) + results(second.advance(9)))  # [0, 10) fired in 2
    assert got == Counter(r for r in want if r[0] == (2,) and r[1] == 0)
    merged = WindowJoin.restore(
        layout, sliding, "inner", [first.snapshot(), second.snapshot()], range(0, 8)
    )
    assert merged.watermark == 3
    got += Counter(results(merged.advance(MAX_WATERMARK)))
    assert got == want


def test_windows_of_a_time_zone_are_those_of_its_local_clock() -> None:
    """Hours in New York on the day clocks go back: 01:00 is two windows, an hour each."""
    layout = layout_of(1, windows=True)
    hours = Tumbling("1 h", time_zone="America/New_York")
    join = WindowJoin(layout, hours, "inner")
    first = int(dt.datetime(2024, 11, 3, 5, 30, tzinfo=dt.UTC).timestamp() * 1000)  # 01:30 EDT
    second = first + 3_600_000  # 01:30 EST
    rows = [Row((1,), first, 1), Row((1,), second, 2)]
    for side in Side:
        times = np.array([first, second], dtype=np.int64)
        join.add(side, batch_of(side, rows, 1), times, np.zeros(2, dtype=np.int64))
    out = join.advance(MAX_WATERMARK)
    assert out is not None
    found = sorted(
        (r["window_start"], r["window_end"], r["lid"], r["rid"]) for r in out.to_pylist()
    )
    hour = 3_600_000
    assert found == [
        (first - hour // 2, first + hour // 2, 1, 1),
        (second - hour // 2, second + hour // 2, 2, 2),
    ]


def test_what_a_window_join_refuses_is_named() -> None:
    layout = layout_of(1, windows=True)
    with pytest.raises(ValueError, match=r"a window join \(Tumbling\(1s\)\) has no how='sideways'"):
        WindowJoin(layout, Tumbling("1s"), "sideways")
    with pytest.raises(JoinError, match="no window_start"):
        WindowJoin(layout_of(1, windows=False), Tumbling("1s"), "inner")
    join = WindowJoin(layout, Tumbling("10ms"), "left")
    join.advance(100)
    late = batch_of(Side.LEFT, [Row((1,), 95, 1), Row((1,), 120, 2)], 1)
    with pytest.raises(JoinError, match="1 of a left batch's 2 rows are late at the watermark 100"):
        join.add(Side.LEFT, late, np.array([95, 120]), np.zeros(2, dtype=np.int64))
    left = batch_of(Side.LEFT, [Row((1,), 120, 2)], 1)
    join.add(Side.LEFT, left, np.array([120]), np.zeros(1, dtype=np.int64))
    with pytest.raises(JoinError, match="the right side's columns are not known"):
        join.advance(200)
    other = pa.record_batch({"k": [1], "other": [2]})
    with pytest.raises(JoinError, match="a left batch's columns"):
        join.add(Side.LEFT, other, np.array([300]), np.zeros(1, dtype=np.int64))
    narrower = pa.record_batch(  # (the same columns in narrower types: cast)
        {"k": pa.array([1], pa.int32()), "lid": pa.array([3], pa.int32()), "v": ["l3"]}
    )
    join.add(Side.LEFT, narrower, np.array([300]), np.zeros(1, dtype=np.int64))
    assert join.kept() == {"left": 2, "right": 0}
    with pytest.raises(JoinError, match="the right side has no key column 'rk'"):
        WindowJoin(layout, Tumbling("1s"), "inner", schemas=(LEFT_SCHEMA[1], LEFT_SCHEMA[1]))
    with pytest.raises(
        JoinError, match="a left batch of 1 rows came with 2 times and 1 key groups"
    ):
        join.add(Side.LEFT, left, np.array([300, 301]), np.zeros(1, dtype=np.int64))
    snapshot = through_ipc(WindowJoin(layout, Tumbling("10ms"), "left").snapshot())
    with pytest.raises(JoinError, match=r"a join of Tumbling\(10ms\), how='left' cannot be"):
        WindowJoin.restore(layout, Tumbling("20ms"), "left", [snapshot], range(8))


@settings(max_examples=200, deadline=None)
@given(
    left=st.lists(st.one_of(st.just(-1), st.integers(0, 5), st.integers(2**40, 2**40 + 3))),
    right=st.lists(st.one_of(st.just(-1), st.integers(0, 5), st.integers(2**40, 2**40 + 3))),
    keep_left=st.booleans(),
    keep_right=st.booleans(),
)
def test_pair_up_gives_every_pair_of_a_group_once_and_the_lonely_rows(
    left: list[int], right: list[int], keep_left: bool, keep_right: bool
) -> None:
    got = pair_up(
        np.array(left, dtype=np.int64), np.array(right, dtype=np.int64), keep_left, keep_right
    )
    want = [(i, j) for i, a in enumerate(left) for j, b in enumerate(right) if a == b >= 0]
    if keep_left:
        want += [(i, -1) for i, a in enumerate(left) if a < 0 or a not in right]
    if keep_right:
        want += [(-1, j) for j, b in enumerate(right) if b < 0 or b not in left]
    assert Counter(zip(got[0].tolist(), got[1].tolist(), strict=True)) == Counter(want)


@settings(max_examples=100, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.booleans(),
            st.lists(st.one_of(st.none(), st.integers(0, 9)), min_size=20, max_size=20),
        ),
        max_size=30,
    )
)
def test_key_codes_are_equal_exactly_where_keys_are_even_of_many_columns(
    rows: list[tuple[bool, list[int | None]]],
) -> None:
    """Twenty columns of ten values: more combinations than an int64 holds, so the codes are
    renumbered on the way."""
    names = [f"c{i}" for i in range(20)]
    sides = [
        [key for is_left, key in rows if is_left],
        [key for is_left, key in rows if not is_left],
    ]
    tables = [
        pa.table(
            {
                name: pa.array([key[i] for key in keys], type=pa.int64())
                for i, name in enumerate(names)
            }
        )
        for keys in sides
    ]
    codes = key_codes(tables[0], names, tables[1], names)
    found = [
        *zip(codes.left.tolist(), sides[0], strict=True),
        *zip(codes.right.tolist(), sides[1], strict=True),
    ]
    for code, key in found:
        for other_code, other in found:
            assert (code == other_code) == (key == other)
    assert all(0 <= code < codes.count <= len(rows) + 1 for code, _ in found)
    valid = [*codes.left_valid.tolist(), *codes.right_valid.tolist()]
    assert valid == [None not in key for _, key in found]
