"""Whole jobs through the real runtime (subtask loops, channels on local sockets, checkpoint
coordinator, restarts, exactly-once sinks), with every slot a thread of this process
(:class:`~cutline.runtime.task.local.ThreadLauncher`) instead of a Spark task. Outputs are
compared exactly, as multisets: the order across subtasks is not defined."""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.json as pa_json
import pytest

from cutline import (
    FixedDelay,
    JobFailedError,
    JobResult,
    KeyedProcessFunction,
    ResumableCheckpointError,
    SourceHold,
    StreamEnvironment,
    testing,
)
from cutline.runtime.io.sinks import PENDING
from cutline.runtime.keyed_operators import ProcessContext
from cutline.runtime.task.local import ThreadLauncher
from cutline.runtime.task.snapshot_writer import SnapshotWriter
from cutline.runtime.task.subtask import SubtaskRunner

N = 200
"""Records per job: enough for several batches and checkpoints, few enough to stay fast."""

PARALLELISM = [1, 2, 3]


def environment(tmp_path: Path, parallelism: int = 2, **options: Any) -> StreamEnvironment:
    settings: dict[str, Any] = {
        "checkpoint_interval": 0.05,
        "checkpoint_dir": tmp_path / "checkpoints",
        "restart_strategy": FixedDelay(delay=0),
        "batch_size": 16,
    }
    settings.update(options)
    return StreamEnvironment(parallelism, **settings)


def run(env: StreamEnvironment) -> JobResult:
    result = testing.execute(env, launcher=ThreadLauncher())
    assert result.restarts == []
    assert result.checkpoints, "a bounded job ends with a final checkpoint"
    assert result.checkpoints[-1].final
    return result


def key_value(record: dict[str, int]) -> dict[str, int]:
    return {"key": record["value"] % 7, "value": 1}


def running_values(result: JobResult, field: str = "value") -> Counter[tuple[Any, Any]]:
    return Counter((r["key"], r[field]) for r in result.output)


def expected_running_counts(keys: list[Any]) -> Counter[tuple[Any, int]]:
    """Each key's running count (or sum of ones): 1, 2, ..., its number of records."""
    sizes = Counter(keys)
    return Counter((k, i) for k, n in sizes.items() for i in range(1, n + 1))


# ------------------------------------------------------------------------- stateless


@pytest.mark.parametrize("parallelism", PARALLELISM)
def test_map_filter_and_flat_map_give_exactly_the_expected_records(
    tmp_path: Path, parallelism: int
) -> None:
    env = environment(tmp_path, parallelism)
    (
        env.from_sequence(0, N)
        .map(lambda r: r["value"] * 3)
        .filter(lambda v: v % 2 == 0)
        .flat_map(lambda v: [v, -v] if v % 4 == 0 else [v])
        .collect()
    )
    result = run(env)
    expected = []
    for v in range(N):
        v *= 3
        if v % 2 == 0:
            expected += [v, -v] if v % 4 == 0 else [v]
    assert sorted(result.output) == sorted(expected)
    assert result.generations == 1


def test_a_sequence_with_fewer_records_than_subtasks(tmp_path: Path) -> None:
    env = environment(tmp_path, 3)
    env.from_sequence(10, 12).map(lambda r: r["value"]).collect()
    assert sorted(run(env).output) == [10, 11]


def test_an_empty_sequence_gives_no_records(tmp_path: Path) -> None:
    env = environment(tmp_path, 2)
    env.from_sequence(5, 5).key_by("value").count().collect()
    assert run(env).output == []


@pytest.mark.parametrize("parallelism", PARALLELISM)
def test_union_of_two_sequences_gives_every_record_of_both_once(
    tmp_path: Path, parallelism: int
) -> None:
    env = environment(tmp_path, parallelism)
    first = env.from_sequence(0, N)
    second = env.from_sequence(1000, 1000 + N // 2).map(lambda r: {"value": -r["value"]})
    first.union(second).map(lambda r: r["value"]).collect()
    result = run(env)
    assert sorted(result.output) == sorted([*range(N), *(-v for v in range(1000, 1000 + N // 2))])


def triple_and_tag(batch: pa.RecordBatch) -> pa.RecordBatch:
    values = pc.multiply(batch.column("value"), 3)
    return pa.record_batch({"value": values, "odd": pc.equal(pc.bit_wise_and(values, 1), 1)})


@pytest.mark.parametrize("parallelism", PARALLELISM)
def test_map_batches_with_a_pyarrow_compute_function(tmp_path: Path, parallelism: int) -> None:
    env = environment(tmp_path, parallelism)
    env.from_sequence(0, N).map_batches(triple_and_tag).collect()
    result = run(env)
    assert sorted(result.output, key=lambda r: r["value"]) == [
        {"value": 3 * v, "odd": (3 * v) % 2 == 1} for v in range(N)
    ]


# ------------------------------------------------------------------------------ keyed


@pytest.mark.parametrize("parallelism", PARALLELISM)
def test_key_by_column_sum_of_ones_emits_each_key_s_counts_one_to_n(
    tmp_path: Path, parallelism: int
) -> None:
    env = environment(tmp_path, parallelism)
    env.from_sequence(0, N).map(key_value).key_by("key").sum("value").collect()
    result = run(env)
    assert running_values(result) == expected_running_counts([v % 7 for v in range(N)])


def ones_with_key(batch: pa.RecordBatch) -> pa.RecordBatch:
    values = batch.column("value")
    return pa.record_batch(
        {"key": pc.bit_wise_and(values, 3), "value": pc.add(pc.multiply(values, 0), 1)}
    )


@pytest.mark.parametrize("parallelism", PARALLELISM)
def test_columnar_key_by_and_vectorized_sum_give_exact_running_sums(
    tmp_path: Path, parallelism: int
) -> None:
    env = environment(tmp_path, parallelism)
    env.from_sequence(0, N).map_batches(ones_with_key).key_by("key").sum("value").collect()
    result = run(env)
    assert running_values(result) == expected_running_counts([v & 3 for v in range(N)])


@pytest.mark.parametrize("parallelism", PARALLELISM)
def test_key_by_column_count_adds_each_key_s_running_count(
    tmp_path: Path, parallelism: int
) -> None:
    env = environment(tmp_path, parallelism)
    env.from_sequence(0, N).key_by("value").count().collect()  # every key once
    result = run(env)
    assert sorted((r["value"], r["count"]) for r in result.output) == [(v, 1) for v in range(N)]

    env = environment(tmp_path / "again", parallelism)
    env.from_sequence(0, N).map(key_value).key_by("key").count().collect()
    result = run(env)
    assert running_values(result, "count") == expected_running_counts([v % 7 for v in range(N)])
    assert {r["value"] for r in result.output} == {1}


def scrambled(record: dict[str, int]) -> dict[str, int]:
    v = record["value"]
    return {"key": v % 5, "value": (v * 37) % 101}


def per_key(records: list[dict[str, Any]], field: str = "value") -> dict[Any, list[Any]]:
    grouped: dict[Any, list[Any]] = defaultdict(list)
    for r in records:
        grouped[r["key"]].append(r[field])
    return grouped


@pytest.mark.parametrize("how", ["min", "max"])
@pytest.mark.parametrize("parallelism", PARALLELISM)
def test_key_by_min_and_max_end_at_each_key_s_extreme(
    tmp_path: Path, parallelism: int, how: str
) -> None:
    env = environment(tmp_path, parallelism)
    keyed = env.from_sequence(0, N).map(scrambled).key_by("key")
    (keyed.min("value") if how == "min" else keyed.max("value")).collect()
    result = run(env)
    inputs = per_key([scrambled({"value": v}) for v in range(N)])
    emitted = per_key(result.output)
    extreme = min if how == "min" else max
    assert emitted.keys() == inputs.keys()
    for key, values in inputs.items():
        assert len(emitted[key]) == len(values)  # one running value per record
        assert set(emitted[key]) <= set(values)  # each one a value of the key
        assert extreme(emitted[key]) == extreme(values)  # the final value


def add_up(previous: dict[str, int], record: dict[str, int]) -> dict[str, int]:
    return {
        "key": record["key"],
        "value": previous["value"] + record["value"],
        "n": previous["n"] + 1,
    }


def with_n(record: dict[str, int]) -> dict[str, int]:
    return {"key": record["value"] % 6, "value": record["value"], "n": 1}


@pytest.mark.parametrize("parallelism", PARALLELISM)
def test_key_by_reduce_ends_at_each_key_s_total(tmp_path: Path, parallelism: int) -> None:
    env = environment(tmp_path, parallelism)
    env.from_sequence(0, N).map(with_n).key_by("key").reduce(add_up).collect()
    result = run(env)
    inputs = per_key([with_n({"value": v}) for v in range(N)])
    counts = per_key(result.output, "n")
    totals = per_key(result.output)
    for key, values in inputs.items():
        assert sorted(counts[key]) == list(range(1, len(values) + 1))
        assert max(totals[key]) == sum(values)  # values are not negative: the total is last
        # the record that combined n records carries a sum of n of the key's values
        final = [r for r in result.output if r["key"] == key and r["n"] == len(values)]
        assert [r["value"] for r in final] == [sum(values)]


def tens(record: dict[str, int]) -> int:
    return record["value"] // 10


@pytest.mark.parametrize("parallelism", PARALLELISM)
def test_key_by_a_function(tmp_path: Path, parallelism: int) -> None:
    env = environment(tmp_path, parallelism)
    env.from_sequence(0, N).key_by(tens).count().collect()
    result = run(env)
    assert sorted(r["value"] for r in result.output) == list(range(N))
    assert Counter((r["value"] // 10, r["count"]) for r in result.output) == (
        expected_running_counts([v // 10 for v in range(N)])
    )

    env = environment(tmp_path / "lambda", parallelism)
    (
        env.from_sequence(0, N)
        .map(lambda r: {"k": r["value"] % 3, "value": r["value"]})
        .key_by(lambda r: r["k"])
        .sum("value")
        .collect()
    )
    result = run(env)
    for key in range(3):
        values = [v for v in range(N) if v % 3 == key]
        sums = [r["value"] for r in result.output if r["k"] == key]
        assert len(sums) == len(values)
        assert max(sums) == sum(values)  # values are not negative: the total is the last


class Summary(KeyedProcessFunction):
    """Keeps a total (value state), the values seen (list state) and per-parity counts (map
    state); emits the key's summary after every record."""

    def open(self, ctx: ProcessContext) -> None:
        self.total = ctx.value_state("total")
        self.seen = ctx.list_state("seen")
        self.parity = ctx.map_state("parity")

    def process(self, record: dict[str, Any], ctx: ProcessContext) -> list[dict[str, Any]]:
        value = record["value"]
        if ctx.key != value % 4:
            raise AssertionError(f"ctx.key {ctx.key!r} is not the record's key")
        self.total.update(self.total.get(0) + value)
        self.seen.add(value)
        parity = "even" if value % 2 == 0 else "odd"
        self.parity.put(parity, self.parity.get(parity, 0) + 1)
        return [
            {
                "key": ctx.key,
                "total": self.total.get(),
                "n": len(self.seen.get()),
                "seen": sorted(self.seen.get()),
                "parity": dict(self.parity.items()),
            }
        ]


def mod4(record: dict[str, int]) -> int:
    return record["value"] % 4


@pytest.mark.parametrize("parallelism", PARALLELISM)
def test_a_keyed_process_function_with_value_list_and_map_state(
    tmp_path: Path, parallelism: int
) -> None:
    env = environment(tmp_path, parallelism)
    env.from_sequence(0, N).key_by(mod4).process(Summary()).collect()
    result = run(env)
    assert len(result.output) == N
    for key in range(4):
        values = [v for v in range(N) if v % 4 == key]
        emitted = [r for r in result.output if r["key"] == key]
        assert sorted(r["n"] for r in emitted) == list(range(1, len(values) + 1))
        for r in emitted:
            assert r["total"] == sum(r["seen"])
            assert len(r["seen"]) == r["n"]
            assert sum(r["parity"].values()) == r["n"]
        (last,) = [r for r in emitted if r["n"] == len(values)]
        assert last["seen"] == values
        assert last["total"] == sum(values)
        parity = "even" if key % 2 == 0 else "odd"
        assert last["parity"] == {parity: len(values)}


# ---------------------------------------------------------------------- file outputs


def no_pending_output(directory: Path) -> bool:
    pending = directory / PENDING
    return not pending.exists() or not any(pending.iterdir())


@pytest.mark.parametrize("parallelism", PARALLELISM)
def test_write_parquet_publishes_every_record_once(tmp_path: Path, parallelism: int) -> None:
    out = tmp_path / "out"
    env = environment(tmp_path, parallelism)
    env.from_sequence(0, N).map(key_value).key_by("key").sum("value").write_parquet(out)
    run(env)
    table = ds.dataset(str(out), format="parquet").to_table()  # skips _pending
    records = table.to_pylist()
    assert Counter((r["key"], r["value"]) for r in records) == expected_running_counts(
        [v % 7 for v in range(N)]
    )
    assert no_pending_output(out)
    assert all(p.name.startswith("part-") for p in out.iterdir() if p.name != PENDING)


@pytest.mark.parametrize("parallelism", PARALLELISM)
def test_write_jsonl_publishes_every_record_once(tmp_path: Path, parallelism: int) -> None:
    out = tmp_path / "out"
    env = environment(tmp_path, parallelism)
    env.from_sequence(0, N).map(lambda r: {"v": r["value"], "s": str(r["value"])}).write_jsonl(out)
    run(env)
    records = []
    for path in sorted(out.glob("*.jsonl")):
        records += pa_json.read_json(str(path)).to_pylist()
        records_text = [json.loads(line) for line in path.read_text().splitlines()]
        assert all(set(r) == {"v", "s"} for r in records_text)
    assert sorted(records, key=lambda r: r["v"]) == [{"v": v, "s": str(v)} for v in range(N)]
    assert no_pending_output(out)


def test_two_sinks_of_one_job_each_get_every_record(tmp_path: Path) -> None:
    env = environment(tmp_path, 2)
    numbers = env.from_sequence(0, N)
    numbers.map(lambda r: {"value": r["value"] * 2}).write_parquet(tmp_path / "doubled")
    numbers.filter(lambda r: r["value"] % 5 == 0).write_jsonl(tmp_path / "fives")
    run(env)
    doubled = ds.dataset(str(tmp_path / "doubled"), format="parquet").to_table()
    assert sorted(doubled["value"].to_pylist()) == [2 * v for v in range(N)]
    fives = [
        r
        for p in (tmp_path / "fives").glob("*.jsonl")
        for r in pa_json.read_json(str(p)).to_pylist()
    ]
    assert sorted(r["value"] for r in fives) == list(range(0, N, 5))


def test_an_output_directory_that_already_holds_files_is_refused_when_the_job_runs(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "part-old.parquet").write_bytes(b"x")
    for write in ("write_parquet", "write_jsonl"):
        env = environment(tmp_path)
        getattr(env.from_sequence(0, 10), write)(out)
        with pytest.raises(ValueError, match=r"already holds 1 file\(s\).*restore_from"):
            testing.execute(env, launcher=ThreadLauncher())
    assert sorted(p.name for p in out.iterdir()) == ["part-old.parquet"]


def test_an_output_directory_with_only_pending_and_hidden_files_is_accepted(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    (out / PENDING).mkdir(parents=True)
    (out / ".hidden").write_text("x")
    env = environment(tmp_path)
    env.from_sequence(0, 10).write_parquet(out)
    run(env)
    assert sorted(ds.dataset(str(out), format="parquet").to_table()["value"].to_pylist()) == list(
        range(10)
    )


# -------------------------------------------------------------------- failures, restarts


@dataclass(frozen=True)
class FailOnce:
    """Raises on record ``at`` the first time any copy of it sees that record (a flag file
    remembers it across restarts and copies)."""

    flag: str
    at: int
    field: str = "value"

    @property
    def __name__(self) -> str:
        return "fail_once"

    def __call__(self, record: dict[str, int]) -> dict[str, int]:
        if record[self.field] == self.at:
            try:
                os.close(os.open(self.flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return record
            raise RuntimeError(f"injected failure at {self.at}")
        return record


def key_value_keeping_index(record: dict[str, int]) -> dict[str, int]:
    return {"key": record["value"] % 7, "value": 1, "index": record["value"]}


@pytest.mark.parametrize("parallelism", PARALLELISM)
def test_an_exception_raised_once_restarts_once_and_the_output_is_exact(
    tmp_path: Path, parallelism: int
) -> None:
    env = environment(tmp_path, parallelism, batch_size=4)
    flag = tmp_path / "failed-once"
    (
        env.from_sequence(0, N)
        .map(key_value_keeping_index)
        .key_by("key")
        .sum("value")
        .map(FailOnce(str(flag), N - 20, field="index"))
        .collect()
    )
    result = testing.execute(env, launcher=ThreadLauncher())
    assert flag.exists()
    assert len(result.restarts) == 1
    assert result.generations == 2
    assert result.restarts[0].generation == 1
    assert result.checkpoints[-1].final
    assert result.checkpoints[-1].generation == 2
    assert running_values(result) == expected_running_counts([v % 7 for v in range(N)])
    assert sorted(r["index"] for r in result.output) == list(range(N))


@dataclass(frozen=True)
class FailAfterCheckpoint:
    """Raises once, on the first record it sees after ``marker`` exists."""

    marker: str
    flag: str

    def __call__(self, record: Any) -> Any:
        if os.path.exists(self.marker):
            try:
                os.close(os.open(self.flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return record
            raise RuntimeError("injected failure after a checkpoint")
        return record


def mark_checkpoints(marker: Path) -> Callable[[str, str], None]:
    def listener(kind: str, message: str) -> None:
        if kind == "checkpoint":
            marker.touch()

    return listener


@pytest.mark.parametrize("parallelism", PARALLELISM)
def test_a_restart_restores_keyed_state_offsets_and_output_from_a_checkpoint(
    tmp_path: Path, parallelism: int
) -> None:
    """The failure comes on the first record after a checkpoint completed: the sources hold
    half-way until one has, so there is always input left to fail on, however fast the job."""
    marker, flag, out = tmp_path / "checkpointed", tmp_path / "failed-once", tmp_path / "out"
    n = 1000
    env = environment(tmp_path, parallelism, batch_size=2)
    summed = (
        env.from_sequence(0, n)
        .map(key_value_keeping_index)
        .key_by("key")
        .sum("value")
        .map(FailAfterCheckpoint(str(marker), str(flag)))
    )
    summed.collect()
    summed.write_parquet(out)
    result = testing.execute(
        env,
        launcher=ThreadLauncher(),
        listener=mark_checkpoints(marker),
        hold_sources=SourceHold(records=n // (2 * parallelism)),
    )
    assert len(result.restarts) == 1
    assert result.restarts[0].restored_from is not None, "the restart restored a checkpoint"
    assert result.checkpoints[-1].final
    expected = expected_running_counts([v % 7 for v in range(n)])
    assert running_values(result) == expected
    assert sorted(r["index"] for r in result.output) == list(range(n))
    written = ds.dataset(str(out), format="parquet").to_table().to_pylist()
    assert Counter((r["key"], r["value"]) for r in written) == expected
    assert no_pending_output(out)


def test_a_restart_with_file_output_publishes_every_record_once(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = environment(tmp_path, 2, batch_size=4)
    flag = tmp_path / "failed-once"
    env.from_sequence(0, N).map(FailOnce(str(flag), N // 2)).write_parquet(out)
    result = testing.execute(env, launcher=ThreadLauncher())
    assert len(result.restarts) == 1
    values = ds.dataset(str(out), format="parquet").to_table()["value"].to_pylist()
    assert sorted(values) == list(range(N))
    assert no_pending_output(out)


def bad(record: dict[str, int]) -> dict[str, int]:
    if record["value"] == 7:
        raise ValueError("seven is a bad value")  # the line the error shows
    return record


def test_an_exception_raised_every_time_fails_the_job_naming_operator_subtask_record_line(
    tmp_path: Path,
) -> None:
    env = environment(tmp_path, 2, restart_strategy=FixedDelay(1, delay=0))
    env.from_sequence(0, 20).map(bad).collect()
    with pytest.raises(JobFailedError) as info:
        testing.execute(env, launcher=ThreadLauncher())
    message = str(info.value)
    # the same record failed twice in a row: not restarted again (a restart cannot help)
    assert "the job failed after 2 attempt(s), not restarted: it failed at the same record" in (
        message
    )
    assert info.value.deterministic
    # 7 is read by subtask 1 of the source chain (the sequence is dealt round-robin)
    source = env.plan().chains[0].uid  # the unnamed source's id: "sequence-" and a digest
    assert f"map(bad) (subtask {source}-1)" in message
    assert "record: {'value': 7}" in message
    assert "ValueError: seven is a bad value" in message
    assert 'raise ValueError("seven is a bad value")  # the line the error shows' in message
    assert "test_runtime_jobs.py" in message
    assert info.value.operator == "map(bad)"
    assert info.value.subtask == f"{source}-1"
    assert info.value.user_traceback is not None
    assert "in bad" in info.value.user_traceback


def test_a_user_error_is_reported_even_if_reporting_it_takes_a_while(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = SubtaskRunner._report

    def slow_report(self: SubtaskRunner, exc: BaseException) -> None:
        time.sleep(0.3)  # e.g. a busy control connection: longer than the supervisor's poll
        original(self, exc)

    monkeypatch.setattr(SubtaskRunner, "_report", slow_report)
    env = environment(tmp_path, 1, restart_strategy=FixedDelay(0, delay=0))
    env.from_sequence(0, 20).map(bad).collect()
    with pytest.raises(JobFailedError) as info:
        testing.execute(env, launcher=ThreadLauncher())
    assert info.value.operator == "map(bad)", str(info.value)
    assert "record: {'value': 7}" in str(info.value)


def test_no_restart_attempts_fails_on_the_first_error(tmp_path: Path) -> None:
    env = environment(tmp_path, 1, restart_strategy=FixedDelay(0, delay=0))
    env.from_sequence(0, 20).key_by("value").sum("value").map(bad).collect()
    with pytest.raises(
        JobFailedError,
        match=r"after 1 attempt\(s\), not restarted: FixedDelay\(attempts=0, delay=0.0\) used",
    ):
        testing.execute(env, launcher=ThreadLauncher())


def dead_letters(directory: Path) -> list[dict[str, Any]]:
    rows = []
    for path in sorted(directory.rglob("*.jsonl")):
        if PENDING not in path.parts:
            rows += [json.loads(line) for line in path.read_text().splitlines()]
    return rows


def reject_tens(record: dict[str, int]) -> dict[str, int]:
    if record["value"] % 10 == 0:
        raise ValueError(f"{record['value']} is a multiple of ten")
    return {"value": record["value"]}


@pytest.mark.parametrize("parallelism", PARALLELISM)
def test_dead_letters_get_the_bad_records_and_the_good_ones_flow_on(
    tmp_path: Path, parallelism: int
) -> None:
    dead = tmp_path / "dead"
    env = environment(tmp_path, parallelism, dead_letter_dir=dead)
    (
        env.from_sequence(0, N)
        .key_by("value")
        .count()
        .map(reject_tens, on_error="dead_letter")
        .collect()
    )
    result = run(env)
    assert sorted(r["value"] for r in result.output) == [v for v in range(N) if v % 10]
    rows = dead_letters(dead)
    assert sorted(json.loads(r["record"])["value"] for r in rows) == list(range(0, N, 10))
    for row in rows:
        record = json.loads(row["record"])
        assert record["count"] == 1
        assert row["operator"] == "map(reject_tens)"
        assert row["error"] == f"ValueError: {record['value']} is a multiple of ten"
        assert "in reject_tens" in row["traceback"]
        assert 0 <= row["subtask"] < parallelism


@pytest.mark.parametrize("restore", [False, True])
def test_dead_letters_are_written_once_across_a_restart(tmp_path: Path, restore: bool) -> None:
    """With ``restore``, the failure comes after a checkpoint completed, while the sources hold
    half-way: the restart restores it, with input left."""
    dead, flag, marker = tmp_path / "dead", tmp_path / "failed-once", tmp_path / "checkpointed"
    n = 600 if restore else N
    env = environment(tmp_path, 2, dead_letter_dir=dead, batch_size=2)
    failing = FailAfterCheckpoint(str(marker), str(flag)) if restore else FailOnce(str(flag), n - 3)
    env.from_sequence(0, n).map(reject_tens, on_error="dead_letter").map(failing).collect()
    result = testing.execute(
        env,
        launcher=ThreadLauncher(),
        listener=mark_checkpoints(marker),
        hold_sources=SourceHold(records=n // 4) if restore else None,
    )
    assert len(result.restarts) == 1
    if restore:
        assert result.restarts[0].restored_from is not None
    assert sorted(r["value"] for r in result.output) == [v for v in range(n) if v % 10]
    records = sorted(json.loads(r["record"])["value"] for r in dead_letters(dead))
    assert records == list(range(0, n, 10))
    assert all(no_pending_output(chain) for chain in dead.iterdir())


def test_dead_letter_mode_needs_a_dead_letter_directory(tmp_path: Path) -> None:
    env = environment(tmp_path)
    with pytest.raises(ValueError, match="needs a dead-letter directory"):
        env.from_sequence(0, 3).map(bad, on_error="dead_letter")


# ------------------------------------------------------------------------ checkpoints


def test_without_a_checkpoint_interval_only_the_final_checkpoint_is_taken(
    tmp_path: Path,
) -> None:
    env = environment(tmp_path, 2, checkpoint_interval=None)
    env.from_sequence(0, N).map(key_value).key_by("key").sum("value").collect()
    result = run(env)
    assert [c.final for c in result.checkpoints] == [True]
    assert result.checkpoints[-1].generation == 1
    assert running_values(result) == expected_running_counts([v % 7 for v in range(N)])


def test_checkpoint_ids_increase_and_only_the_last_is_final(tmp_path: Path) -> None:
    env = environment(tmp_path, 2, batch_size=1)
    env.from_sequence(0, N).map(key_value).key_by("key").count().collect()
    result = run(env)
    ids = [c.checkpoint_id for c in result.checkpoints]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    assert [c.final for c in result.checkpoints] == [False] * (len(ids) - 1) + [True]


def test_a_second_run_in_the_same_checkpoint_directory_starts_from_scratch_when_told(
    tmp_path: Path,
) -> None:
    """Without ``fresh=True`` it is refused (``test_fresh_or_resume.py``)."""
    for attempt in range(2):
        env = environment(tmp_path, 2)
        env.from_sequence(0, 50).map(key_value).key_by("key").sum("value").collect()
        if attempt:
            with pytest.raises(ResumableCheckpointError):
                run(env)
        result = testing.execute(env, launcher=ThreadLauncher(), fresh=attempt > 0)
        assert running_values(result) == expected_running_counts([v % 7 for v in range(50)])


# ---------------------------------------------------------------- unbounded, storage URLs


class FirstBatch:
    """Passes batches on; touches ``path`` when its copy sees its first one."""

    __name__ = "first_batch"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen = False

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if not self.seen:
            self.seen = True
            self.path.touch()
        return batch


def once_something_was_read(path: Path) -> Callable[[str, str], None]:
    """A listener that keeps the driver, when the job starts running, until ``path`` exists
    (a batch went through :class:`FirstBatch`): however slowly the job started, a
    ``stop_after`` then stops a job that read something (the wait is on the records, not on
    a clock; 60 s only so that a broken job cannot hang the test)."""

    def listener(kind: str, message: str) -> None:
        if kind == "running":
            deadline = time.monotonic() + 60
            while not path.exists() and time.monotonic() < deadline:
                time.sleep(0.005)

    return listener


@pytest.mark.parametrize("parallelism", [1, 3])
def test_an_unbounded_sequence_stops_gracefully_with_every_record_read_published_once(
    tmp_path: Path, parallelism: int
) -> None:
    env = environment(tmp_path, parallelism, batch_size=100)
    read = tmp_path / "read"
    env.from_sequence(0, None).map_batches(FirstBatch(read)).collect()
    result = testing.execute(
        env, launcher=ThreadLauncher(), stop_after=0.5, listener=once_something_was_read(read)
    )
    assert result.restarts == []
    assert result.checkpoints[-1].final
    values = sorted(r["value"] for r in result.output)
    assert len(values) == len(set(values)) > 0
    # split j of the 128 emits j, j + 128, j + 256, ...: what it read before the stop is a
    # prefix of that
    for split in range(128):
        mine = [v for v in values if v % 128 == split]
        assert mine == list(range(split, split + 128 * len(mine), 128))
    read = sum(n for name, n in result.records_in.items() if "sequence" in name)
    assert read == len(values)


def test_checkpoints_and_collected_output_on_an_fsspec_url(tmp_path: Path) -> None:
    env = environment(tmp_path, 2, checkpoint_dir=f"memory://cutline-test-{os.getpid()}/ck")
    env.from_sequence(0, N).map(key_value).key_by("key").sum("value").collect()
    result = run(env)
    keys = [v % 7 for v in range(N)]
    assert running_values(result) == expected_running_counts(keys)


# ------------------------------------------------------- findings of the runtime's review


def fail_on_seven(record: dict[str, int]) -> dict[str, int]:
    if record["value"] % 10 == 7:
        raise ValueError(f"bad {record['value']}")
    return record


def test_a_second_run_never_touches_the_first_runs_dead_letters(tmp_path: Path) -> None:
    dead = tmp_path / "dead"
    for run_number in (1, 2):
        env = environment(
            tmp_path, 2, dead_letter_dir=dead, restart_strategy=FixedDelay(1, delay=0)
        )
        stream = env.from_sequence(0, 50).map(fail_on_seven, on_error="dead_letter")
        if run_number == 2:  # the second run also restarts once, before any checkpoint
            stream = stream.map(FailFirstTime(tmp_path / "flag"))
        stream.collect()
        testing.execute(env, launcher=ThreadLauncher(), fresh=run_number == 2)
    letters = [
        json.loads(line)
        for part in dead.rglob("part-*.jsonl")
        for line in part.read_text().splitlines()
    ]
    assert sorted(json.loads(d["record"])["value"] for d in letters) == sorted(
        [7, 17, 27, 37, 47] * 2
    )


class FailFirstTime:
    def __init__(self, flag: Path) -> None:
        self.flag = flag

    def __call__(self, record: dict[str, int]) -> dict[str, int]:
        if not self.flag.exists():
            self.flag.touch()
            raise RuntimeError("once")
        return record


def test_executing_twice_into_one_output_directory_is_refused_the_second_time(
    tmp_path: Path,
) -> None:
    env = environment(tmp_path, 2)
    env.from_sequence(0, 20).write_jsonl(tmp_path / "out")
    testing.execute(env, launcher=ThreadLauncher())
    with pytest.raises(ValueError, match=r"already holds .* file"):
        testing.execute(env, launcher=ThreadLauncher(), fresh=True)


def test_one_directory_spelled_two_ways_is_refused(tmp_path: Path) -> None:
    env = environment(tmp_path, 2)
    stream = env.from_sequence(0, 20)
    stream.write_parquet(f"{tmp_path}/out")
    with pytest.raises(ValueError, match="two sinks write to"):
        stream.write_parquet(f"{tmp_path}/out/")


def test_a_dead_letter_directory_inside_an_output_directory_is_refused(tmp_path: Path) -> None:
    env = environment(tmp_path, 2, dead_letter_dir=tmp_path / "out" / "dead")
    env.from_sequence(0, 20).write_parquet(tmp_path / "out")
    with pytest.raises(ValueError, match="overlap"):
        testing.execute(env, launcher=ThreadLauncher())


def customer_of(record: dict[str, Any]) -> Any:
    return record["customer"]


def test_a_failing_key_function_names_key_by_the_operator_and_the_record(tmp_path: Path) -> None:
    env = environment(tmp_path, 2, restart_strategy=FixedDelay(0, delay=0))
    env.from_sequence(0, 20).key_by(customer_of).count().collect()
    with pytest.raises(JobFailedError) as info:
        testing.execute(env, launcher=ThreadLauncher())
    assert info.value.operator == "key_by(customer_of) of count"
    assert "KeyError: 'customer'" in str(info.value)
    assert "record: {'value': " in str(info.value)
    assert 'return record["customer"]' in str(info.value)


def test_some_records_without_a_key_fail_the_job_by_default(tmp_path: Path) -> None:
    env = environment(tmp_path, 2, dead_letter_dir=tmp_path / "dead")
    (
        env.from_sequence(0, 30)
        .map(lambda r: {"customer": r["value"]} if r["value"] % 3 else {"other": 1})
        .key_by(customer_of)
        .count(name="counting")
        .collect()
    )
    # the key function belongs to the keyed operator: its on_error applies (default: fail)
    with pytest.raises(JobFailedError):
        testing.execute(env, launcher=ThreadLauncher())


def huge_error(record: dict[str, int]) -> dict[str, int]:
    if record["value"] == 3:
        raise ValueError("x" * 3_000_000)
    return record


def test_an_error_with_a_huge_message_is_still_reported_as_the_users(tmp_path: Path) -> None:
    env = environment(tmp_path, 2, restart_strategy=FixedDelay(0, delay=0))
    env.from_sequence(0, 10).map(huge_error).collect()
    with pytest.raises(JobFailedError) as info:
        testing.execute(env, launcher=ThreadLauncher())
    assert info.value.operator == "map(huge_error)"
    assert "characters left out" in str(info.value)


def add_in_place(acc: dict[str, int], record: dict[str, int]) -> dict[str, int]:
    acc["value"] += record["value"]
    return acc


def test_a_reduce_that_changes_its_accumulator_in_place_does_not_rewrite_earlier_output(
    tmp_path: Path,
) -> None:
    env = environment(tmp_path, 1)
    env.from_sequence(0, 10).map(lambda r: {"key": "k", "value": 1}).key_by("key").reduce(
        add_in_place
    ).collect()
    result = run(env)
    assert sorted(r["value"] for r in result.output) == list(range(1, 11))


def half_then_fail(record: dict[str, int]) -> Any:
    yield {"v": record["value"], "part": 1}
    if record["value"] == 3:
        raise ValueError("halfway")
    yield {"v": record["value"], "part": 2}


def test_a_flat_map_failing_halfway_emits_nothing_for_that_record(tmp_path: Path) -> None:
    env = environment(tmp_path, 1, dead_letter_dir=tmp_path / "dead")
    env.from_sequence(0, 6).flat_map(half_then_fail, on_error="dead_letter").collect()
    result = run(env)
    assert sorted((r["v"], r["part"]) for r in result.output) == [
        (v, p) for v in (0, 1, 2, 4, 5) for p in (1, 2)
    ]


LOCK = threading.Lock()


def with_a_lock_at_50(record: dict[str, int]) -> dict[str, Any]:
    return {"v": record["value"], "lock": LOCK} if record["value"] == 50 else record


def test_a_record_the_sink_cannot_write_fails_the_job_naming_the_sink(tmp_path: Path) -> None:
    """The sink writes its part file on the snapshot thread; a record it cannot encode still
    fails the subtask (naming the sink and the file), not only that checkpoint."""
    env = environment(tmp_path, 1, batch_size=10, restart_strategy=FixedDelay(1, delay=0))
    env.from_sequence(0, 200).map(with_a_lock_at_50, name="bad").collect()
    with pytest.raises(JobFailedError) as failed:
        testing.execute(env, launcher=ThreadLauncher(), progress=False)
    assert failed.value.operator == "collect(collect)"
    assert "SinkError: cannot write " in str(failed.value)
    assert "TypeError: cannot pickle '_thread.lock' object" in str(failed.value)


class FailWhileTheSinkWrites:
    """Fails once, on the first record after ``flag`` exists (a sink's part file is being
    written then, slowly); ``flag``'s folder gets the file ``failed`` when it does."""

    __name__ = "fail_while_writing"

    def __init__(self, flag: Path) -> None:
        self.flag = flag

    def __call__(self, record: dict[str, int]) -> dict[str, int]:
        if self.flag.exists() and not (self.flag.parent / "failed").exists():
            (self.flag.parent / "failed").touch()
            raise RuntimeError("injected failure while the sink's part is being written")
        return {"v": record["value"]}


def test_a_slow_part_file_write_ends_with_its_generation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A part file still being written when its generation fails is written before the next
    generation recovers the sink (which removes what was not pre-committed in the restored
    checkpoint): no stray file stays in _pending, and no incomplete checkpoint folder.

    The sources hold half-way until a checkpoint completed; the first part written after that
    one is slow, and the map fails on the next record meanwhile (the write waits for the
    failure). The source is rate-limited, so that the half it reads after the hold lasts at
    least half a second: a checkpoint is triggered while it reads."""
    from cutline.runtime.io import sinks

    flag, failed = tmp_path / "writing", tmp_path / "failed"
    checkpointed = threading.Event()
    original = sinks.FileSinkWriter._write_file

    def slow_write(self: Any, path: str, batches: list[Any]) -> None:
        if checkpointed.is_set() and not flag.exists():  # a part after a complete checkpoint
            flag.touch()
            deadline = time.monotonic() + 1.5
            while not failed.exists() and time.monotonic() < deadline:
                time.sleep(0.005)
            time.sleep(0.3)  # the generation is failing: the write goes on a while yet
        original(self, path, batches)

    def listener(kind: str, message: str) -> None:
        if kind == "checkpoint":
            checkpointed.set()

    monkeypatch.setattr(sinks.FileSinkWriter, "_write_file", slow_write)
    env = environment(tmp_path, 1, batch_size=10)
    out = tmp_path / "out"
    (
        env.from_sequence(0, 2000, rate_limit=2000)
        .key_by("value")
        .map(FailWhileTheSinkWrites(flag), name="m")
        .write_jsonl(str(out))
    )
    result = testing.execute(
        env,
        launcher=ThreadLauncher(),
        progress=False,
        listener=listener,
        hold_sources=SourceHold(records=1000),
    )
    assert failed.exists()
    assert len(result.restarts) == 1
    assert sorted(os.listdir(out / PENDING)) == []
    values = [json.loads(line)["v"] for part in out.glob("part-*") for line in part.open()]
    assert sorted(values) == list(range(2000))
    checkpoints = tmp_path / "checkpoints"
    assert all((p / "_metadata").exists() for p in checkpoints.glob("chk-*"))


def test_a_slot_does_not_wait_for_a_snapshot_write_that_was_cancelled() -> None:
    """A subtask that ends (its generation failed) just after it took a checkpoint has that
    checkpoint's write queued on its snapshot thread; the shutdown cancels it, and the slot
    must not wait for it (it waited ten seconds, the restart with it)."""
    executor = ThreadPoolExecutor(1)
    started, release = threading.Event(), threading.Event()
    in_progress = executor.submit(lambda: (started.set(), release.wait(30)))
    queued = executor.submit(lambda: None)
    assert started.wait(30)
    executor.shutdown(wait=False, cancel_futures=True)  # as SnapshotWriter.shutdown(cancel=True)
    release.set()
    in_progress.result(30)
    assert queued.cancelled()
    writer = SimpleNamespace(_writes=[in_progress, queued])
    # an hour: it returns at once, or (waiting for the cancelled write) the test times out
    SnapshotWriter.wait(writer, 3600.0)  # type: ignore[arg-type]
