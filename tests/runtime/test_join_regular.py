"""The regular join's kernel against a plain-Python reference: every pair of rows with equal
keys, emitted by the call that brings the later one, unless the earlier one's ``ttl`` ran out
(by the watermark) before; the rows kept after every call; through snapshots restored into 1
to 3 subtasks' key groups; nothing kept after the end of the input."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cutline.protocol.watermarks import MAX_WATERMARK
from cutline.runtime.joins.output import Side
from cutline.runtime.joins.regular import RegularJoin
from join_kernel_runs import (
    LAYOUT,
    Add,
    Advance,
    Results,
    Row,
    Scenario,
    arrivals,
    result,
    rows_of,
    run,
    scenarios,
)


def dropped_before(scenario: Scenario, row: Row, arrived: int, step: int, ttl: int | None) -> bool:
    """Whether a row that arrived at step ``arrived`` was dropped before step ``step``: an
    advance between them reached its time plus the ``ttl``, or the end of the input."""
    for at in range(arrived + 1, step):
        op = scenario.ops[at]
        if isinstance(op, Advance):
            if op.watermark == MAX_WATERMARK:
                return True
            if ttl is not None and op.watermark >= row.time + ttl:
                return True
    return False


def reference(scenario: Scenario, ttl: int | None) -> Results:
    """What the regular join emits, and at which step, by its rules (the module's
    docstring)."""
    out: Results = Counter()
    rows = arrivals(scenario)
    for early_step, early in rows:
        for late_step, late in rows:
            if late_step <= early_step or late.side is early.side:
                continue
            if early.key is None or early.key != late.key:
                continue
            if dropped_before(scenario, early, early_step, late_step, ttl):
                continue
            pair = (early, late) if early.side is Side.LEFT else (late, early)
            out[(late_step, result(scenario, *pair))] += 1
    return out


def kept_reference(scenario: Scenario, ttl: int | None) -> list[dict[str, int]]:
    """The rows kept after each step: every row with a key not dropped yet."""
    kept = []
    for step in range(len(scenario.ops)):
        counts = {"left": 0, "right": 0}
        for arrived, row in arrivals(Scenario(scenario.ops[: step + 1])):
            if row.key is not None and not dropped_before(scenario, row, arrived, step + 1, ttl):
                counts["left" if row.side is Side.LEFT else "right"] += 1
        kept.append(counts)
    return kept


def kernels(ttl: int | None):  # type: ignore[no-untyped-def]
    def make() -> RegularJoin:
        return RegularJoin(LAYOUT, ttl)

    def restore(snapshots: list[dict[str, pa.Table]], groups: range) -> RegularJoin:
        return RegularJoin.restore(LAYOUT, ttl, snapshots, groups)

    return make, restore


TTLS = st.one_of(st.none(), st.integers(0, 40))


@settings(max_examples=80, deadline=None)
@given(scenario=scenarios(), ttl=TTLS)
def test_regular_join_is_the_reference_exactly(scenario: Scenario, ttl: int | None) -> None:
    expected = reference(scenario, ttl)
    expected_kept = kept_reference(scenario, ttl)
    make, restore = kernels(ttl)
    for restores in (False, True):
        results, kept = run(scenario, make, restore, restores)
        assert results == expected
        assert kept == expected_kept
    assert kept[-1] == {"left": 0, "right": 0}


@pytest.mark.slow
def test_regular_join_is_the_reference_exactly_soak() -> None:
    """``make soak``: the property above over 2,000 examples."""
    inner = test_regular_join_is_the_reference_exactly
    settings(max_examples=2000, deadline=None, database=None)(
        given(scenario=scenarios(), ttl=TTLS)(inner.hypothesis.inner_test)  # type: ignore[attr-defined]
    )()


def left(key: int | None, time: int, ident: int) -> Row:
    return Row(Side.LEFT, key, time, ident)


def right(key: int | None, time: int, ident: int) -> Row:
    return Row(Side.RIGHT, key, time, ident)


def test_a_row_pairs_until_the_watermark_reaches_its_time_plus_the_ttl() -> None:
    """``ttl=10``: the left row at 5 is kept until the watermark reaches 15; a right row
    arriving before that pairs with it, whatever its time (100: 95 apart), one after does
    not; the right rows are kept until 110 and 120 of watermark, and pair with a left row
    that comes before."""
    scenario = Scenario(
        [
            Add(Side.LEFT, (left(1, 5, 0),)),
            Add(Side.RIGHT, (right(1, 100, 10),)),
            Advance(14),
            Add(Side.RIGHT, (right(1, 110, 11),)),
            Advance(15),
            Add(Side.RIGHT, (right(1, 120, 12),)),
            Add(Side.LEFT, (left(1, 109, 1), left(None, 109, 2))),
            Advance(110),
            Add(Side.LEFT, (left(1, 111, 3),)),
            Advance(MAX_WATERMARK),
        ]
    )
    make, restore = kernels(10)
    results, kept = run(scenario, make, restore, restores=False)
    assert results == Counter(
        {
            (1, (1, 5, 0, 100, 10)): 1,
            (3, (1, 5, 0, 110, 11)): 1,
            (6, (1, 109, 1, 100, 10)): 1,
            (6, (1, 109, 1, 110, 11)): 1,
            (6, (1, 109, 1, 120, 12)): 1,
            (8, (1, 111, 3, 110, 11)): 1,
            (8, (1, 111, 3, 120, 12)): 1,
        }
    )
    assert [k["left"] for k in kept] == [1, 1, 1, 1, 0, 0, 1, 1, 2, 0]
    assert [k["right"] for k in kept] == [0, 1, 1, 2, 2, 3, 3, 2, 2, 0]


def test_without_a_ttl_rows_are_kept_for_ever_until_the_end_of_the_input() -> None:
    join = RegularJoin(LAYOUT)
    scenario = Scenario([])
    for i in range(50):
        batch = scenario.batch(Side.LEFT, [left(i % 5, i, i)])
        join.add(Side.LEFT, batch, np.array([i]), np.array([0]))
        assert join.advance(i) is None
    assert join.kept() == {"left": 50, "right": 0}
    out = join.add(Side.RIGHT, scenario.batch(Side.RIGHT, [right(3, 60, 99)]), [60], [0])
    assert sorted(rows_of(out)) == [(3, i, i, 60, 99) for i in range(3, 50, 5)]
    join.advance(MAX_WATERMARK)
    assert join.kept() == {"left": 0, "right": 0}


def test_a_restore_keeps_the_rows_of_its_key_groups_only() -> None:
    join = RegularJoin(LAYOUT, 100)
    batch = pa.record_batch({"k": [1, 2, 3, 4], "t": [1, 2, 3, 4], "lid": [0, 1, 2, 3]})
    join.add(Side.LEFT, batch, np.array([1, 2, 3, 4]), np.array([0, 5, 3, 7]))
    join.advance(50)
    snapshot = join.snapshot()
    parts = [
        RegularJoin.restore(LAYOUT, 100, [snapshot], groups) for groups in (range(4), range(4, 8))
    ]
    assert [p.kept() for p in parts] == [{"left": 2, "right": 0}, {"left": 2, "right": 0}]
    assert [p.watermark for p in parts] == [50, 50]
    merged = RegularJoin.restore(LAYOUT, 100, [p.snapshot() for p in parts], range(8))
    assert merged.kept() == {"left": 4, "right": 0}
    out = merged.add(
        Side.RIGHT, pa.record_batch({"k": [4], "t": [60], "rid": [9]}), np.array([60]), [7]
    )
    assert rows_of(out) == [(4, 4, 3, 60, 9)]


def test_a_negative_ttl_is_refused() -> None:
    with pytest.raises(ValueError, match=r"a join's ttl \(-1 ms\) is negative"):
        RegularJoin(LAYOUT, -1)
