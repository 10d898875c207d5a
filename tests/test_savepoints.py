"""Savepoints, restoring at another parallelism, incremental checkpoints and the disk backend,
end to end: real jobs (threads, and one on local Spark), real files, exact output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest

from cutline import (
    JobClient,
    JobClientError,
    KeyedProcessFunction,
    ProcessContext,
    RestoreError,
    StreamEnvironment,
)
from cutline.runtime.driver import JobResult
from cutline.runtime.local import ThreadLauncher
from cutline.runtime.storage import SHARED, CheckpointLocation, CheckpointStorage
from test_runtime_jobs import FailAfterCheckpoint as FailOnceAfter  # raises once, after marker

KEYS = 7


def key_value(record: dict[str, int]) -> dict[str, int]:
    return {"key": record["value"] % KEYS, "value": 1, "index": record["value"]}


@dataclass(frozen=True)
class Pace:
    """Sleeps a little per record: the job runs long enough to be asked for a savepoint."""

    seconds: float = 0.0005

    def __call__(self, record: Any) -> Any:
        time.sleep(self.seconds)
        return record


def build(
    tmp_path: Path,
    parallelism: int,
    out: Path,
    n: int,
    *,
    sum_name: str = "sums",
    pace: float = 0.0005,
    checkpoint_dir: str = "checkpoints",
    **options: Any,
) -> StreamEnvironment:
    settings: dict[str, Any] = {
        "checkpoint_interval": 0.05,
        "checkpoint_dir": tmp_path / checkpoint_dir,
        "restart_delay": 0,
        "batch_size": 8,
        "max_parallelism": 16,
    }
    settings.update(options)
    env = StreamEnvironment(parallelism, **settings)
    (
        env.from_sequence(0, n, name="numbers")
        .map(Pace(pace), name="pace")
        .map(key_value, name="keyed")
        .key_by("key")
        .sum("value", name=sum_name)
        .write_parquet(out, name="out")
    )
    return env


def published(out: Path) -> list[dict[str, Any]]:
    if not out.exists():
        return []
    rows: list[dict[str, Any]] = ds.dataset(str(out), format="parquet").to_table().to_pylist()
    return rows


def exactly_once(rows: list[dict[str, Any]], n: int) -> None:
    """Every input record's running count, once: per key, the counts 1..(records of the key),
    each once; and every index once (whatever order the records of a key came in)."""
    expected = Counter((k, i) for k in range(KEYS) for i in range(1, len(range(k, n, KEYS)) + 1))
    assert Counter((r["key"], r["value"]) for r in rows) == expected
    assert sorted(r["index"] for r in rows) == list(range(n))


def savepoint_when(checkpoint_dir: Path, ready: threading.Event, **kwargs: Any) -> Any:
    """In a thread: once ``ready`` is set, take a savepoint (``JobClient.savepoint(**kwargs)``;
    by default one that stops the job); the thread, then the answer (its path or the error),
    go into the returned list."""
    answer: list[Any] = []
    kwargs.setdefault("stop", True)

    def ask() -> None:
        ready.wait(60)
        for _ in range(200):  # the job's endpoint comes up with the job
            try:
                answer.append(JobClient(str(checkpoint_dir)).savepoint(**kwargs))
                return
            except JobClientError as exc:
                if "no job is running" not in str(exc):
                    answer.append(exc)
                    return
                time.sleep(0.05)

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    answer.append(thread)
    return answer


def after_first_checkpoint() -> tuple[threading.Event, Any]:
    ready = threading.Event()

    def listener(kind: str, message: str) -> None:
        if kind == "checkpoint":
            ready.set()

    return ready, listener


def run_until_savepoint(
    tmp_path: Path, parallelism: int, out: Path, n: int, **options: Any
) -> tuple[JobResult, str]:
    env = build(tmp_path, parallelism, out, n, **options)
    ready, listener = after_first_checkpoint()
    answer = savepoint_when(tmp_path / options.get("checkpoint_dir", "checkpoints"), ready)
    result = env.execute(launcher=ThreadLauncher(), listener=listener)
    answer[0].join(30)
    assert len(answer) == 2, "the savepoint request was answered"
    path = answer[1]
    assert isinstance(path, str), path
    assert result.savepoints == [path]
    assert result.checkpoints[-1].final and result.checkpoints[-1].savepoint == path
    return result, path


@pytest.mark.parametrize("after", [1, 2, 4])
def test_stop_with_savepoint_then_restart_at_another_parallelism_is_exact(
    tmp_path: Path, after: int
) -> None:
    n = 3000
    first, second = tmp_path / "out1", tmp_path / "out2"
    _, path = run_until_savepoint(tmp_path, 2, first, n)
    before = published(first)
    assert 0 < len(before) < n, "the job stopped in the middle"
    location = CheckpointLocation.open(path)
    metadata = location.verify()
    assert metadata.extra["savepoint"] and metadata.extra["parallelism"] == 2
    assert not any(h.shared for h in metadata.handles.values()), "a savepoint owns its files"

    env = build(tmp_path, after, second, n, checkpoint_dir="checkpoints2", pace=0)
    result = env.execute(launcher=ThreadLauncher(), restore_from=path)
    assert result.restarts == [] and result.restored_from == path
    exactly_once(before + published(second), n)


def test_a_savepoint_can_be_moved_and_restored_from_its_new_place(tmp_path: Path) -> None:
    n = 2000
    _, path = run_until_savepoint(tmp_path, 2, tmp_path / "out1", n)
    moved = tmp_path / "elsewhere" / "kept"
    moved.parent.mkdir()
    os.rename(path, moved)
    env = build(tmp_path, 3, tmp_path / "out2", n, checkpoint_dir="checkpoints2", pace=0)
    env.execute(launcher=ThreadLauncher(), restore_from=moved)
    exactly_once(published(tmp_path / "out1") + published(tmp_path / "out2"), n)


def test_restoring_into_a_job_whose_operators_changed_names_them(tmp_path: Path) -> None:
    n = 2000
    _, path = run_until_savepoint(tmp_path, 2, tmp_path / "out1", n)
    env = build(tmp_path, 2, tmp_path / "out2", n, checkpoint_dir="c2", sum_name="totals")
    with pytest.raises(RestoreError, match=r"'sums'.*allow_non_restored_state=True"):
        env.execute(launcher=ThreadLauncher(), restore_from=path)
    # explicitly allowed: the sums start from nothing; every other operator's state is restored
    result = env.execute(
        launcher=ThreadLauncher(), restore_from=path, allow_non_restored_state=True
    )
    assert result.restarts == []
    rows = published(tmp_path / "out2")
    before = published(tmp_path / "out1")
    assert sorted(r["index"] for r in before + rows) == list(range(n))  # the source resumed
    counts = Counter(r["key"] for r in rows)
    assert {(r["key"], r["value"]) for r in rows} == {
        (k, i) for k, c in counts.items() for i in range(1, c + 1)
    }


def test_restore_errors_name_the_problem(tmp_path: Path) -> None:
    env = build(tmp_path, 2, tmp_path / "out", 100)
    with pytest.raises(RestoreError, match="no complete checkpoint or savepoint"):
        env.execute(launcher=ThreadLauncher(), restore_from=tmp_path / "nothing-here")
    _, path = run_until_savepoint(tmp_path, 2, tmp_path / "out1", 2000)
    other = build(tmp_path, 2, tmp_path / "out2", 100, checkpoint_dir="c3", max_parallelism=32)
    with pytest.raises(RestoreError, match="max_parallelism 16, this job has 32"):
        other.execute(launcher=ThreadLauncher(), restore_from=path)
    (Path(path) / "_metadata").write_text("{not json")
    with pytest.raises(RestoreError, match="not valid checkpoint metadata"):
        build(tmp_path, 2, tmp_path / "out3", 100, checkpoint_dir="c4").execute(
            launcher=ThreadLauncher(), restore_from=path
        )


def test_a_savepoint_while_running_leaves_the_job_running(tmp_path: Path) -> None:
    n = 3000
    env = build(tmp_path, 2, tmp_path / "out", n)
    ready, listener = after_first_checkpoint()
    answer: list[Any] = []

    def ask() -> None:
        ready.wait(60)
        answer.append(JobClient(str(tmp_path / "checkpoints")).savepoint(tmp_path / "mine"))

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    result = env.execute(launcher=ThreadLauncher(), listener=listener)
    thread.join(30)
    assert answer and answer[0].startswith(str(tmp_path / "mine" / "savepoint-"))
    assert result.savepoints == answer
    assert result.checkpoints[-1].final and result.checkpoints[-1].savepoint is None
    exactly_once(published(tmp_path / "out"), n)  # the job went on to the end
    assert CheckpointLocation.open(answer[0]).verify().extra["savepoint"]
    # retention never deletes it
    assert Path(answer[0], "_metadata").exists()


def test_no_running_job_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(JobClientError, match="no job is running with checkpoint directory"):
        JobClient(str(tmp_path))
    cli = [sys.executable, "-m", "cutline.cli", "savepoint", str(tmp_path)]
    done = subprocess.run(cli, capture_output=True, text=True)
    assert done.returncode == 2
    assert "no job is running with checkpoint directory" in done.stderr


def test_the_cli_cancels_a_job_with_a_savepoint(tmp_path: Path) -> None:
    n = 4000
    env = build(tmp_path, 2, tmp_path / "out1", n, pace=0.001)
    ready, listener = after_first_checkpoint()
    done: list[subprocess.CompletedProcess[str]] = []

    def ask() -> None:
        ready.wait(60)
        cli = [sys.executable, "-m", "cutline.cli", "savepoint", str(tmp_path / "checkpoints")]
        done.append(subprocess.run([*cli, "--cancel"], capture_output=True, text=True))

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    result = env.execute(launcher=ThreadLauncher(), listener=listener)
    thread.join(60)
    assert done and done[0].returncode == 0, done[0].stderr if done else "no answer"
    path = done[0].stdout.strip()
    assert result.savepoints == [path]
    assert 0 < len(published(tmp_path / "out1")) < n
    env = build(tmp_path, 1, tmp_path / "out2", n, checkpoint_dir="c2", pace=0)
    env.execute(launcher=ThreadLauncher(), restore_from=path)
    exactly_once(published(tmp_path / "out1") + published(tmp_path / "out2"), n)


# ------------------------------------------------------------ incremental checkpoints


def referenced(storage: CheckpointStorage) -> set[str]:
    return {
        ref.path
        for c in storage.completed_ids()
        for h in storage.read_metadata(c).handles.values()
        for ref in h.shared
    }


@pytest.mark.parametrize("backend", ["memory", "disk"])
def test_incremental_checkpoints_restore_exactly_and_keep_only_needed_files(
    tmp_path: Path, backend: str
) -> None:
    n = 3000
    marker, flag = tmp_path / "third-checkpoint", tmp_path / "failed"
    seen: list[str] = []

    def listener(kind: str, message: str) -> None:
        if kind == "checkpoint":
            seen.append(message)
            if len(seen) >= 3:
                marker.touch()

    env = StreamEnvironment(
        2,
        checkpoint_interval=0.03,
        checkpoint_dir=tmp_path / "checkpoints",
        restart_delay=0,
        batch_size=8,
        max_parallelism=16,
        retained_checkpoints=3,
        full_checkpoint_every=3,
        state_backend=backend,
        state_dir=tmp_path / "state",
    )
    (
        env.from_sequence(0, n, name="numbers")
        .map(Pace(0.0005), name="pace")
        .map(key_value, name="keyed")
        .key_by("key")
        .sum("value", name="sums")
        .map(FailOnceAfter(str(marker), str(flag)), name="fail")
        .write_parquet(tmp_path / "out", name="out")
    )
    result = env.execute(launcher=ThreadLauncher(), listener=listener)
    assert len(result.restarts) == 1 and result.restarts[0].restored_from is not None
    exactly_once(published(tmp_path / "out"), n)
    storage = CheckpointStorage(str(tmp_path / "checkpoints"))
    # reference counting: exactly the files the retained checkpoints name are left
    assert set(storage.shared_files()) == referenced(storage)
    assert len(storage.completed_ids()) == 3
    chains = [
        len([r for r in h.segments if r.shared])
        for c in storage.completed_ids()
        for h in storage.read_metadata(c).handles.values()
        if h.segments
    ]
    assert chains and max(chains) <= 3
    # and incremental checkpoints happened: some chain built on an earlier checkpoint's files
    # and incremental checkpoints happened. (Of the last two, both may be full: the final
    # checkpoint builds on the newest complete one when it was triggered, which may be the
    # end of a full chain. Three retained checkpoints always include an increment.)
    assert max(chains) >= 2
    assert not list((tmp_path / "state").glob("cutline-state-*")), "working databases removed"


def test_full_checkpoints_only_when_incremental_is_off(tmp_path: Path) -> None:
    env = build(tmp_path, 2, tmp_path / "out", 500, incremental_checkpoints=False, pace=0)
    env.execute(launcher=ThreadLauncher())
    storage = CheckpointStorage(str(tmp_path / "checkpoints"))
    assert not (tmp_path / "checkpoints" / SHARED).exists() or not storage.shared_files()
    exactly_once(published(tmp_path / "out"), 500)


# ---------------------------------------------------------------- state beyond memory


class Remember(KeyedProcessFunction):
    """Keeps a 200-byte payload per key and counts the key's records."""

    def open(self, ctx: ProcessContext) -> None:
        self.payload = ctx.value_state("payload")
        self.count = ctx.value_state("count")

    def process(self, record: dict[str, int], ctx: ProcessContext) -> list[dict[str, int]]:
        if self.payload.get() is None:
            self.payload.update(f"{ctx.key:0200d}")
        assert self.payload.get() == f"{ctx.key:0200d}"
        count = self.count.get(0) + 1
        self.count.update(count)
        return [{"key": ctx.key, "value": count, "index": record["index"]}]


def spread(record: dict[str, int]) -> dict[str, int]:
    return {"key": record["value"] % 20_000, "index": record["value"]}


def test_the_disk_backend_keeps_more_state_than_its_memory_through_a_restart(
    tmp_path: Path,
) -> None:
    """20,000 keys of 200-byte payloads (about 5 MB with the counts) through the disk backend
    limited to 1 MiB, with a failure: exact output, and checkpoints larger than the limit."""
    n = 40_000
    marker, flag = tmp_path / "checkpointed", tmp_path / "failed"

    def listener(kind: str, message: str) -> None:
        if kind == "checkpoint":
            marker.touch()

    env = StreamEnvironment(
        2,
        checkpoint_interval=0.2,
        checkpoint_dir=tmp_path / "checkpoints",
        restart_delay=0,
        batch_size=500,
        max_parallelism=16,
        state_backend="disk",
        state_memory=1 << 20,
        state_dir=tmp_path / "state",
        incremental_checkpoints=False,
    )
    (
        env.from_sequence(0, n, name="numbers")
        .map(spread, name="spread")
        .key_by("key")
        .process(Remember(), name="remember")
        .map(FailOnceAfter(str(marker), str(flag)), name="fail")
        .write_parquet(tmp_path / "out", name="out")
    )
    result = env.execute(launcher=ThreadLauncher(), listener=listener)
    assert len(result.restarts) == 1
    rows = published(tmp_path / "out")
    assert sorted(r["index"] for r in rows) == list(range(n))
    assert Counter((r["key"], r["value"]) for r in rows) == Counter(
        (k, c) for k in range(20_000) for c in (1, 2)
    )
    assert result.checkpoints[-1].size > 3 * (1 << 20), "the state is larger than the memory"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"state_backend": "ram"}, "state_backend must be one of 'memory', 'disk', not 'ram'"),
        ({"full_checkpoint_every": 0}, "full_checkpoint_every must be a positive integer"),
        ({"state_memory": 10}, "state_memory must be at least 1 MiB"),
        ({"incremental_checkpoints": "yes"}, "incremental_checkpoints must be True or False"),
    ],
)
def test_state_settings_are_checked(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StreamEnvironment(**options)


# -------------------------------------------------- regressions found by a review


def test_a_job_stopped_with_a_savepoint_that_fails_after_it_publishes_nothing_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stop is kept across a restart: restored from the savepoint it was stopped with, the
    job reads nothing more, so a job resumed from that savepoint duplicates nothing."""
    import cutline.runtime.sinks as sinks

    original = sinks.FileSinkWriter.notify_complete
    failed = threading.Event()

    def dies_once(self: Any, checkpoint_id: int) -> Any:
        if not failed.is_set():
            failed.set()
            raise RuntimeError("the worker died right after the savepoint completed")
        return original(self, checkpoint_id)

    monkeypatch.setattr(sinks.FileSinkWriter, "notify_complete", dies_once)
    n = 3000
    _, path = run_until_savepoint(tmp_path, 2, tmp_path / "out1", n)
    assert failed.is_set()
    first = published(tmp_path / "out1")
    assert len(first) < n
    env = build(tmp_path, 2, tmp_path / "out2", n, checkpoint_dir="c2", pace=0)
    env.execute(launcher=ThreadLauncher(), restore_from=path)
    exactly_once(first + published(tmp_path / "out2"), n)


def test_a_stop_with_a_savepoint_that_fails_leaves_the_job_running(tmp_path: Path) -> None:
    n = 4000
    env = build(tmp_path, 2, tmp_path / "out", n, checkpoint_interval=None, pace=0.0005)
    answer: list[Any] = []

    def ask() -> None:
        for _ in range(200):
            try:
                client = JobClient(str(tmp_path / "checkpoints"))
                break
            except JobClientError:
                time.sleep(0.05)
        (tmp_path / "sp" / f"savepoint-1-{client.run}").mkdir(parents=True)  # the move fails
        try:
            answer.append(client.savepoint(tmp_path / "sp", stop=True))
        except JobClientError as exc:
            answer.append(exc)

    threading.Thread(target=ask, daemon=True).start()
    result = env.execute(launcher=ThreadLauncher())
    assert answer and isinstance(answer[0], JobClientError)
    assert "already exists; the job goes on" in str(answer[0])
    assert result.savepoints == [] and result.checkpoints[-1].final
    exactly_once(published(tmp_path / "out"), n)  # it read on, to the end


@dataclass(frozen=True)
class Bad:
    def __call__(self, record: dict[str, int]) -> dict[str, int]:
        if record["value"] % 97 == 0:
            raise ValueError("bad record")
        return record


def test_dead_letters_and_collect_restore_at_another_parallelism(tmp_path: Path) -> None:
    def job(parallelism: int, pace: float) -> StreamEnvironment:
        env = StreamEnvironment(
            parallelism,
            checkpoint_interval=0.05,
            checkpoint_dir=tmp_path / "checkpoints",  # the same: collect's folder is reused
            restart_delay=0,
            batch_size=8,
            max_parallelism=16,
            dead_letter_dir=tmp_path / "dead",
        )
        (
            env.from_sequence(0, 2000, name="numbers")
            .map(Pace(pace), name="pace")
            .map(Bad(), name="bad", on_error="dead_letter")
            .collect()
        )
        return env

    ready, listener = after_first_checkpoint()
    answer = savepoint_when(tmp_path / "checkpoints", ready)
    first = job(2, 0.0005).execute(launcher=ThreadLauncher(), listener=listener)
    answer[0].join(30)
    second = job(3, 0).execute(launcher=ThreadLauncher(), restore_from=answer[1])
    values = sorted(r["value"] for r in first.output + second.output)
    assert values == [v for v in range(2000) if v % 97]
    dead = [
        json.loads(line)
        for path in (tmp_path / "dead").rglob("*.jsonl")
        if "_pending" not in path.parts
        for line in path.read_text().splitlines()
    ]
    assert len(dead) == len(range(0, 2000, 97))


def test_restoring_a_savepoint_after_a_failure_discards_older_checkpoints(
    tmp_path: Path,
) -> None:
    n = 3000
    marker, flag = tmp_path / "m", tmp_path / "f"
    env = StreamEnvironment(
        2,
        checkpoint_interval=0.05,
        checkpoint_dir=tmp_path / "ck",
        restart_delay=0,
        batch_size=8,
        max_parallelism=16,
        retained_checkpoints=1,
    )
    (
        env.from_sequence(0, n, name="numbers")
        .map(Pace(0.0005), name="pace")
        .map(key_value, name="keyed")
        .key_by("key")
        .sum("value", name="sums")
        .map(FailOnceAfter(str(marker), str(flag)), name="fail")
        .write_parquet(tmp_path / "out", name="out")
    )
    ready = threading.Event()

    def listener(kind: str, message: str) -> None:
        if kind == "checkpoint":
            ready.set()
        if kind == "savepoint":
            marker.touch()  # fail right after the savepoint

    def ask() -> None:
        ready.wait(60)
        JobClient(str(tmp_path / "ck")).savepoint()

    threading.Thread(target=ask, daemon=True).start()
    result = env.execute(launcher=ThreadLauncher(), listener=listener)
    assert len(result.restarts) == 1
    exactly_once(published(tmp_path / "out"), n)
    storage = CheckpointStorage(str(tmp_path / "ck"))
    assert len(storage.completed_ids()) == 1  # retained_checkpoints=1, whatever was restored
    assert set(storage.shared_files()) == referenced(storage)
