"""End-to-end jobs on a real local Spark session: exact output with no failure, after an
exception in user code, after a SIGKILL of a worker process, with a corrupt latest checkpoint,
at parallelism 1, 2 and 4, and with a slow operator.

Every test checks the published output exactly: the keyed running sum of B1's shape (value 1
per event) must emit, for every key, the running sums 1..n each exactly once.
"""

from __future__ import annotations

import json
import random
import threading
import time
import warnings
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute
import pyarrow.dataset
import pytest

from cutline import (
    Checkpoints,
    CheckpointWarning,
    FixedDelay,
    JobFailedError,
    KeyedProcessFunction,
    SourceHold,
    StreamEnvironment,
    testing,
)
from cutline.demo import WorkerKiller, check_b1_output, write_b1_input
from cutline.examples.connected_components import components, edge_stream, expected_labels
from cutline.runtime.checkpoint.storage import CheckpointStorage
from cutline.spark.launcher import SparkSetupError

KEYS = 1000


@pytest.fixture(scope="module")
def events(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """200,000 events over 1,000 keys (value 1), in 20 Parquet files."""
    directory = tmp_path_factory.mktemp("events")
    write_b1_input(directory, 200_000, KEYS)
    return directory


SMALL = 50_000
"""Events of the smaller input: for the jobs whose operators are slow on purpose (the load of
a backpressure test is a sleep per batch: a smaller input takes proportionally less)."""


@pytest.fixture(scope="module")
def small_events(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """50,000 events over 1,000 keys (value 1), in 20 Parquet files."""
    directory = tmp_path_factory.mktemp("small_events")
    write_b1_input(directory, SMALL, KEYS)
    return directory


def _env(tmp_path: Path, parallelism: int = 2, **settings: object) -> StreamEnvironment:
    options: dict[str, object] = {
        "checkpoint_interval": 0.3,
        "checkpoint_dir": str(tmp_path / "ck"),
        "restart_strategy": FixedDelay(delay=0),
        "batch_size": 2000,
    }
    options.update(settings)
    return StreamEnvironment(parallelism, **options)  # type: ignore[arg-type]


def _assert_exact(output: Path, per_key: int = 200) -> None:
    verdict = check_b1_output(output, KEYS, per_key)
    assert verdict.wrong_keys == []
    assert verdict.rows == KEYS * per_key
    assert verdict.exact


def _execute_killing(env: StreamEnvironment, spark, killer: WorkerKiller, hold: int):
    """Run the job with ``killer`` armed: it kills when its timer says, or at the latest on the
    first checkpoint completed while the sources hold after ``hold`` records each (so the kill
    always lands in a running job, however fast the machine); it must have killed a worker."""
    try:
        result = testing.execute(
            env,
            spark,
            on_ready=killer.on_ready,
            listener=killer,
            hold_sources=SourceHold(records=hold),
        )
    finally:
        killer.disarm()  # never kill a reused worker of a later test
    assert killer.killed_at is not None
    return result


def slow_batches(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A deliberately slow operator: 20 ms per batch."""
    time.sleep(0.02)
    return batch


@pytest.mark.parametrize("parallelism", [1, 2, 4])
def test_keyed_sum_is_exact_at_every_parallelism(spark, events, tmp_path, parallelism):
    env = _env(tmp_path, parallelism)
    env.read_parquet(events).key_by("key").sum("value").write_parquet(tmp_path / "out")
    result = env.execute(spark)
    _assert_exact(tmp_path / "out")
    assert result.restarts == []
    assert result.checkpoints[-1].final
    source = env.plan().chains[0].uid  # the unnamed source's id: "read_parquet-" and a digest
    assert sum(result.records_in[f"{source}-{i}"] for i in range(parallelism)) == 200_000
    assert not list((tmp_path / "out" / "_pending").iterdir())


class Tally(KeyedProcessFunction):
    """Value, list and map state together: count, last three values, and values seen."""

    def open(self, ctx):
        self.count = ctx.value_state("count")
        self.recent = ctx.list_state("recent")
        self.seen = ctx.map_state("seen")

    def process(self, record, ctx):
        count = self.count.get(0) + 1
        self.count.update(count)
        self.recent.update([*self.recent.get()[-2:], record["value"]])
        self.seen.put(record["value"] % 3, True)
        yield {"key": ctx.key, "count": count, "recent": len(self.recent.get())}


def test_process_function_with_keyed_state_collects_exactly(spark, tmp_path):
    env = _env(tmp_path)
    (
        env.from_sequence(0, 30_000)
        .map(lambda r: {"key": r["value"] % 7, "value": r["value"]})
        .key_by("key")
        .process(Tally())
        .collect()
    )
    output = env.execute(spark).output
    assert len(output) == 30_000
    per_key = Counter(r["key"] for r in output)
    for key, n in per_key.items():
        counts = sorted(r["count"] for r in output if r["key"] == key)
        assert counts == list(range(1, n + 1))
    assert sum(per_key.values()) == 30_000


class FailOnce:
    """Raises on one record, the first time only (a flag file remembers across processes)."""

    def __init__(self, flag: Path, bad: str) -> None:
        self.flag, self.bad = flag, bad

    def __call__(self, record: dict) -> dict:
        if record["key"] == self.bad and not self.flag.exists():
            self.flag.touch()
            raise ValueError(f"injected failure on {record['key']}")
        return record


def test_an_exception_at_a_random_record_restarts_and_output_is_exact(spark, events, tmp_path):
    bad = f"k{random.Random(3).randrange(KEYS)}"
    env = _env(tmp_path)
    fail_once = FailOnce(tmp_path / "failed-once", bad)
    (
        env.read_parquet(events)
        .map(fail_once, name="inject")
        .key_by("key")
        .sum("value")
        .write_parquet(tmp_path / "out")
    )
    result = env.execute(spark)
    assert (tmp_path / "failed-once").exists()
    assert len(result.restarts) == 1
    assert result.restarts[0].cause.startswith("inject (subtask ")  # its name=, not map(...)
    assert f"injected failure on {bad}" in result.restarts[0].cause
    _assert_exact(tmp_path / "out")


def always_fails(record: dict) -> dict:
    if record["value"] == 1:
        raise KeyError("no such thing")  # the user's own line
    return record


def test_a_failure_every_time_ends_with_the_operator_subtask_and_traceback(spark, tmp_path):
    env = _env(tmp_path, restart_strategy=FixedDelay(1, delay=0))
    env.from_sequence(0, 100).map(always_fails).collect()
    with pytest.raises(JobFailedError) as info:
        env.execute(spark)
    message = str(info.value)
    assert "after 2 attempt(s)" in message
    assert "map(always_fails)" in message
    assert info.value.operator == "map(always_fails)"
    assert info.value.subtask is not None and info.value.subtask.endswith(("-0", "-1"))
    assert "KeyError: 'no such thing'" in message
    assert 'raise KeyError("no such thing")  # the user\'s own line' in message
    assert "{'value': 1}" in message


@pytest.mark.parametrize(
    "seed", [0, 1, pytest.param(2, marks=pytest.mark.slow)]
)  # (seed 2: make soak)
def test_sigkill_of_a_random_worker_at_a_random_moment(spark, small_events, tmp_path, seed):
    rng = random.Random(seed)
    env = _env(tmp_path, batch_size=1000)
    (
        env.read_parquet(small_events)
        .map_batches(slow_batches)
        .key_by("key")
        .sum("value")
        .write_parquet(tmp_path / "out")
    )
    killer = WorkerKiller(slot=f"slot-{rng.randrange(2)}").after(rng.uniform(0.2, 1.5))
    result = _execute_killing(env, spark, killer, hold=rng.randrange(5_000, 20_000))
    assert len(result.restarts) == 1
    assert "lost" in result.restarts[0].cause or "died" in result.restarts[0].cause
    _assert_exact(tmp_path / "out", SMALL // KEYS)


def _corrupt(storage: CheckpointStorage, checkpoint_id: int) -> Path:
    metadata = storage.read_metadata(checkpoint_id)
    handle = sorted(metadata.handles.values(), key=lambda h: h.path)[0]
    path = Path(storage.checkpoint_path(checkpoint_id)) / handle.path
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    return path


def test_a_corrupt_latest_checkpoint_is_skipped_for_the_previous_one(spark, small_events, tmp_path):
    env = _env(tmp_path, checkpoints=Checkpoints(retained=2), batch_size=1000)
    (
        env.read_parquet(small_events)
        .map_batches(slow_batches)
        .key_by("key")
        .sum("value")
        .write_parquet(tmp_path / "out")
    )
    storage = CheckpointStorage(str(tmp_path / "ck"))
    killer = WorkerKiller()
    corrupted: list[int] = []

    def listener(kind: str, message: str) -> None:
        if kind == "checkpoint" and not corrupted and len(storage.completed_ids()) >= 2:
            latest = storage.completed_ids()[-1]
            _corrupt(storage, latest)
            corrupted.append(latest)
            killer.kill()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = testing.execute(
            env,  # held until two checkpoints are complete: the kill lands
            spark,
            listener=listener,
            on_ready=killer.on_ready,
            hold_sources=SourceHold(records=12_500, checkpoints=2),
        )
    assert corrupted and killer.killed_at is not None
    skipped = [w for w in caught if issubclass(w.category, CheckpointWarning)]
    assert any(f"checkpoint {corrupted[0]} is damaged" in str(w.message) for w in skipped)
    assert len(result.restarts) == 1
    restored = result.restarts[0].restored_from
    assert restored is None or restored < corrupted[0]  # what was restored, not the damaged one
    _assert_exact(tmp_path / "out", SMALL // KEYS)


def test_a_slow_operator_behind_a_shuffle_gives_exact_output(spark, small_events, tmp_path):
    """Small buffers and a slow keyed operator: the sources are slowed down (backpressure),
    barriers wait behind full buffers, and the output is still exact. (That memory stays
    bounded is measured in test_backpressure.py, where the counters can be read.)"""
    env = _env(tmp_path, buffer_capacity=2, checkpoint_interval=0.2, batch_size=1000)
    (
        env.read_parquet(small_events)
        .key_by("key")
        .map_batches(slow_batches)
        .key_by("key")
        .sum("value")
        .write_parquet(tmp_path / "out")
    )
    result = env.execute(spark)
    assert result.restarts == []
    assert result.checkpoints[-1].final
    _assert_exact(tmp_path / "out", SMALL // KEYS)


MODES = {
    "aligned": Checkpoints(mode="aligned"),
    "unaligned": Checkpoints(mode="unaligned"),
    "aligned-timeout": Checkpoints(mode="aligned", alignment_timeout=0.05),
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_exactly_once_mode_survives_a_sigkill_under_backpressure(
    spark, small_events, tmp_path, mode
):
    """A slow keyed operator behind a shuffle keeps the buffers full; one worker is
    SIGKILLed at a random moment; the published running sums are exact."""
    rng = random.Random(f"{mode}-kill")
    env = _env(
        tmp_path,
        buffer_capacity=2,
        checkpoint_interval=0.2,
        batch_size=500,
        checkpoints=MODES[mode],
    )
    (
        env.read_parquet(small_events)
        .key_by("key")
        .map_batches(slow_batches)
        .key_by("key")
        .sum("value")
        .write_parquet(tmp_path / "out")
    )
    killer = WorkerKiller(slot=f"slot-{rng.randrange(2)}").after(rng.uniform(0.5, 2.0))
    result = _execute_killing(env, spark, killer, hold=rng.randrange(5_000, 20_000))
    assert len(result.restarts) == 1
    _assert_exact(tmp_path / "out", SMALL // KEYS)
    if mode == "unaligned":
        assert all(c.unaligned for c in result.checkpoints if not c.final)


def test_at_least_once_survives_a_sigkill_under_backpressure_losing_nothing(spark, tmp_path):
    """At-least-once: inputs are never blocked, so replay may publish a record twice; none
    may be missing. The duplicates are counted (and may be zero)."""
    env = _env(
        tmp_path,
        buffer_capacity=2,
        checkpoint_interval=0.2,
        batch_size=500,
        checkpoints=Checkpoints(mode="at_least_once"),
    )
    n = 100_000
    (
        env.from_sequence(0, n)
        .map_batches(lambda b: b.append_column("key", pa.compute.bit_wise_and(b["value"], 63)))
        .key_by("key")
        .map_batches(slow_batches)
        .write_parquet(tmp_path / "out")
    )
    rng = random.Random(7)
    killer = WorkerKiller(slot="slot-1").after(rng.uniform(0.5, 2.0))
    result = _execute_killing(env, spark, killer, hold=rng.randrange(10_000, 40_000))
    assert len(result.restarts) == 1
    values = pa.dataset.dataset(tmp_path / "out").to_table().column("value").to_pylist()
    published = Counter(values)
    assert set(published) == set(range(n))  # nothing lost
    duplicates = len(values) - n
    print(f"at-least-once: {duplicates} duplicates published after the restart")
    assert duplicates == sum(c - 1 for c in published.values())


@pytest.mark.parametrize("mode", ["aligned", "unaligned"])
def test_connected_components_in_a_loop_survive_a_sigkill(spark, tmp_path, mode):
    """The loop example: a worker killed at a random moment; the labels published equal those
    of a run without failure, each (vertex, label) once."""
    edges, vertices = 40_000, 20_000
    env = _env(
        tmp_path, checkpoint_interval=0.2, batch_size=200, checkpoints=Checkpoints(mode=mode)
    )
    components(edge_stream(env, edges=edges, vertices=vertices)).collect()
    rng = random.Random(mode)
    killer = WorkerKiller(slot="slot-0").after(rng.uniform(0.3, 1.5))
    result = _execute_killing(env, spark, killer, hold=rng.randrange(5_000, 15_000))
    assert len(result.restarts) == 1
    pairs = Counter((r["vertex"], r["label"]) for r in result.output)
    assert all(n == 1 for n in pairs.values())
    labels: dict[int, int] = {}
    for vertex, label in pairs:
        labels[vertex] = min(label, labels.get(vertex, label))
    assert labels == expected_labels(edges, vertices)


def test_more_subtasks_than_slots_is_refused_with_a_clear_message(spark, tmp_path):
    env = _env(tmp_path, parallelism=5)
    env.from_sequence(0, 10).collect()
    with pytest.raises(SparkSetupError, match=r"needs 5 task slots .* has 4"):
        env.execute(spark)


def test_csv_and_jsonl_sources_and_jsonl_sink(spark, tmp_path):
    src = tmp_path / "csv"
    src.mkdir()
    for f in range(3):
        rows = [f"k{i % 5},{i}" for i in range(f * 100, (f + 1) * 100)]
        (src / f"in-{f}.csv").write_text("key,value\n" + "\n".join(rows) + "\n")
    env = _env(tmp_path)
    env.read_csv(src).key_by("key").max("value").write_jsonl(tmp_path / "out")
    env.execute(spark)
    published = [
        json.loads(line)
        for part in sorted((tmp_path / "out").glob("part-*.jsonl"))
        for line in part.read_text().splitlines()
    ]
    assert len(published) == 300
    finals = {}
    for row in published:
        finals[row["key"]] = max(finals.get(row["key"], -1), row["value"])
    assert finals == {f"k{k}": 295 + k for k in range(5)}


def parse_amount(record: dict) -> dict:
    return {"key": record["key"], "amount": int(record["amount"])}


def test_bad_records_go_to_the_dead_letter_output_and_the_job_goes_on(spark, tmp_path):
    source = tmp_path / "payments"
    source.mkdir()
    lines = [
        json.dumps({"key": f"c{i % 3}", "amount": "oops" if i % 50 == 7 else str(i)})
        for i in range(500)
    ]
    (source / "payments.jsonl").write_text("\n".join(lines) + "\n")
    env = _env(tmp_path, dead_letter_dir=str(tmp_path / "dead"))
    (
        env.read_jsonl(source)
        .map(parse_amount, on_error="dead_letter")
        .key_by("key")
        .count()
        .collect()
    )
    result = env.execute(spark)
    good = [i for i in range(500) if i % 50 != 7]
    assert len(result.output) == len(good)
    assert sorted(r["amount"] for r in result.output) == good
    dead = [
        json.loads(line)
        for part in sorted((tmp_path / "dead").rglob("part-*.jsonl"))
        for line in part.read_text().splitlines()
    ]
    assert sorted(json.loads(d["record"])["amount"] for d in dead) == ["oops"] * 10
    assert {d["operator"] for d in dead} == {"map(parse_amount)"}
    assert all("ValueError: invalid literal for int()" in d["error"] for d in dead)
    assert all('int(record["amount"])' in d["traceback"] for d in dead)


def test_the_demo_job_runs_and_checks_its_output(spark, tmp_path):
    from cutline.demo import run_demo

    lines: list[str] = []
    result, verdict = run_demo(tmp_path, events=100_000, kill=False, echo=lines.append, spark=spark)
    assert verdict.exact
    assert verdict.rows == 100_000 and verdict.keys == 10_000
    assert result.restarts == []
    assert lines[-1].startswith("exact: 100,000 records published; all 10,000 keys end at 10")


def test_stop_with_savepoint_and_restore_at_another_parallelism_on_spark(
    spark, tmp_path, monkeypatch
):
    """A job on Spark stopped with a savepoint restarts at parallelism 3 and 1 (rescaled keyed
    state, source splits and sink output), each exactly once together with the first run. The
    savepoint is asked for while the sources hold half-way: always with input left."""
    from test_savepoints import (
        SavepointOnHold,
        build,
        endpoints_of,
        exactly_once,
        half_of_each_subtask,
        published,
    )

    from cutline import JobClient

    n = 4000
    env = build(tmp_path, 2, tmp_path / "out1", n, batch_size=32)
    asking = SavepointOnHold(
        endpoints_of(monkeypatch),
        lambda _: JobClient(str(tmp_path / "checkpoints")).savepoint(stop=True),
    )
    result = testing.execute(env, spark, listener=asking, hold_sources=half_of_each_subtask(n, 2))
    path = asking.answer()
    assert isinstance(path, str), path
    assert result.savepoints == [path]
    first = published(tmp_path / "out1")
    assert 0 < len(first) < n
    for after in (3, 1):
        out = tmp_path / f"out-{after}"
        env = build(tmp_path, after, out, n, checkpoint_dir=f"c{after}", batch_size=32)
        restored = env.execute(spark, restore_from=path)
        assert restored.restarts == []
        exactly_once(first + published(out), n)


def test_the_rescale_example_runs_and_checks_its_output(spark, tmp_path):
    from cutline.examples.rescale import main

    assert main(tmp_path)


def test_the_observe_example_sees_inside_its_checkpoints_on_spark(spark, tmp_path):
    """On Spark, with unaligned checkpoints under backpressure and a restart: every retained
    checkpoint verifies, the newest one's keyed state read as a DataFrame is exactly the last
    count per key the sink published, the statistics name every checkpoint and the restart,
    and the report builds."""
    from cutline.examples.observe import published_counts, run
    from cutline.report import build_report
    from cutline.runtime.checkpoint.storage import CheckpointStorage
    from cutline.runtime.checkpoint.verify import verify_checkpoint
    from cutline.spark.datasource import read_state

    result = run(tmp_path, spark, records=100_000)
    assert len(result.restarts) == 1 and "injected failure" in result.restarts[0].cause
    storage = CheckpointStorage(str(tmp_path / "ck"))
    for n in storage.completed_ids():
        verification = verify_checkpoint(storage.location(n), n)
        assert verification.ok, verification.summary()
        assert len(verification.channels) == 8
    state = read_state(spark, str(tmp_path / "ck"), "counts").collect()
    assert {row.key: row.value for row in state} == published_counts(tmp_path / "output")
    assert sum(row.value for row in state) == 100_000
    history = storage.read_history()
    assert [s.checkpoint_id for s in history.checkpoints if s.completed] == [
        c.checkpoint_id for c in result.checkpoints
    ]
    assert len(history.restarts) == 1
    page = build_report(str(tmp_path / "ck"))
    assert "injected failure" in page and "<svg" in page


def test_an_unpicklable_user_function_is_refused_before_anything_runs_naming_it(spark, tmp_path):
    """Spark would fail to ship it after a PySpark traceback and spend every restart attempt."""
    lock = threading.Lock()

    def guarded(record: dict) -> dict:
        with lock:
            return record

    env = _env(tmp_path)
    env.from_sequence(0, 10).map(guarded, name="guarded").collect()
    with pytest.raises(TypeError) as info:
        env.execute(spark)
    message = str(info.value)
    assert message.startswith("guarded: cannot be sent to the Spark workers")
    assert "cannot pickle '_thread.lock' object" in message
    assert "create such things in the function" in message
    assert not (tmp_path / "ck" / "_stats").exists()  # no attempt ran, no restart was spent


def test_the_user_s_failure_wins_over_the_losses_it_causes(spark, tmp_path):
    """A user function fails in one slot; Spark then ends the other slots' tasks and their
    connections close. The reported cause must be the user's exception, every time (it was
    "slot-0: lost ... control connection closed" about once in eight runs)."""
    from test_runtime_operators import fragile_job

    for run in range(3):
        env = _env(tmp_path / f"r{run}", restart_strategy=FixedDelay(0, delay=0), batch_size=100)
        with pytest.raises(JobFailedError) as info:
            fragile_job(env).execute(spark)
        assert info.value.operator == "fragile", (run, str(info.value))
        assert "ValueError: the user's own failure" in str(info.value)
