"""The rolling aggregations of a keyed stream in whole jobs: ``running_sum/min/max/mean/count``,
Flink's names (``sum`` ...) as the same operators, ``on_error`` as the window aggregations
take it, and the running mean across a restart."""

from __future__ import annotations

import json
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from test_runtime_jobs import (
    PARALLELISM,
    FailAfterCheckpoint,
    dead_letters,
    environment,
    mark_checkpoints,
    run,
)
from test_savepoints import SavepointOnHold, endpoints_of, half_of_each_subtask

from cutline import FixedDelay, JobClient, SourceHold, StreamEnvironment, testing
from cutline.runtime.task.local import ThreadLauncher

N = 1024


def spread(record: dict[str, int]) -> dict[str, int]:
    """A key per split of ``from_sequence`` (split ``j`` holds ``j``, ``j + 128``, ...: a key's
    records come in order, so its running values are known), values that differ within a key
    (so sums, extremes and means differ)."""
    v = record["value"]
    return {"key": v % 128, "value": (v * 37) % 101 - 50, "index": v}


def expected(how: str, n: int) -> dict[int, list[Any]]:
    """Per index of an input record, what its output record's ``value`` (or ``count``) is."""
    seen: dict[int, list[int]] = defaultdict(list)
    out: dict[int, list[Any]] = {}
    for v in range(n):
        record = spread({"value": v})
        values = seen[record["key"]]
        values.append(record["value"])
        running = {
            "sum": sum(values),
            "min": min(values),
            "max": max(values),
            "mean": sum(values) / len(values),
            "count": len(values),
        }
        out[v] = [record["key"], running[how]]
    return out


def by_index(output: list[dict[str, Any]], field: str) -> dict[int, list[Any]]:
    return {r["index"]: [r["key"], r[field]] for r in output}


@pytest.mark.parametrize("how", ["sum", "min", "max", "mean", "count"])
@pytest.mark.parametrize("parallelism", [1, 3])
def test_each_running_aggregation_emits_every_record_with_its_key_s_value_so_far(
    tmp_path: Path, how: str, parallelism: int
) -> None:
    env = environment(tmp_path, parallelism)
    keyed = env.from_sequence(0, N).map(spread).key_by("key")
    stream = keyed.running_count() if how == "count" else getattr(keyed, f"running_{how}")("value")
    stream.collect()
    output = run(env).output
    field = "count" if how == "count" else "value"
    assert by_index(output, field) == expected(how, N)
    assert len(output) == N


@pytest.mark.parametrize("how", ["sum", "min", "max", "count"])
def test_flink_s_names_are_the_same_operators(tmp_path: Path, how: str) -> None:
    """Same label, same id: a job written with ``sum`` keeps its state as ``running_sum``."""
    ids = []
    for method in (how, f"running_{how}"):
        env = StreamEnvironment(2, checkpoint_dir=tmp_path / "ck")
        keyed = env.from_sequence(0, 10, name="numbers").key_by("value")
        stream = getattr(keyed, method)() if how == "count" else getattr(keyed, method)("value")
        ids.append((stream.operator.uid, stream.operator.name))
    assert ids[0] == ids[1]
    assert ids[0][1] == ("count" if how == "count" else f"{how}(value)")


def as_pair(record: dict[str, int]) -> tuple[int, int]:
    return (record["value"] % 2, record["value"])


def test_a_field_given_by_its_position_is_deprecated_and_still_works(tmp_path: Path) -> None:
    env = environment(tmp_path, 1)
    pairs = env.from_sequence(0, 6).map(as_pair).key_by(lambda r: r[0])
    with pytest.warns(DeprecationWarning, match=r"sum\(1\): a field given by its position is "):
        pairs.sum(1).collect()
    with pytest.warns(DeprecationWarning, match=r"running_max\('column'\)"):
        pairs.max(1, name="max")
    assert sorted(run(env).output) == [(0, 0), (0, 2), (0, 6), (1, 1), (1, 4), (1, 9)]


def test_a_column_name_does_not_warn(tmp_path: Path) -> None:
    env = environment(tmp_path, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env.from_sequence(0, 3).key_by("value").sum("value")


@pytest.mark.parametrize("field", [1, "", None])
def test_the_running_names_take_a_column_name_only(tmp_path: Path, field: Any) -> None:
    keyed = environment(tmp_path).from_sequence(0, 3).key_by("value")
    with pytest.raises(TypeError, match=f"running_mean takes a column name, not {field!r}"):
        keyed.running_mean(field)


def test_a_column_that_is_missing_or_not_numbers_is_refused_when_the_job_is_built(
    tmp_path: Path,
) -> None:
    env = environment(tmp_path)
    columns = pa.schema([("key", pa.string()), ("value", pa.int64()), ("s", pa.string())])
    (tmp_path / "in").mkdir()
    pq.write_table(
        pa.table({"key": ["a"], "value": [1], "s": ["x"]}, columns), tmp_path / "in/a.parquet"
    )
    stream = env.read_parquet(tmp_path / "in")
    keyed = stream.key_by("key")
    with pytest.raises(ValueError, match=r"mean\('nope'\): the records have no column 'nope'"):
        keyed.running_mean("nope")
    with pytest.raises(ValueError, match=r"min\('s'\): column 's' is string, but min needs"):
        keyed.running_min("s")
    mean = keyed.running_mean("value")
    assert mean.schema == columns.set(1, pa.field("value", pa.float64()))
    assert keyed.running_sum("value").schema == stream.schema


def text_values(record: dict[str, int]) -> dict[str, Any]:
    v = record["value"]
    return {"key": v % 128, "value": "bad" if v % 10 == 0 else v}


@pytest.mark.parametrize("parallelism", PARALLELISM)
def test_on_error_dead_letter_sends_records_that_are_no_numbers_there(
    tmp_path: Path, parallelism: int
) -> None:
    dead = tmp_path / "dead"
    env = environment(tmp_path, parallelism, dead_letter_dir=dead)
    (
        env.from_sequence(0, N)
        .map(text_values)
        .key_by("key")
        .running_sum("value", on_error="dead_letter")
        .collect()
    )
    output = run(env).output
    totals: dict[int, int] = defaultdict(int)
    for v in range(N):
        if v % 10:
            totals[v % 128] += v
    bad = len(range(0, N, 10))
    assert len(output) == N - bad
    assert {k: max(r["value"] for r in output if r["key"] == k) for k in totals} == totals
    rows = dead_letters(dead)
    assert sorted(json.loads(r["record"])["value"] for r in rows) == ["bad"] * bad
    assert {r["operator"] for r in rows} == {"sum(value)"}
    assert {r["error"] for r in rows} == {"'value' is str 'bad', not a number (sum needs numbers)"}


def test_on_error_is_checked_when_the_job_is_built(tmp_path: Path) -> None:
    keyed = environment(tmp_path).from_sequence(0, 3).key_by("value")
    with pytest.raises(ValueError, match="on_error must be 'fail' or 'dead_letter', not 'skip'"):
        keyed.running_count(on_error="skip")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs a dead-letter directory"):
        keyed.running_mean("value", on_error="dead_letter")


@pytest.mark.parametrize("parallelism", PARALLELISM)
def test_a_running_mean_is_exact_across_a_restart_from_a_checkpoint(
    tmp_path: Path, parallelism: int
) -> None:
    marker, flag = tmp_path / "checkpointed", tmp_path / "failed-once"
    n = 600
    env = environment(tmp_path, parallelism, batch_size=2)
    (
        env.from_sequence(0, n)
        .map(spread)
        .key_by("key")
        .running_mean("value", name="means")
        .map(FailAfterCheckpoint(str(marker), str(flag)))
        .collect()
    )
    result = testing.execute(
        env,
        launcher=ThreadLauncher(),
        listener=mark_checkpoints(marker),
        hold_sources=SourceHold(records=n // (2 * parallelism)),
    )
    assert len(result.restarts) == 1
    assert result.restarts[0].restored_from is not None, "the restart restored a checkpoint"
    assert by_index(result.output, "value") == expected("mean", n)
    assert len(result.output) == n


def means_job(tmp_path: Path, parallelism: int, out: Path, checkpoints: str) -> StreamEnvironment:
    env = StreamEnvironment(
        parallelism,
        checkpoint_interval=0.05,
        checkpoint_dir=tmp_path / checkpoints,
        restart_strategy=FixedDelay(delay=0),
        batch_size=8,
        max_parallelism=16,
    )
    (
        env.from_sequence(0, N, name="numbers")
        .map(spread, name="spread")
        .key_by("key")
        .running_mean("value", name="means")
        .write_parquet(out, name="out")
    )
    return env


@pytest.mark.parametrize("after", [1, 3])
def test_a_running_mean_restored_from_a_savepoint_at_another_parallelism_is_exact(
    tmp_path: Path, after: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = tmp_path / "out1", tmp_path / "out2"
    env = means_job(tmp_path, 2, first, "checkpoints")
    ask = SavepointOnHold(
        endpoints_of(monkeypatch),
        lambda _: JobClient(str(tmp_path / "checkpoints")).savepoint(stop=True),
    )
    testing.execute(
        env, launcher=ThreadLauncher(), listener=ask, hold_sources=half_of_each_subtask(N, 2)
    )
    path = ask.answer()
    assert isinstance(path, str), path
    before = ds.dataset(str(first), format="parquet").to_table().to_pylist()
    assert 0 < len(before) < N, "the job stopped in the middle"
    again = means_job(tmp_path, after, second, "checkpoints2")
    result = testing.execute(again, launcher=ThreadLauncher(), restore_from=path)
    assert result.restarts == [] and result.restored_from == path
    rest = ds.dataset(str(second), format="parquet").to_table().to_pylist()
    assert len(before) + len(rest) == N
    assert by_index(before + rest, "value") == expected("mean", N)
