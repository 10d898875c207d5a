"""Operators on their own, without a network: stateless transformations, rolling aggregations
(the vectorized path against the per-record one), keyed process functions, snapshots and
restores, the key_by partitioner, user errors and dead letters."""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cutline import FixedDelay, InputWarning, JobFailedError, StreamEnvironment, testing
from cutline.connectors import SinkContext
from cutline.runtime.io.file_formats import JSONL
from cutline.runtime.io.sinks import PENDING, FileSink
from cutline.runtime.keyed_operators import (
    KeyedProcessFunction,
    ProcessContext,
    ProcessLogic,
    RollingLogic,
)
from cutline.runtime.operators import (
    DeadLetterOutput,
    FilterLogic,
    FlatMapLogic,
    MapBatchesLogic,
    MapLogic,
    OperatorContext,
    Partitioner,
    PassLogic,
    RecordError,
    RunningOperator,
    UserFunctionError,
)
from cutline.runtime.state.keygroups import key_group, subtask_for_key_group
from cutline.runtime.state.segments import MemorySegmentStore
from cutline.runtime.task.local import ThreadLauncher

MAXP = 128


STORE = MemorySegmentStore()
"""Where the keyed snapshots of these tests write their segments, and restores read them."""


def context(
    name: str = "op",
    subtask: int = 0,
    parallelism: int = 1,
    max_parallelism: int = MAXP,
    **extra: Any,
) -> OperatorContext:
    return OperatorContext(
        name=name,
        subtask=subtask,
        parallelism=parallelism,
        max_parallelism=max_parallelism,
        generation=1,
        restore_store=STORE,
        **extra,
    )


def written(running: Any, checkpoint_id: int) -> list[dict[str, Any]]:
    """A keyed operator's checkpoint, written: what a restore gets."""
    return [running.snapshot(checkpoint_id).write(STORE, f"t{checkpoint_id}-{id(running)}")]


def contents(running: Any) -> dict[str, dict[Any, Any]]:
    """Everything in a keyed operator's state: name -> key -> value."""
    backend = running.backend
    out: dict[str, dict[Any, Any]] = {}
    for name in backend.state_names():
        table = backend._tables[name]
        out[name] = {key: table.get(key) for key in backend.keys(name)}
    return out


def owner(key: Hashable, parallelism: int, max_parallelism: int = MAXP) -> int:
    return subtask_for_key_group(key_group(key, max_parallelism), parallelism, max_parallelism)


def owned_keys(
    candidates: list[Any], subtask: int, parallelism: int, max_parallelism: int = MAXP
) -> list[Any]:
    return [k for k in candidates if owner(k, parallelism, max_parallelism) == subtask]


def as_list(batch: Any) -> list[Any]:
    return batch.to_pylist() if isinstance(batch, pa.RecordBatch) else list(batch)


def values_batch(values: list[int]) -> pa.RecordBatch:
    return pa.record_batch({"value": pa.array(values, pa.int64())})


def keyed_batch(
    pairs: list[tuple[Any, Any]], key_type: pa.DataType | None = None
) -> pa.RecordBatch:
    keys = pa.array([k for k, _ in pairs], key_type)
    values = pa.array([v for _, v in pairs], pa.int64())
    return pa.record_batch({"key": keys, "value": values})


# ---------------------------------------------------------------- stateless per record


def double(record: dict[str, int]) -> int:
    return record["value"] * 2


def is_even(record: dict[str, int]) -> bool:
    return record["value"] % 2 == 0


def repeat(record: dict[str, int]) -> list[int]:
    return [record["value"]] * record["value"]


@pytest.mark.parametrize("make", [values_batch, lambda v: [{"value": x} for x in v]])
def test_map_filter_and_flat_map_work_on_lists_and_record_batches(
    make: Callable[[list[int]], Any],
) -> None:
    values = [3, 0, 1, 4, 2]
    mapped = MapLogic(double).open(context(), None).process(make(values))
    assert mapped == [6, 0, 2, 8, 4]
    kept = FilterLogic(is_even).open(context(), None).process(make(values))
    assert kept == [{"value": 0}, {"value": 4}, {"value": 2}]
    flat = FlatMapLogic(repeat).open(context(), None).process(make(values))
    assert flat == [3, 3, 3, 1, 4, 4, 4, 4, 2, 2]


def test_flat_map_accepts_generators_and_none() -> None:
    def maybe(record: int) -> Any:
        if record % 2:
            return None
        return (record + i for i in range(2))

    running = FlatMapLogic(maybe).open(context(), None)
    assert running.process([1, 2, 3, 4]) == [2, 3, 4, 5]
    assert running.process([]) == []


def test_map_emits_records_of_any_type_in_order() -> None:
    running = MapLogic(lambda r: (r, str(r))).open(context(), None)
    assert running.process([2, 1]) == [(2, "2"), (1, "1")]
    assert running.snapshot(1) is None  # stateless: nothing in checkpoints


def test_pass_logic_returns_the_batch_unchanged() -> None:
    batch = values_batch([1, 2])
    assert PassLogic().open(context(), None).process(batch) is batch


def add_one(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch.set_column(0, "value", pc.add(batch.column("value"), 1))


def as_table(batch: pa.RecordBatch) -> pa.Table:
    return pa.table({"value": pc.multiply(batch.column("value"), 10)})


def test_map_batches_runs_a_pyarrow_compute_function_on_the_columns() -> None:
    running = MapBatchesLogic(add_one).open(context(), None)
    out = running.process(values_batch([1, 2, 3]))
    assert isinstance(out, pa.RecordBatch)
    assert out.to_pylist() == [{"value": 2}, {"value": 3}, {"value": 4}]
    # records that are dicts become a batch first
    assert running.process([{"value": 7}]).to_pylist() == [{"value": 8}]


def test_map_batches_turns_a_returned_table_into_a_batch() -> None:
    out = MapBatchesLogic(as_table).open(context(), None).process(values_batch([1, 2]))
    assert isinstance(out, pa.RecordBatch)
    assert out.column("value").to_pylist() == [10, 20]


def test_map_batches_rejects_records_that_are_not_dicts() -> None:
    with pytest.raises(RecordError, match="needs records that are dicts"):
        MapBatchesLogic(add_one).open(context(), None).process([1, 2])


def test_map_batches_reports_a_function_that_returns_the_wrong_type() -> None:
    running = MapBatchesLogic(lambda b: b.to_pylist()).open(context("map_batches(f)"), None)
    with pytest.raises(
        UserFunctionError, match=r"return a pyarrow\.RecordBatch or Table, not list"
    ):
        running.process(values_batch([1]))


# ------------------------------------------------------------------- rolling aggregations


def reference_rolling(how: str, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What Flink's rolling aggregations emit, record by record (the obvious way)."""
    current: dict[Any, Any] = {}
    out = []
    for record in records:
        key = record["key"]
        if how == "count":
            current[key] = current.get(key, 0) + 1
            out.append({**record, "count": current[key]})
            continue
        value = record["value"]
        if key in current:
            combine = {"sum": lambda a, b: a + b, "min": min, "max": max}[how]
            value = combine(current[key], value)
        current[key] = value
        out.append({**record, "value": value})
    return out


@pytest.mark.parametrize("how", ["sum", "count", "min", "max"])
@pytest.mark.parametrize("columnar", [True, False])
def test_rolling_aggregations_emit_every_record_with_its_key_s_running_value(
    how: str, columnar: bool
) -> None:
    pairs = [("a", 5), ("b", 2), ("a", -1), ("a", 7), ("b", 1), ("c", 0), ("b", 9)]
    field = None if how == "count" else "value"
    running = RollingLogic(how, key="key", field=field).open(context(), None)
    batch = keyed_batch(pairs)
    out = running.process(batch if columnar else batch.to_pylist())
    assert as_list(out) == reference_rolling(how, batch.to_pylist())


def test_count_replaces_a_count_column_that_is_already_there() -> None:
    batch = pa.record_batch({"key": ["x", "x"], "count": ["old", "old"]})
    running = RollingLogic("count", key="key").open(context(), None)
    assert as_list(running.process(batch)) == [{"key": "x", "count": 1}, {"key": "x", "count": 2}]


def test_sum_of_an_int32_column_gives_the_same_values_on_both_paths() -> None:
    batch = pa.record_batch(
        {"key": pa.array([1, 2, 1], pa.int32()), "value": pa.array([1, 2, 3], pa.int32())}
    )
    vectorized = RollingLogic("sum", "key", "value").open(context(), None).process(batch)
    per_record = (
        RollingLogic("sum", "key", "value").open(context(), None).process(batch.to_pylist())
    )
    assert isinstance(vectorized, pa.RecordBatch)
    assert (
        vectorized.to_pylist()
        == per_record
        == [
            {"key": 1, "value": 1},
            {"key": 2, "value": 2},
            {"key": 1, "value": 4},
        ]
    )


def test_rolling_sum_of_tuples_by_position_and_a_key_function() -> None:
    running = RollingLogic("sum", key=lambda r: r[0], field=1).open(context(), None)
    assert running.process([("a", 1, "x"), ("a", 2, "y"), ("b", 5, "z")]) == [
        ("a", 1, "x"),
        ("a", 3, "y"),
        ("b", 5, "z"),
    ]
    lists = RollingLogic("max", key=lambda r: r[0], field=1).open(context(), None)
    assert lists.process([["a", 4], ["a", 2]]) == [["a", 4], ["a", 4]]


def merge(previous: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    return {
        "key": record["key"],
        "value": previous["value"] + record["value"],
        "n": previous["n"] + 1,
    }


def test_reduce_emits_the_first_record_as_it_is_then_the_combined_records() -> None:
    running = RollingLogic("reduce", key="key", fn=merge).open(context(), None)
    records = [{"key": "a", "value": 1, "n": 1}, {"key": "b", "value": 10, "n": 1}]
    records += [{"key": "a", "value": 2, "n": 1}, {"key": "a", "value": 3, "n": 1}]
    assert running.process(pa.RecordBatch.from_pylist(records)) == [
        {"key": "a", "value": 1, "n": 1},
        {"key": "b", "value": 10, "n": 1},
        {"key": "a", "value": 3, "n": 2},
        {"key": "a", "value": 6, "n": 3},
    ]


def test_a_record_without_the_field_is_a_user_error_that_names_the_field() -> None:
    running = RollingLogic("sum", key="key", field="value").open(context("sum(value)"), None)
    with pytest.raises(UserFunctionError, match="the record has no field 'value'") as info:
        running.process([{"key": "a", "other": 1}])
    assert info.value.operator == "sum(value)"
    assert info.value.record == repr({"key": "a", "other": 1})


def test_a_key_of_another_subtask_is_refused() -> None:
    (foreign,) = [k for k in range(100) if owner(k, 2) == 1][:1]
    running = RollingLogic("count", key="key").open(context(subtask=0, parallelism=2), None)
    with pytest.raises(UserFunctionError, match=f"key {foreign} belongs to subtask 1, not 0"):
        running.process([{"key": foreign}])


KEY_POOL_STR = [f"k{i}" for i in range(40)]
KEY_POOL_INT = list(range(-20, 40))


@st.composite
def keyed_batches(draw: st.DrawFn) -> tuple[int, int, list[list[tuple[Any, int]]]]:
    """(parallelism, subtask, batches of (key, value)) with keys the subtask owns."""
    parallelism = draw(st.integers(1, 3))
    subtask = draw(st.integers(0, parallelism - 1))
    pool = draw(st.sampled_from([KEY_POOL_STR, KEY_POOL_INT]))
    keys = owned_keys(pool, subtask, parallelism)
    pair = st.tuples(st.sampled_from(keys), st.integers(-(10**9), 10**9))
    batches = draw(st.lists(st.lists(pair, min_size=1, max_size=30), min_size=1, max_size=6))
    return parallelism, subtask, batches


@pytest.mark.parametrize("how", ["sum", "count"])
@given(case=keyed_batches())
def test_vectorized_sum_and_count_equal_the_per_record_path(
    how: str, case: tuple[int, int, list[list[tuple[Any, int]]]]
) -> None:
    parallelism, subtask, batches = case
    field = "value" if how == "sum" else None
    logic = RollingLogic(how, key="key", field=field)
    ctx = context(f"{how}(value)", subtask=subtask, parallelism=parallelism)
    vectorized, per_record = logic.open(ctx, None), logic.open(ctx, None)
    so_far: list[dict[str, Any]] = []
    for pairs in batches:
        batch = keyed_batch(pairs)
        so_far += batch.to_pylist()
        fast = vectorized.process(batch)
        assert isinstance(fast, pa.RecordBatch), "the vectorized path was not taken"
        slow = per_record.process(batch.to_pylist())
        assert fast.to_pylist() == slow == reference_rolling(how, so_far)[-len(pairs) :]
    assert contents(vectorized) == contents(per_record)


@given(case=keyed_batches(), switch=st.lists(st.booleans(), min_size=6, max_size=6))
def test_vectorized_and_per_record_batches_can_alternate_on_one_key_state(
    case: tuple[int, int, list[list[tuple[Any, int]]]], switch: list[bool]
) -> None:
    parallelism, subtask, batches = case
    ctx = context("sum(value)", subtask=subtask, parallelism=parallelism)
    logic = RollingLogic("sum", key="key", field="value")
    mixed, reference = logic.open(ctx, None), logic.open(ctx, None)
    for pairs, columnar in zip(batches, switch, strict=False):
        batch = keyed_batch(pairs)
        out = mixed.process(batch if columnar else batch.to_pylist())
        assert as_list(out) == reference.process(batch.to_pylist())


def test_vectorized_float_sum_of_one_key_does_not_depend_on_other_keys() -> None:
    batch = pa.record_batch({"key": ["big", "small"], "value": [1e20, 1.0]})
    out = RollingLogic("sum", "key", "value").open(context(), None).process(batch)
    assert as_list(out) == [{"key": "big", "value": 1e20}, {"key": "small", "value": 1.0}]


def test_vectorized_float_sum_equals_the_per_record_sum() -> None:
    batch = pa.record_batch({"key": ["a", "b", "b"], "value": [0.1, 0.2, 0.3]})
    logic = RollingLogic("sum", "key", "value")
    fast = logic.open(context(), None).process(batch)
    slow = logic.open(context(), None).process(batch.to_pylist())
    assert as_list(fast) == slow


def test_a_float_running_sum_is_not_truncated_by_a_later_integer_batch() -> None:
    logic = RollingLogic("sum", "key", "value")
    running = logic.open(context(), None)
    running.process(pa.record_batch({"key": ["a"], "value": [1.5]}))
    out = running.process(pa.record_batch({"key": ["a"], "value": pa.array([1], pa.int64())}))
    assert as_list(out) == [{"key": "a", "value": 2.5}]


def test_vectorized_sum_of_large_unsigned_values_equals_the_per_record_sum() -> None:
    batch = pa.record_batch({"key": ["a"], "value": pa.array([2**63 + 5], pa.uint64())})
    logic = RollingLogic("sum", "key", "value")
    fast = logic.open(context(), None).process(batch)
    slow = logic.open(context(), None).process(batch.to_pylist())
    assert as_list(fast) == slow == [{"key": "a", "value": 2**63 + 5}]


@pytest.mark.parametrize(
    ("how", "field", "fn"),
    [
        ("sum", "value", None),
        ("count", None, None),
        ("min", "value", None),
        ("max", "value", None),
        ("reduce", None, merge),
    ],
)
@pytest.mark.parametrize("columnar", [True, False])
def test_a_restored_snapshot_continues_the_running_values(
    how: str, field: str | None, fn: Any, columnar: bool
) -> None:
    def batch_of(pairs: list[tuple[str, int]]) -> Any:
        rows = [{"key": k, "value": v, "n": 1} for k, v in pairs]
        return pa.RecordBatch.from_pylist(rows) if columnar else rows

    first = [("a", 3), ("b", 4), ("a", -2), ("c", 8)]
    second = [("b", 10), ("a", 1), ("c", -8), ("d", 5), ("a", 6)]
    logic = RollingLogic(how, key="key", field=field, fn=fn)
    ctx = context("rolling", subtask=0, parallelism=1)
    uninterrupted = logic.open(ctx, None)
    uninterrupted.process(batch_of(first))
    expected = as_list(uninterrupted.process(batch_of(second)))

    before = logic.open(ctx, None)
    before.process(batch_of(first))
    state = written(before, 7)
    before.process(batch_of([("a", 1000)]))  # after the snapshot: must not leak into it
    after = logic.open(ctx, state)
    assert as_list(after.process(batch_of(second))) == expected


def test_a_snapshot_keeps_only_the_restoring_subtask_s_keys() -> None:
    keys = [f"k{i}" for i in range(20)]
    logic = RollingLogic("count", key="key")
    whole = logic.open(context(subtask=0, parallelism=1), None)
    whole.process(pa.record_batch({"key": keys}))
    state = written(whole, 1)
    for subtask in range(2):
        part = logic.open(context(subtask=subtask, parallelism=2), state)
        mine = owned_keys(keys, subtask, 2)
        out = part.process(pa.record_batch({"key": mine}))
        assert as_list(out) == [{"key": k, "count": 2} for k in mine]


# --------------------------------------------------------------- keyed process functions


class Tracker(KeyedProcessFunction):
    """Uses value, list and map state; emits the key's state after every record."""

    def open(self, ctx: ProcessContext) -> None:
        self.total = ctx.value_state("total")
        self.seen = ctx.list_state("seen")
        self.parity = ctx.map_state("parity")

    def process(self, record: dict[str, Any], ctx: ProcessContext) -> list[dict[str, Any]]:
        value = record["value"]
        self.total.update(self.total.get(0) + value)
        self.seen.add(value)
        parity = "even" if value % 2 == 0 else "odd"
        self.parity.put(parity, self.parity.get(parity, 0) + 1)
        return [
            {
                "key": ctx.key,
                "total": self.total.get(),
                "seen": self.seen.get(),
                "parity": dict(self.parity.items()),
                "subtask": ctx.subtask,
            }
        ]


def test_a_keyed_process_function_keeps_value_list_and_map_state_per_key() -> None:
    running = ProcessLogic(Tracker(), "key").open(context(subtask=0, parallelism=1), None)
    out = running.process(keyed_batch([("a", 1), ("b", 2), ("a", 4)]))
    assert out == [
        {"key": "a", "total": 1, "seen": [1], "parity": {"odd": 1}, "subtask": 0},
        {"key": "b", "total": 2, "seen": [2], "parity": {"even": 1}, "subtask": 0},
        {"key": "a", "total": 5, "seen": [1, 4], "parity": {"odd": 1, "even": 1}, "subtask": 0},
    ]
    state = written(running, 3)
    running.process([{"key": "a", "value": 100}])
    restored = ProcessLogic(Tracker(), "key").open(context(), state)
    assert restored.process([{"key": "a", "value": 2}]) == [
        {"key": "a", "total": 7, "seen": [1, 4, 2], "parity": {"odd": 1, "even": 2}, "subtask": 0}
    ]


def test_every_subtask_gets_its_own_copy_of_the_process_function() -> None:
    function = Tracker()
    logic = ProcessLogic(function, "key")
    keys = [f"k{i}" for i in range(30)]
    (first, second) = (logic.open(context(subtask=i, parallelism=2), None) for i in range(2))
    first.process([{"key": k, "value": 1} for k in owned_keys(keys, 0, 2)])
    out = second.process([{"key": k, "value": 1} for k in owned_keys(keys, 1, 2)])
    assert all(r["total"] == 1 and r["subtask"] == 1 for r in out)
    assert not hasattr(function, "total")  # open() ran on copies


class BrokenOpen(KeyedProcessFunction):
    def open(self, ctx: ProcessContext) -> None:
        raise RuntimeError("no state for you")

    def process(self, record: Any, ctx: ProcessContext) -> None:
        return None


def test_an_exception_in_open_names_the_operator() -> None:
    with pytest.raises(UserFunctionError, match="no state for you") as info:
        ProcessLogic(BrokenOpen(), "key").open(context("process(BrokenOpen)", subtask=0), None)
    assert info.value.operator == "process(BrokenOpen)"
    assert "in open()" in info.value.record


# ---------------------------------------------------------------------------- partitioner


def check_split(
    records: list[Any], parts: list[list[Any]], target_of: Callable[[Any], int], n: int
) -> None:
    assert len(parts) == n
    for t, part in enumerate(parts):
        # exactly the records of subtask t, in their input order
        assert part == [r for r in records if target_of(r) == t]


@given(
    parallelism=st.integers(2, 5),
    keys=st.lists(st.one_of(st.integers(-50, 50), st.text(max_size=4)), max_size=60),
)
def test_split_of_a_record_batch_sends_each_row_to_its_key_group_s_owner(
    parallelism: int, keys: list[Any]
) -> None:
    str_keys = [str(k) for k in keys]  # one column has one type
    batch = pa.record_batch(
        {"key": pa.array(str_keys, pa.string()), "i": pa.array(range(len(keys)), pa.int64())}
    )
    parts = Partitioner("key", parallelism, MAXP).split(batch)
    assert all(isinstance(p, pa.RecordBatch) for p in parts)
    check_split(
        batch.to_pylist(),
        [p.to_pylist() for p in parts],
        lambda r: owner(r["key"], parallelism),
        parallelism,
    )


@given(parallelism=st.integers(2, 5), keys=st.lists(st.integers(-(2**40), 2**40), max_size=60))
def test_split_of_a_record_batch_with_an_integer_key_column(
    parallelism: int, keys: list[int]
) -> None:
    batch = pa.record_batch({"key": pa.array(keys, pa.int64())})
    parts = Partitioner("key", parallelism, MAXP).split(batch)
    check_split(
        batch.to_pylist(),
        [p.to_pylist() for p in parts],
        lambda r: owner(r["key"], parallelism),
        parallelism,
    )


def first_letter(record: tuple[str, int]) -> str:
    return record[0][:1]


@given(
    parallelism=st.integers(2, 5),
    records=st.lists(st.tuples(st.text(max_size=3), st.integers()), max_size=60),
)
def test_split_of_a_list_with_a_key_function(
    parallelism: int, records: list[tuple[str, int]]
) -> None:
    parts = Partitioner(first_letter, parallelism, MAXP).split(records)
    check_split(records, parts, lambda r: owner(first_letter(r), parallelism), parallelism)


@given(
    parallelism=st.integers(2, 5),
    keys=st.lists(st.one_of(st.integers(-50, 50), st.text(max_size=4), st.none()), max_size=60),
)
def test_split_of_a_list_of_dicts_by_column(parallelism: int, keys: list[Any]) -> None:
    records = [{"key": k, "i": i} for i, k in enumerate(keys)]
    parts = Partitioner("key", parallelism, MAXP).split(records)
    check_split(records, parts, lambda r: owner(r["key"], parallelism), parallelism)


def test_split_agrees_between_record_batches_and_lists() -> None:
    keys = [f"user-{i % 150}" for i in range(600)]
    batch = pa.record_batch({"key": keys, "i": list(range(600))})
    partitioner = Partitioner("key", 3, MAXP)
    columnar = [p.to_pylist() for p in partitioner.split(batch)]
    assert columnar == Partitioner("key", 3, MAXP).split(batch.to_pylist())
    assert sum(len(p) for p in columnar) == 600
    assert all(columnar)  # 150 keys over 3 subtasks: each gets some


def test_split_at_parallelism_one_returns_the_batch_itself() -> None:
    batch = pa.record_batch({"key": ["a", "b"]})
    assert Partitioner("key", 1, MAXP).split(batch) == [batch]


def test_split_of_a_batch_without_the_key_column_names_the_columns() -> None:
    with pytest.raises(RecordError, match=r"key_by\('key'\): the records have no such column"):
        Partitioner("key", 2, MAXP).split(pa.record_batch({"value": [1], "other": [2]}))


def test_split_of_a_batch_with_a_null_key_is_refused() -> None:
    with pytest.raises(RecordError, match="a record has no key"):
        Partitioner("key", 2, MAXP).split(pa.record_batch({"key": ["a", None]}))


def test_split_of_a_record_without_the_key_field_is_refused() -> None:
    with pytest.raises(RecordError, match="the record has no key field 'key'"):
        Partitioner("key", 2, MAXP).split([{"value": 1}])


# ------------------------------------------------------------------- errors, dead letters


def bad(record: dict[str, int]) -> dict[str, int]:
    if record["value"] == 3:
        raise ValueError(f"three is not allowed: {record['value']}")  # the user's line
    return record


def test_a_user_error_names_the_operator_the_subtask_the_record_and_the_user_s_line() -> None:
    running = MapLogic(bad).open(context("map(bad)", subtask=2, parallelism=3), None)
    with pytest.raises(UserFunctionError) as info:
        running.process(values_batch([1, 2, 3, 4]))
    error = info.value
    assert error.operator == "map(bad)"
    assert error.subtask == 2
    assert error.record == "{'value': 3}"
    assert error.error == "ValueError: three is not allowed: 3"
    assert 'raise ValueError(f"three is not allowed: {record' in error.user_traceback
    assert "test_runtime_operators.py" in error.user_traceback
    assert ", in bad" in error.user_traceback
    assert "/cutline/runtime/" not in error.user_traceback  # cutline's frames left out
    message = str(error)
    assert message.startswith("map(bad) (subtask 2) failed on record {'value': 3}: ValueError")
    assert "three is not allowed" in message
    assert isinstance(error.__cause__, ValueError)


def test_a_user_error_shortens_a_huge_record() -> None:
    running = MapLogic(lambda r: 1 / 0).open(context("map(lambda)"), None)
    with pytest.raises(UserFunctionError, match="ZeroDivisionError") as info:
        running.process(["x" * 10_000])
    assert len(info.value.record) < 300


@pytest.mark.parametrize(
    ("kind", "logic"), [("map", MapLogic), ("filter", FilterLogic), ("flat_map", FlatMapLogic)]
)
def test_every_per_record_kind_reports_user_errors(kind: str, logic: Any) -> None:
    running = logic(bad).open(context(f"{kind}(bad)"), None)
    with pytest.raises(UserFunctionError, match=rf"{kind}\(bad\) \(subtask 0\)"):
        running.process([{"value": 3}])


def published_rows(directory: Path) -> list[dict[str, Any]]:
    rows = []
    for path in sorted(directory.glob("*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines()]
    return rows


def dead_letter_context(directory: Path, name: str, subtask: int = 0) -> OperatorContext:
    sink = FileSink(str(directory), JSONL)
    writer = sink.writer(SinkContext("dead letters", subtask, subtask + 1, 1, "r0"), {})
    return context(
        name,
        subtask=subtask,
        parallelism=subtask + 1,
        on_error="dead_letter",
        dead_letters=DeadLetterOutput(writer),
    )


def commit(ctx: OperatorContext, checkpoint_id: int) -> None:
    assert ctx.dead_letters is not None
    ctx.dead_letters.writer.pre_commit(checkpoint_id)
    ctx.dead_letters.writer.commit(checkpoint_id)


def test_a_dead_letter_operator_writes_the_bad_record_and_keeps_going(tmp_path: Path) -> None:
    directory = tmp_path / "dead"
    ctx = dead_letter_context(directory, "map(bad)", subtask=1)
    running = MapLogic(bad).open(ctx, None)
    assert running.process(values_batch([1, 3, 5])) == [{"value": 1}, {"value": 5}]
    assert ctx.dead_letters is not None and ctx.dead_letters.count == 1
    assert published_rows(directory) == []  # not before its checkpoint completes
    commit(ctx, 1)
    (row,) = published_rows(directory)
    assert set(row) == {"operator", "subtask", "error", "traceback", "record"}
    assert row["operator"] == "map(bad)"
    assert row["subtask"] == 1
    assert row["error"] == "ValueError: three is not allowed: 3"
    assert "three is not allowed" in row["traceback"]
    assert "in bad" in row["traceback"]
    assert json.loads(row["record"]) == {"value": 3}
    assert list((directory / PENDING).iterdir()) == []


def test_dead_letters_of_a_failed_batch_function_hold_every_record_of_the_batch(
    tmp_path: Path,
) -> None:
    def explode(batch: pa.RecordBatch) -> pa.RecordBatch:
        raise KeyError("nope")

    ctx = dead_letter_context(tmp_path / "dead", "map_batches(explode)")
    assert MapBatchesLogic(explode).open(ctx, None).process(values_batch([7, 8])) is None
    commit(ctx, 1)
    rows = published_rows(tmp_path / "dead")
    assert [json.loads(r["record"]) for r in rows] == [{"value": 7}, {"value": 8}]
    assert {r["error"] for r in rows} == {"KeyError: 'nope'"}


def add_values(previous: dict[str, int], record: dict[str, int]) -> dict[str, int]:
    if record["value"] < 0:
        raise ArithmeticError("negative")
    return {"key": record["key"], "value": previous["value"] + record["value"]}


def test_a_keyed_operator_sends_bad_records_to_dead_letters_and_keeps_its_state(
    tmp_path: Path,
) -> None:
    ctx = dead_letter_context(tmp_path / "dead", "reduce(add_values)")
    running = RollingLogic("reduce", "key", fn=add_values).open(ctx, None)
    records = [{"key": k, "value": v} for k, v in [("a", 1), ("a", -5), ("a", 2), ("b", 7)]]
    out = running.process(records)
    assert out == [{"key": "a", "value": 1}, {"key": "a", "value": 3}, {"key": "b", "value": 7}]
    commit(ctx, 4)
    (row,) = published_rows(tmp_path / "dead")
    assert json.loads(row["record"]) == {"key": "a", "value": -5}
    assert row["error"] == "ArithmeticError: negative"


def test_dead_letters_keep_records_that_are_not_json_as_their_repr(tmp_path: Path) -> None:
    ctx = dead_letter_context(tmp_path / "dead", "map(lambda)")
    record = {"value": 3, "when": {1, 2}}
    assert MapLogic(bad).open(ctx, None).process([record]) == []
    commit(ctx, 1)
    (row,) = published_rows(tmp_path / "dead")
    assert json.loads(row["record"]) == {"value": 3, "when": "{1, 2}"}


def test_without_a_dead_letter_output_dead_letter_mode_still_fails() -> None:
    ctx = context("map(bad)", on_error="dead_letter")
    with pytest.raises(UserFunctionError):
        MapLogic(bad).open(ctx, None).process([{"value": 3}])


def test_running_defaults_do_nothing_at_checkpoints() -> None:
    running = RunningOperator()
    assert running.snapshot(1) is None
    running.notify_complete(1)
    running.close()
    with pytest.raises(NotImplementedError):
        running.process([])


def test_a_sum_of_text_is_an_error_naming_the_field_not_a_concatenation(tmp_path: Path) -> None:
    """A column read as text (``'3'``, ``'4'``) must not sum to ``'34'``: known as text when
    the job is built, the sum is refused then; after an operator that may change the records
    (nothing known), the record fails (or goes to the dead letters) naming the field and its
    value, without cutline's traceback."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.csv").write_text("user,value\nu3,3\nu3,4\nu9,abc\n")
    env = StreamEnvironment(1, checkpoint_dir=str(tmp_path / "ck"), restart_strategy=FixedDelay(0))
    with pytest.warns(InputWarning, match="value"):
        stream = env.read_csv(tmp_path / "in")
    with pytest.raises(ValueError, match=r"sum\('value'\): column 'value' is string, but sum"):
        stream.key_by("user").sum("value")
    stream.map(dict).key_by("user").sum("value").collect()
    with pytest.raises(JobFailedError) as info:
        testing.execute(env, launcher=ThreadLauncher(), progress=False)
    assert "sum(value)" in str(info.value)
    assert "'value' is str '3', not a number (sum needs numbers)" in str(info.value)
    assert info.value.user_traceback == ""


def parse_amount(record: dict) -> dict:
    return {"key": record["key"], "amount": int(record["amount"])}


def test_an_operator_s_name_is_what_errors_dead_letters_and_the_figures_call_it(
    tmp_path: Path,
) -> None:
    (tmp_path / "in").mkdir()
    rows = [{"key": "a", "amount": "1"}, {"key": "b", "amount": "oops"}]
    (tmp_path / "in" / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = StreamEnvironment(
        1, checkpoint_dir=str(tmp_path / "ck"), dead_letter_dir=str(tmp_path / "dead")
    )
    env.read_jsonl(tmp_path / "in").map(
        parse_amount, name="parse", on_error="dead_letter"
    ).collect()
    result = testing.execute(env, launcher=ThreadLauncher(), progress=False)
    assert result.output == [{"key": "a", "amount": 1}]
    [dead] = [
        json.loads(line)
        for part in (tmp_path / "dead").rglob("part-*.jsonl")
        for line in part.read_text().splitlines()
    ]
    assert dead["operator"] == "parse"
    assert result.metrics is not None and result.metrics.operator("parse").records_in == 2

    env = StreamEnvironment(1, checkpoint_dir=str(tmp_path / "ck2"), restart_strategy=FixedDelay(0))
    env.read_jsonl(tmp_path / "in").map(parse_amount, name="parse").collect()
    with pytest.raises(JobFailedError) as info:
        testing.execute(env, launcher=ThreadLauncher(), progress=False)
    assert info.value.operator == "parse"
    assert "parse (subtask " in str(info.value)


def fails_at_500(record: dict) -> dict:
    if record["value"] == 500:
        raise ValueError("the user's own failure")
    return record


def fragile_job(env: StreamEnvironment) -> StreamEnvironment:
    """A shuffle, a user function that fails on one record (in one slot), another shuffle:
    the other slot's channels from the failing one break right after it fails."""
    (
        env.from_sequence(0, 2_000)
        .key_by(lambda r: r["value"] % 7)
        .map(fails_at_500, name="fragile")
        .key_by(lambda r: r["value"] % 3)
        .map(lambda r: r)
        .collect()
    )
    return env


def test_the_first_cause_wins_over_the_failures_it_causes(tmp_path: Path) -> None:
    """A user function fails in one slot; the other slot's channels from it break a moment
    later. The job must report the user's exception, every time (it once said 'slot-0: lost
    ... control connection closed' in about one run of eight)."""
    for run in range(12):
        env = StreamEnvironment(
            2,
            checkpoint_dir=str(tmp_path / f"ck{run}"),
            restart_strategy=FixedDelay(0),
            batch_size=100,
        )
        with pytest.raises(JobFailedError) as info:
            testing.execute(fragile_job(env), launcher=ThreadLauncher(), progress=False)
        assert info.value.operator == "fragile", (run, str(info.value))
        assert "ValueError: the user's own failure" in str(info.value)
