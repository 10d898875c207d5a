"""The join operator around its kernel: late records (at or before its watermark when they
arrive) go to the side output of their input and are counted, never paired; records without
event time or without a key column fail as the job's ``on_error`` says."""

from __future__ import annotations

import functools

import pyarrow as pa
import pytest

from cutline.runtime.eventtime.timestamps import TimeColumn
from cutline.runtime.joins.interval import IntervalJoin
from cutline.runtime.joins.operator import JoinLogic, JoinOperator
from cutline.runtime.joins.output import JoinLayout
from cutline.runtime.operators import OperatorContext, UserFunctionError


def operator() -> JoinOperator:
    layout = JoinLayout(("ad",), ("ad",))
    make = functools.partial(IntervalJoin, layout, "inner", 0, 0)
    restore = functools.partial(IntervalJoin.restore, layout, "inner", 0, 0)
    time = TimeColumn("ts")
    logic = JoinLogic(make, restore, (("ad",), ("ad",)), (time, time))
    ctx = OperatorContext(
        name="same-time",
        subtask=0,
        parallelism=1,
        max_parallelism=128,
        generation=1,
        side_outputs=frozenset({"late_right"}),
    )
    return JoinOperator(logic, ctx, None)


def batch(**columns: list[object]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(columns)


def test_a_late_record_goes_to_its_input_s_side_output_and_is_counted() -> None:
    join = operator()
    assert join.process_from(0, batch(ad=[1, 1], ts=[10, 50], click=[1, 2])) is None
    join.ctx.advance(40)
    join.on_watermark(40)
    pairs = join.process_from(1, batch(ad=[1, 1], ts=[40, 50], view=[3, 4]))
    # ts 40 is at the watermark: late (it would have paired with nothing kept: the click at
    # 10 was dropped at watermark 10); ts 50 pairs with the click at 50
    assert pairs is not None and pairs.to_pylist() == [
        {"ad": 1, "ts": 50, "click": 2, "ts_right": 50, "view": 4}
    ]
    late = join.side_output("late_right")
    assert late is not None and late.to_pylist() == [{"ad": 1, "ts": 40, "view": 3}]
    assert join.side_output("late_left") is None
    assert join.figures() == {"late": 1, "kept": 2}


def test_records_without_time_or_key_fail_naming_the_input() -> None:
    join = operator()
    with pytest.raises(
        UserFunctionError, match=r"same-time \(right input\): the records have no key column 'ad'"
    ):
        join.process_from(1, batch(id=[1], ts=[5]))
    with pytest.raises(UserFunctionError, match=r"same-time \(left input\): no event time"):
        join.process_from(
            0, pa.RecordBatch.from_pydict({"ad": [1], "ts": pa.array([None], pa.int64())})
        )
