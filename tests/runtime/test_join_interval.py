"""The interval join's kernel against a plain-Python reference: which pairs, each emitted by
the call that brings its later row; an outer side's unmatched rows emitted by exactly the
``advance`` the rules say (or the ``add``, for a row already past its time); the rows kept
after every call; through snapshots restored into 1 to 3 subtasks' key groups; and state
dropped: flat over a long steady input, none after the end of the input."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cutline.protocol.watermarks import MAX_WATERMARK
from cutline.runtime.joins.how import How
from cutline.runtime.joins.interval import IntervalJoin
from cutline.runtime.joins.output import JoinLayout, Side
from join_kernel_runs import (
    LAYOUT,
    Add,
    Advance,
    Results,
    Row,
    Scenario,
    arrivals,
    first_advance_reaching,
    result,
    rows_of,
    run,
    scenarios,
    watermark_before,
)

HOWS = ["inner", "left", "right", "full"]


def reference(scenario: Scenario, how: How, lower: int, upper: int) -> Results:
    """What the interval join emits, and at which step, by its rules (the module's
    docstring), over all the rows of the scenario at once."""
    out: Results = Counter()
    rows = arrivals(scenario)
    lefts = [(s, r) for s, r in rows if r.side is Side.LEFT]
    rights = [(s, r) for s, r in rows if r.side is Side.RIGHT]
    paired: set[tuple[Side, int]] = set()
    for ls, lrow in lefts:
        for rs, rrow in rights:
            if lrow.key is not None and lrow.key == rrow.key:  # noqa: SIM102
                if lower <= rrow.time - lrow.time <= upper:
                    out[(max(ls, rs), result(scenario, lrow, rrow))] += 1
                    paired |= {(Side.LEFT, lrow.id), (Side.RIGHT, rrow.id)}
    for step, row in rows:
        if not how.outer(row.side) or (row.side, row.id) in paired:
            continue
        last = row.time + upper if row.side is Side.LEFT else row.time - lower
        before = watermark_before(scenario, step)
        at = step if before is not None and before >= last else None
        at = at if at is not None else first_advance_reaching(scenario, step, last)
        assert at is not None  # the scenario ends with MAX_WATERMARK
        pair = (row, None) if row.side is Side.LEFT else (None, row)
        out[(at, result(scenario, *pair))] += 1
    return out


def kept_reference(scenario: Scenario, how: How, lower: int, upper: int) -> list[dict[str, int]]:
    """The rows kept after each step: those whose last chance to pair has not passed (a row
    with a null key only on an outer side)."""
    kept = []
    for step in range(len(scenario.ops)):
        watermark = watermark_before(scenario, step + 1)
        counts = {"left": 0, "right": 0}
        for _, row in arrivals(Scenario(scenario.ops[: step + 1])):
            if row.key is None and not how.outer(row.side):
                continue
            last = row.time + upper if row.side is Side.LEFT else row.time - lower
            if watermark is None or (watermark != MAX_WATERMARK and last > watermark):
                counts["left" if row.side is Side.LEFT else "right"] += 1
        kept.append(counts)
    return kept


def kernels(scenario: Scenario, how: str, lower: int, upper: int):  # type: ignore[no-untyped-def]
    schemas = (scenario.schema(Side.LEFT), scenario.schema(Side.RIGHT))

    def make() -> IntervalJoin:
        return IntervalJoin(LAYOUT, how, lower, upper, schemas=schemas)

    def restore(snapshots: list[dict[str, pa.Table]], groups: range) -> IntervalJoin:
        return IntervalJoin.restore(LAYOUT, how, lower, upper, snapshots, groups, schemas=schemas)

    return make, restore


@settings(max_examples=80, deadline=None)
@given(
    scenario=scenarios(),
    how=st.sampled_from(HOWS),
    lower=st.integers(-20, 20),
    width=st.integers(0, 25),
)
def test_interval_join_is_the_reference_exactly(
    scenario: Scenario, how: str, lower: int, width: int
) -> None:
    upper = lower + width
    expected = reference(scenario, How(how), lower, upper)
    expected_kept = kept_reference(scenario, How(how), lower, upper)
    make, restore = kernels(scenario, how, lower, upper)
    for restores in (False, True):
        results, kept = run(scenario, make, restore, restores)
        assert results == expected
        assert kept == expected_kept
    assert kept[-1] == {"left": 0, "right": 0}


@pytest.mark.slow
def test_interval_join_is_the_reference_exactly_soak() -> None:
    """``make soak``: the property above over 2,000 examples."""
    inner = test_interval_join_is_the_reference_exactly
    settings(max_examples=2000, deadline=None, database=None)(
        given(
            scenario=scenarios(),
            how=st.sampled_from(HOWS),
            lower=st.integers(-20, 20),
            width=st.integers(0, 25),
        )(inner.hypothesis.inner_test)  # type: ignore[attr-defined]
    )()


# ---------------------------------------------------------------------- the rules, by hand


def left(key: int | None, time: int, ident: int) -> Row:
    return Row(Side.LEFT, key, time, ident)


def right(key: int | None, time: int, ident: int) -> Row:
    return Row(Side.RIGHT, key, time, ident)


def steps(scenario: Scenario, how: str, lower: int, upper: int) -> dict[int, list[tuple]]:  # type: ignore[type-arg]
    """Each step's result rows (sorted), of one kernel without restores."""
    make, restore = kernels(scenario, how, lower, upper)
    results, _ = run(scenario, make, restore, restores=False)
    out: dict[int, list[tuple]] = {}  # type: ignore[type-arg]
    for (step, row), count in sorted(results.items(), key=repr):
        out.setdefault(step, []).extend([row] * count)
    return out


def test_an_unmatched_row_is_emitted_by_the_first_advance_past_its_last_chance() -> None:
    # between=(-10, 0): a left row at t pairs with right rows of t-10..t, so its last chance
    # passes at watermark t; a right row at t pairs with left rows of t..t+10: at t+10
    scenario = Scenario(
        [
            Add(Side.LEFT, (left(1, 100, 0), left(2, 103, 1))),
            Add(Side.RIGHT, (right(1, 100, 10), right(3, 100, 11))),
            Advance(99),
            Advance(100),
            Advance(102),
            Advance(103),
            Advance(109),
            Advance(110),
        ]
    )
    assert steps(scenario, "full", -10, 0) == {
        1: [(1, 100, 0, 100, 10)],
        5: [(2, 103, 1, None, None)],
        7: [(3, None, None, 100, 11)],
    }
    assert steps(scenario, "left", -10, 0) == {
        1: [(1, 100, 0, 100, 10)],
        5: [(2, 103, 1, None, None)],
    }
    assert steps(scenario, "right", -10, 0) == {
        1: [(1, 100, 0, 100, 10)],
        7: [(3, None, None, 100, 11)],
    }
    assert steps(scenario, "inner", -10, 0) == {1: [(1, 100, 0, 100, 10)]}


def test_state_is_dropped_at_the_same_watermark_matched_or_not() -> None:
    join = IntervalJoin(LAYOUT, "inner", -10, 0)
    scenario = Scenario([])
    join.add(
        Side.LEFT, scenario.batch(Side.LEFT, [left(1, 100, 0)]), np.array([100]), np.array([0])
    )
    join.add(
        Side.RIGHT, scenario.batch(Side.RIGHT, [right(1, 100, 1)]), np.array([100]), np.array([0])
    )
    assert join.kept() == {"left": 1, "right": 1}
    assert join.advance(99) is None and join.kept() == {"left": 1, "right": 1}
    assert join.advance(100) is None and join.kept() == {"left": 0, "right": 1}
    assert join.advance(109) is None and join.kept() == {"left": 0, "right": 1}
    assert join.advance(110) is None and join.kept() == {"left": 0, "right": 0}


def test_a_row_arriving_past_its_last_chance_pairs_and_goes_out_unmatched_at_once() -> None:
    # between=(-10, -5): a left row at t pairs with right rows of t-10..t-5, and its last
    # chance passes at watermark t-5: one at 100 arriving at watermark 97 is past it already
    scenario = Scenario(
        [
            Add(Side.RIGHT, (right(1, 93, 10),)),
            Advance(97),
            Add(
                Side.LEFT,
                (left(1, 100, 0), left(2, 100, 1), left(None, 100, 2), left(2, 103, 3)),
            ),
            Advance(98),
        ]
    )
    assert steps(scenario, "left", -10, -5) == {
        2: [(1, 100, 0, 93, 10), (2, 100, 1, None, None), (None, 100, 2, None, None)],
        3: [(2, 103, 3, None, None)],
    }
    # the mirror image: between=(5, 10), a right row at t pairs with left rows of t-10..t-5
    mirrored = Scenario(
        [
            Add(Side.LEFT, (left(1, 93, 10),)),
            Advance(97),
            Add(
                Side.RIGHT,
                (right(1, 100, 0), right(2, 100, 1), right(None, 100, 2), right(2, 103, 3)),
            ),
            Advance(98),
        ]
    )
    assert steps(mirrored, "right", 5, 10) == {
        2: [(1, 93, 10, 100, 0), (2, None, None, 100, 1), (None, None, None, 100, 2)],
        3: [(2, None, None, 103, 3)],
    }
    assert steps(mirrored, "inner", 5, 10) == {2: [(1, 93, 10, 100, 0)]}


def test_null_keys_never_pair_and_an_outer_side_emits_them_on_time() -> None:
    scenario = Scenario(
        [
            Add(Side.LEFT, (left(None, 10, 0), left(1, 10, 1))),
            Add(Side.RIGHT, (right(None, 10, 5), right(1, 10, 6))),
            Advance(10),
            Advance(MAX_WATERMARK),
        ]
    )
    assert steps(scenario, "full", 0, 0) == {
        1: [(1, 10, 1, 10, 6)],
        2: [(None, 10, 0, None, None), (None, None, None, 10, 5)],
    }
    for how in ("inner", "left"):
        make, restore = kernels(scenario, how, 0, 0)
        _, kept = run(scenario, make, restore, restores=False)
        assert kept[1] == {"left": 2 if how == "left" else 1, "right": 1}


def test_unmatched_rows_wait_for_the_other_sides_columns() -> None:
    """Without schemas given, a due unmatched row waits (kept) for the other side's first
    batch (an empty one will do) and goes out with it; or at the end of the input with the
    other side's key alone."""
    scenario = Scenario([])
    batch = scenario.batch(Side.LEFT, [left(1, 5, 0)])
    join = IntervalJoin(LAYOUT, "left", 0, 0)
    assert join.add(Side.LEFT, batch, np.array([5]), np.array([0])) is None
    assert join.advance(6) is None and join.kept() == {"left": 1, "right": 0}
    empty = scenario.batch(Side.RIGHT, [])
    out = join.add(Side.RIGHT, empty, np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert rows_of(out) == [(1, 5, 0, None, None)]
    assert join.kept() == {"left": 0, "right": 0}

    join = IntervalJoin(LAYOUT, "left", 0, 0)
    join.add(Side.LEFT, batch, np.array([5]), np.array([0]))
    assert join.advance(6) is None
    out = join.advance(MAX_WATERMARK)
    assert out is not None and out.to_pylist() == [{"k": 1, "t": 5, "lid": 0}]
    assert join.kept() == {"left": 0, "right": 0}


def test_keys_of_two_columns_named_differently_on_each_side() -> None:
    layout = JoinLayout(("a", "b"), ("x", "y"))
    join = IntervalJoin(layout, "inner", -5, 5)
    lefts = pa.record_batch({"a": [1, 1, 2], "b": ["p", "q", "p"], "v": [10, 11, 12]})
    rights = pa.record_batch({"x": [1, 2, 1], "y": ["q", "p", "p"], "v": [20, 21, 22]})
    assert join.add(Side.LEFT, lefts, np.array([0, 0, 0]), np.zeros(3)) is None
    out = join.add(Side.RIGHT, rights, np.array([5, 6, -5]), np.zeros(3))
    assert out is not None
    assert sorted(out.to_pylist(), key=repr) == sorted(
        [
            {"a": 1, "b": "q", "v": 11, "v_right": 20},
            {"a": 1, "b": "p", "v": 10, "v_right": 22},
        ],
        key=repr,
    )


def test_bad_input_is_refused_with_what_and_where() -> None:
    with pytest.raises(ValueError, match=r"lower bound \(5 ms\) is above the upper bound"):
        IntervalJoin(LAYOUT, "inner", 5, 4)
    with pytest.raises(ValueError, match="an interval join has no how='outer'"):
        IntervalJoin(LAYOUT, "outer", 0, 1)
    join = IntervalJoin(LAYOUT, "inner", 0, 1)
    with pytest.raises(KeyError, match="the join's left side has no key column 'k'"):
        join.add(Side.LEFT, pa.record_batch({"x": [1]}), np.array([1]), np.array([0]))
    batch = Scenario([]).batch(Side.LEFT, [left(1, 5, 0)])
    with pytest.raises(ValueError, match="left side has 1 rows but 2 times"):
        join.add(Side.LEFT, batch, np.array([1, 2]), np.array([0]))
    join.add(Side.LEFT, batch, np.array([5]), np.array([0]))
    other = Scenario([], pa.string()).batch(Side.RIGHT, [right(1, 5, 0)])
    with pytest.raises(TypeError, match="the right side's 'k' is string, the left side's"):
        join.add(Side.RIGHT, other, np.array([5]), np.array([0]))
    with pytest.raises(TypeError, match="a batch of the join's left side has the columns"):
        join.add(Side.LEFT, pa.record_batch({"k": [1]}), np.array([5]), np.array([0]))


def test_a_snapshot_of_an_inner_join_does_not_restore_into_an_outer_one() -> None:
    join = IntervalJoin(LAYOUT, "inner", 0, 1)
    batch = Scenario([]).batch(Side.LEFT, [left(1, 5, 0)])
    join.add(Side.LEFT, batch, np.array([5]), np.array([0]))
    with pytest.raises(ValueError, match="does not say which left rows found a partner"):
        IntervalJoin.restore(LAYOUT, "left", 0, 1, [join.snapshot()], range(8))


# ---------------------------------------------------------------------- bounded state


def test_state_stays_flat_over_a_long_steady_input_and_is_empty_at_the_end() -> None:
    """Half a day of event time, a batch of 40 rows a side every 2 minutes over 100 keys,
    disordered by up to 30 s, the watermark 30 s behind, ``between=(-10 min, 0)``: each side
    keeps exactly the rows whose last chance has not passed (no more than the interval plus
    the disorder plus a batch's span of event time holds), and nothing after the end."""
    lower, upper, disorder = -600_000, 0, 30_000
    step, rows = 120_000, 40
    join = IntervalJoin(LAYOUT, "full", lower, upper)
    rng = np.random.default_rng(7)
    alive = {Side.LEFT: np.zeros(0, np.int64), Side.RIGHT: np.zeros(0, np.int64)}
    last_chance = {Side.LEFT: upper, Side.RIGHT: -lower}
    bound = {
        "left": rows * (1 + (upper + disorder + step) // step),
        "right": rows * (1 + (upper - lower + disorder + step) // step),
    }
    emitted = 0
    for at in range(0, 12 * 3_600_000, step):
        watermark = at - disorder
        for side in Side:
            times = at + rng.integers(-disorder + 1, step, rows)
            ident = "lid" if side is Side.LEFT else "rid"
            batch = pa.record_batch({"k": rng.integers(0, 100, rows), "t": times, ident: times})
            out = join.add(side, batch, times, np.zeros(rows, np.int64))
            emitted += 0 if out is None else out.num_rows
            alive[side] = np.concatenate([alive[side], times])
        out = join.advance(watermark)
        emitted += 0 if out is None else out.num_rows
        for side in Side:
            alive[side] = alive[side][alive[side] + last_chance[side] > watermark]
        kept = join.kept()
        assert kept == {"left": len(alive[Side.LEFT]), "right": len(alive[Side.RIGHT])}
        assert kept["left"] <= bound["left"] and kept["right"] <= bound["right"]
    out = join.advance(MAX_WATERMARK)
    assert join.kept() == {"left": 0, "right": 0}
    assert emitted + (0 if out is None else out.num_rows) > 0


def test_a_restore_from_subtasks_at_different_watermarks_starts_at_the_least() -> None:
    """Each old subtask dropped (and emitted) its rows by its own watermark; the restored
    kernel keeps their rows of its key groups and goes on from the least watermark, so that
    no row it keeps is taken as past before the operator's next ``advance``."""
    scenario = Scenario([])
    schemas = (scenario.schema(Side.LEFT), scenario.schema(Side.RIGHT))
    ahead = IntervalJoin(LAYOUT, "left", 0, 10, schemas=schemas)
    behind = IntervalJoin(LAYOUT, "left", 0, 10, schemas=schemas)
    ahead.add(Side.LEFT, scenario.batch(Side.LEFT, [left(1, 5, 0)]), [5], [1])
    behind.add(Side.LEFT, scenario.batch(Side.LEFT, [left(2, 5, 1)]), [5], [6])
    assert rows_of(ahead.advance(20)) == [(1, 5, 0, None, None)]
    assert behind.advance(12) is None
    restored = IntervalJoin.restore(
        LAYOUT, "left", 0, 10, [ahead.snapshot(), behind.snapshot()], range(8), schemas=schemas
    )
    assert restored.watermark == 12 and restored.kept() == {"left": 1, "right": 0}
    # a right row at 14 may still come (the subtask behind had promised only 12)
    out = restored.add(Side.RIGHT, scenario.batch(Side.RIGHT, [right(2, 14, 9)]), [14], [6])
    assert rows_of(out) == [(2, 5, 1, 14, 9)]
    assert restored.advance(14) is None
    assert restored.kept() == {"left": 1, "right": 0}
    assert restored.advance(15) is None  # it paired: nothing to emit
    assert restored.kept() == {"left": 0, "right": 0}
