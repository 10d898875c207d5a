"""The rolling aggregations on their own: the running mean (emitted, restored, rescaled), the
numbers every aggregation of a field needs, and the state format checkpoints know them by
(the same as before the aggregations were named ``running_*``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_runtime_operators import (
    as_list,
    commit,
    contents,
    context,
    dead_letter_context,
    keyed_batch,
    owned_keys,
    published_rows,
    written,
)

from cutline.runtime.keyed_operators import Rolling, RollingLogic
from cutline.runtime.operators import UserFunctionError


def reference_mean(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each record with ``value`` replaced by its key's mean so far (the obvious way)."""
    seen: dict[Any, list[Any]] = {}
    out = []
    for record in records:
        values = seen.setdefault(record["key"], [])
        values.append(record["value"])
        out.append({**record, "value": sum(values) / len(values)})
    return out


@pytest.mark.parametrize("columnar", [True, False])
def test_the_running_mean_emits_every_record_with_its_key_s_mean_so_far(columnar: bool) -> None:
    pairs = [("a", 5), ("b", 2), ("a", -1), ("a", 7), ("b", 1), ("c", 0), ("b", 9)]
    running = RollingLogic(Rolling.MEAN, key="key", field="value").open(context(), None)
    batch = keyed_batch(pairs)
    out = as_list(running.process(batch if columnar else batch.to_pylist()))
    assert out == reference_mean(batch.to_pylist())
    assert [r["value"] for r in out] == [5.0, 2.0, 2.0, 11 / 3, 1.5, 0.0, 4.0]
    assert all(type(r["value"]) is float for r in out)
    assert contents(running) == {"mean": {"a": (11, 3), "b": (12, 3), "c": (0, 1)}}


def test_a_restored_running_mean_goes_on_from_the_checkpoint_s_sums_and_counts() -> None:
    first = [("a", 3), ("b", 4), ("a", -2), ("c", 8)]
    second = [("b", 10), ("a", 1), ("c", -8), ("d", 5), ("a", 6)]
    logic = RollingLogic(Rolling.MEAN, key="key", field="value")
    before = logic.open(context(), None)
    before.process(keyed_batch(first))
    state = written(before, 7)
    before.process(keyed_batch([("a", 1000)]))  # after the snapshot: must not leak into it
    after = logic.open(context(), state)
    expected = reference_mean(keyed_batch(first + second).to_pylist())[len(first) :]
    assert as_list(after.process(keyed_batch(second))) == expected


def test_a_running_mean_restored_at_another_parallelism_keeps_each_key_s_mean() -> None:
    keys = [f"k{i}" for i in range(20)]
    logic = RollingLogic(Rolling.MEAN, key="key", field="value")
    whole = logic.open(context(subtask=0, parallelism=1), None)
    whole.process(keyed_batch([(k, i) for i, k in enumerate(keys)]))
    state = written(whole, 1)
    for parallelism in (2, 3):
        for subtask in range(parallelism):
            part = logic.open(context(subtask=subtask, parallelism=parallelism), state)
            mine = owned_keys(keys, subtask, parallelism)
            out = as_list(part.process(keyed_batch([(k, 1) for k in mine])))
            assert out == [{"key": k, "value": (keys.index(k) + 1) / 2} for k in mine]
            assert set(contents(part)["mean"]) == set(mine)


@pytest.mark.parametrize("how", [Rolling.SUM, Rolling.MIN, Rolling.MAX, Rolling.MEAN])
@pytest.mark.parametrize("value", ["3", True, None, [1]])
def test_a_field_that_is_no_number_fails_the_record_naming_it(how: Rolling, value: Any) -> None:
    running = RollingLogic(how, key="key", field="value").open(context(f"{how}(value)"), None)
    with pytest.raises(UserFunctionError, match=f"'value' is .*, not a number \\({how} needs") as e:
        running.process([{"key": "a", "value": 1}, {"key": "a", "value": value}])
    assert e.value.operator == f"{how}(value)"
    assert e.value.user_traceback == ""


@pytest.mark.parametrize("how", [Rolling.SUM, Rolling.MIN, Rolling.MAX, Rolling.MEAN])
def test_a_record_that_is_no_number_goes_to_the_dead_letters_and_its_key_goes_on(
    tmp_path: Path, how: Rolling
) -> None:
    ctx = dead_letter_context(tmp_path / "dead", f"{how}(value)")
    running = RollingLogic(how, key="key", field="value").open(ctx, None)
    values: list[Any] = [4, "x", 2]
    out = running.process([{"key": "a", "value": v} for v in values])
    expected = {
        Rolling.SUM: [4, 6],
        Rolling.MIN: [4, 2],
        Rolling.MAX: [4, 4],
        Rolling.MEAN: [4.0, 3.0],
    }
    assert [r["value"] for r in out] == expected[how]
    commit(ctx, 1)
    (row,) = published_rows(tmp_path / "dead")
    assert json.loads(row["record"]) == {"key": "a", "value": "x"}
    assert row["error"] == f"'value' is str 'x', not a number ({how} needs numbers)"


def test_a_numpy_number_is_a_number() -> None:
    import numpy as np

    running = RollingLogic(Rolling.MAX, key="key", field="value").open(context(), None)
    out = running.process([{"key": "a", "value": np.int32(3)}, {"key": "a", "value": 2.5}])
    assert [r["value"] for r in out] == [3, 3]


@pytest.mark.parametrize(
    ("how", "field"),
    [("sum", "value"), ("min", "value"), ("max", "value"), ("count", None), ("mean", "value")],
)
def test_the_state_of_each_aggregation_keeps_its_name_in_checkpoints(
    how: str, field: str | None
) -> None:
    """Checkpoints know a rolling aggregation's state by its name (``sum``, ...), as they did
    when the aggregation was given as a string: a checkpoint of then restores now."""
    old = RollingLogic(how, key="key", field=field)  # type: ignore[arg-type]  # (as it was)
    assert old == RollingLogic(Rolling(how), key="key", field=field)
    running = old.open(context(), None)
    running.process(keyed_batch([("a", 2), ("a", 3)]))
    state = written(running, 3)
    assert list(contents(running)) == [how]
    restored = RollingLogic(Rolling(how), key="key", field=field).open(context(), state)
    assert contents(restored) == contents(running)


def test_rolling_logic_refuses_an_unknown_aggregation() -> None:
    with pytest.raises(ValueError, match="'median' is not a valid Rolling"):
        RollingLogic("median", key="key", field="value")  # type: ignore[arg-type]
