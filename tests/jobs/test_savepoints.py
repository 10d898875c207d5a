"""Savepoints, restoring at another parallelism, incremental checkpoints and the disk backend,
end to end: real jobs (threads, and one on local Spark), real files, exact output."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from test_runtime_jobs import FailAfterCheckpoint as FailOnceAfter  # raises once, after marker

from cutline import (
    Checkpoints,
    FixedDelay,
    JobClient,
    JobClientError,
    KeyedProcessFunction,
    ProcessContext,
    RestoreError,
    SourceHold,
    State,
    StreamEnvironment,
    testing,
)
from cutline.runtime.checkpoint.layout import SHARED
from cutline.runtime.checkpoint.lineage import resumable, summary
from cutline.runtime.checkpoint.location import CheckpointLocation
from cutline.runtime.checkpoint.storage import CheckpointStorage
from cutline.runtime.driver.client import JobEndpoint
from cutline.runtime.driver.result import JobResult
from cutline.runtime.task.local import ThreadLauncher

KEYS = 7


def key_value(record: dict[str, int]) -> dict[str, int]:
    return {"key": record["value"] % KEYS, "value": 1, "index": record["value"]}


def build(
    tmp_path: Path,
    parallelism: int,
    out: Path,
    n: int,
    *,
    sum_name: str = "sums",
    checkpoint_dir: str = "checkpoints",
    rate_limit: float | None = None,
    **options: Any,
) -> StreamEnvironment:
    settings: dict[str, Any] = {
        "checkpoint_interval": 0.05,
        "checkpoint_dir": tmp_path / checkpoint_dir,
        "restart_strategy": FixedDelay(delay=0),
        "batch_size": 8,
        "max_parallelism": 16,
    }
    settings.update(options)
    env = StreamEnvironment(parallelism, **settings)
    (
        env.from_sequence(0, n, name="numbers", rate_limit=rate_limit)
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


def endpoints_of(monkeypatch: pytest.MonkeyPatch) -> list[JobEndpoint]:
    """The endpoints (where savepoint requests queue up) of the jobs the test then runs, the
    newest last."""
    made: list[JobEndpoint] = []
    original = JobEndpoint.__init__

    def opened(self: JobEndpoint, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(JobEndpoint, "__init__", opened)
    return made


class StopWithSavepoint:
    """A listener's way to stop its job with a savepoint: :meth:`stop` asks for it on a
    thread (``JobClient(checkpoints).savepoint(stop=True)``) and keeps the listener, so the
    driver, until the request is queued at the job's endpoint; :meth:`savepoint` is the
    answer."""

    def __init__(self, checkpoints: Path, endpoints: list[JobEndpoint]) -> None:
        self.checkpoints, self.endpoints = checkpoints, endpoints
        self.answers: list[Any] = []
        self.thread: threading.Thread | None = None

    @property
    def stopping(self) -> bool:
        return self.thread is not None

    def stop(self) -> None:
        endpoint = self.endpoints[-1]
        self.thread = threading.Thread(target=self._ask, daemon=True)
        self.thread.start()
        while endpoint.requests.empty() and self.thread.is_alive():
            threading.Event().wait(0.002)

    def _ask(self) -> None:
        try:
            self.answers.append(JobClient(str(self.checkpoints)).savepoint(stop=True))
        except Exception as exc:
            self.answers.append(exc)

    def savepoint(self) -> str:
        assert self.thread is not None, "the job was never asked to stop"
        self.thread.join(60)
        assert self.answers and isinstance(self.answers[0], str), self.answers
        return str(self.answers[0])


def half_of_each_subtask(n: int, parallelism: int) -> SourceHold:
    """Hold every source subtask of ``from_sequence(0, n)`` after half its records (each has
    about ``n / parallelism``), until two checkpoints triggered after that completed."""
    return SourceHold(records=n // (2 * parallelism), checkpoints=2)


class SavepointOnHold:
    """A listener that has a savepoint asked for while the job runs with input left, however
    fast the machine.

    The job runs with ``hold_sources=SourceHold(records=..., checkpoints=2)`` (the sources
    hold part-way until two checkpoints triggered after that completed). On the first
    complete checkpoint this listener calls ``ask(that checkpoint's id)`` on a thread (which
    asks the job for a savepoint, by ``JobClient`` or the CLI) and keeps the driver until the
    request is queued at the job's endpoint (or ``ask`` ended). The driver takes the request
    before it triggers anything else, so the savepoint is triggered (as checkpoint id + 1)
    before the sources read past the hold: one more checkpoint must complete before they
    read on. ``answer()`` is what ``ask`` returned (or raised)."""

    def __init__(self, endpoints: list[JobEndpoint], ask: Callable[[int], Any]) -> None:
        self.endpoints = endpoints
        self.ask = ask
        self.thread: threading.Thread | None = None
        self.answers: list[Any] = []
        self.first: int | None = None
        """The id of the checkpoint that completed first (the savepoint's is the next)."""

    def __call__(self, kind: str, message: str) -> None:
        if kind != "checkpoint" or self.thread is not None:
            return
        self.first = int(message.split()[0])
        endpoint = self.endpoints[-1]
        self.thread = threading.Thread(target=self._ask, args=(self.first,), daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60  # (only so that a broken job cannot hang the test)
        while endpoint.requests.empty() and self.thread.is_alive():
            if time.monotonic() > deadline:
                return  # (the answer, or its absence, says what went wrong)
            time.sleep(0.002)

    def _ask(self, checkpoint_id: int) -> None:
        try:
            self.answers.append(self.ask(checkpoint_id))
        except Exception as exc:
            self.answers.append(exc)

    def answer(self, timeout: float = 60) -> Any:
        assert self.thread is not None, "no checkpoint completed: the savepoint was not asked"
        self.thread.join(timeout)
        assert self.answers, "the savepoint request was answered"
        return self.answers[0]


def run_until_savepoint(
    tmp_path: Path,
    parallelism: int,
    out: Path,
    n: int,
    endpoints: list[JobEndpoint],
    **options: Any,
) -> tuple[JobResult, str]:
    """Run the job until it is stopped with a savepoint, asked for while it holds half-way."""
    env = build(tmp_path, parallelism, out, n, **options)
    directory = tmp_path / options.get("checkpoint_dir", "checkpoints")
    asking = SavepointOnHold(endpoints, lambda _: JobClient(str(directory)).savepoint(stop=True))
    result = testing.execute(
        env,
        launcher=ThreadLauncher(),
        listener=asking,
        hold_sources=half_of_each_subtask(n, parallelism),
    )
    path = asking.answer()
    assert isinstance(path, str), path
    assert result.savepoints == [path]
    (savepoint,) = [c for c in result.checkpoints if c.savepoint == path]
    assert savepoint.final
    if not result.restarts:  # (a job that fails after it restores it, then ends)
        assert result.checkpoints[-1] == savepoint
    return result, path


@pytest.mark.parametrize("after", [1, 2, 4])
def test_stop_with_savepoint_then_restart_at_another_parallelism_is_exact(
    tmp_path: Path, after: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = 3000
    first, second = tmp_path / "out1", tmp_path / "out2"
    _, path = run_until_savepoint(tmp_path, 2, first, n, endpoints_of(monkeypatch))
    before = published(first)
    assert 0 < len(before) < n, "the job stopped in the middle"
    location = CheckpointLocation.open(path)
    metadata = location.checked_metadata()
    assert metadata.extra["savepoint"] and metadata.extra["parallelism"] == 2
    assert not any(h.shared for h in metadata.handles.values()), "a savepoint owns its files"

    env = build(tmp_path, after, second, n, checkpoint_dir="checkpoints2")
    result = testing.execute(env, launcher=ThreadLauncher(), restore_from=path)
    assert result.restarts == [] and result.restored_from == path
    exactly_once(before + published(second), n)


def test_a_savepoint_can_be_moved_and_restored_from_its_new_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = 2000
    _, path = run_until_savepoint(tmp_path, 2, tmp_path / "out1", n, endpoints_of(monkeypatch))
    moved = tmp_path / "elsewhere" / "kept"
    moved.parent.mkdir()
    os.rename(path, moved)
    env = build(tmp_path, 3, tmp_path / "out2", n, checkpoint_dir="checkpoints2")
    testing.execute(env, launcher=ThreadLauncher(), restore_from=moved)
    exactly_once(published(tmp_path / "out1") + published(tmp_path / "out2"), n)


def test_restoring_into_a_job_whose_operators_changed_names_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = 2000
    _, path = run_until_savepoint(tmp_path, 2, tmp_path / "out1", n, endpoints_of(monkeypatch))
    env = build(tmp_path, 2, tmp_path / "out2", n, checkpoint_dir="c2", sum_name="totals")
    with pytest.raises(
        RestoreError, match=r"'sums'.*without state in it are 'totals'.*allow_non_restored_state"
    ):
        testing.execute(env, launcher=ThreadLauncher(), restore_from=path)
    # explicitly allowed: the sums start from nothing; every other operator's state is restored
    result = testing.execute(
        env, launcher=ThreadLauncher(), restore_from=path, allow_non_restored_state=True
    )
    assert result.restarts == []
    rows = published(tmp_path / "out2")
    before = published(tmp_path / "out1")
    assert sorted(r["index"] for r in before + rows) == list(range(n))  # the source resumed
    counts = Counter(r["key"] for r in rows)
    assert {(r["key"], r["value"]) for r in rows} == {
        (k, i) for k, c in counts.items() for i in range(1, c + 1)
    }


def test_restore_errors_name_the_problem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = build(tmp_path, 2, tmp_path / "out", 100)
    with pytest.raises(RestoreError, match="no complete checkpoint or savepoint"):
        testing.execute(env, launcher=ThreadLauncher(), restore_from=tmp_path / "nothing-here")
    _, path = run_until_savepoint(tmp_path, 2, tmp_path / "out1", 2000, endpoints_of(monkeypatch))
    other = build(tmp_path, 2, tmp_path / "out2", 100, checkpoint_dir="c3", max_parallelism=32)
    with pytest.raises(RestoreError, match="max_parallelism 16, this job has 32"):
        testing.execute(other, launcher=ThreadLauncher(), restore_from=path)
    (Path(path) / "_metadata").write_text("{not json")
    with pytest.raises(RestoreError, match="not valid checkpoint metadata"):
        testing.execute(
            build(tmp_path, 2, tmp_path / "out3", 100, checkpoint_dir="c4"),
            launcher=ThreadLauncher(),
            restore_from=path,
        )


def test_a_savepoint_while_running_leaves_the_job_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = 3000
    env = build(tmp_path, 2, tmp_path / "out", n)
    asking = SavepointOnHold(
        endpoints_of(monkeypatch),
        lambda _: JobClient(str(tmp_path / "checkpoints")).savepoint(tmp_path / "mine"),
    )
    result = testing.execute(
        env, launcher=ThreadLauncher(), listener=asking, hold_sources=half_of_each_subtask(n, 2)
    )
    answer = [asking.answer()]
    assert isinstance(answer[0], str) and answer[0].startswith(
        str(tmp_path / "mine" / "savepoint-")
    ), answer
    assert result.savepoints == answer
    assert result.checkpoints[-1].final and result.checkpoints[-1].savepoint is None
    exactly_once(published(tmp_path / "out"), n)  # the job went on to the end
    assert CheckpointLocation.open(answer[0]).checked_metadata().extra["savepoint"]
    # retention never deletes it
    assert Path(answer[0], "_metadata").exists()


def test_no_running_job_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(JobClientError, match="no job is running with checkpoint directory"):
        JobClient(str(tmp_path))
    cli = [sys.executable, "-m", "cutline.cli", "savepoint", str(tmp_path)]
    done = subprocess.run(cli, capture_output=True, text=True)
    assert done.returncode == 2
    assert "no job is running with checkpoint directory" in done.stderr


def test_the_cli_cancels_a_job_with_a_savepoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = 4000
    env = build(tmp_path, 2, tmp_path / "out1", n)
    cli = [sys.executable, "-m", "cutline.cli", "savepoint", str(tmp_path / "checkpoints")]
    asking = SavepointOnHold(
        endpoints_of(monkeypatch),
        lambda _: subprocess.run([*cli, "--cancel"], capture_output=True, text=True),
    )
    result = testing.execute(
        env, launcher=ThreadLauncher(), listener=asking, hold_sources=half_of_each_subtask(n, 2)
    )
    done = asking.answer()
    assert isinstance(done, subprocess.CompletedProcess), done
    assert done.returncode == 0, done.stderr
    path = done.stdout.strip()
    assert result.savepoints == [path]
    assert 0 < len(published(tmp_path / "out1")) < n
    env = build(tmp_path, 1, tmp_path / "out2", n, checkpoint_dir="c2")
    testing.execute(env, launcher=ThreadLauncher(), restore_from=path)
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
    """The failure comes after the third complete checkpoint, while the sources hold half-way
    until three have completed: with input left, however fast the job."""
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
        checkpoints=Checkpoints(interval=0.03, dir=tmp_path / "checkpoints", retained=3),
        restart_strategy=FixedDelay(delay=0),
        batch_size=8,
        max_parallelism=16,
        state=State(full_every=3, backend=backend, dir=tmp_path / "state"),
    )
    (
        env.from_sequence(0, n, name="numbers")
        .map(key_value, name="keyed")
        .key_by("key")
        .sum("value", name="sums")
        .map(FailOnceAfter(str(marker), str(flag)), name="fail")
        .write_parquet(tmp_path / "out", name="out")
    )
    result = testing.execute(
        env,
        launcher=ThreadLauncher(),
        listener=listener,
        hold_sources=SourceHold(records=n // 4, checkpoints=3),
    )
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
    env = build(tmp_path, 2, tmp_path / "out", 500, state=State(incremental=False))
    testing.execute(env, launcher=ThreadLauncher())
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
    limited to 1 MiB, with a failure after a checkpoint (while the sources hold half-way):
    exact output, and checkpoints larger than the limit."""
    n = 40_000
    marker, flag = tmp_path / "checkpointed", tmp_path / "failed"

    def listener(kind: str, message: str) -> None:
        if kind == "checkpoint":
            marker.touch()

    env = StreamEnvironment(
        2,
        checkpoint_interval=0.2,
        checkpoint_dir=tmp_path / "checkpoints",
        restart_strategy=FixedDelay(delay=0),
        batch_size=500,
        max_parallelism=16,
        state=State(backend="disk", memory=1 << 20, dir=tmp_path / "state", incremental=False),
    )
    (
        env.from_sequence(0, n, name="numbers")
        .map(spread, name="spread")
        .key_by("key")
        .process(Remember(), name="remember")
        .map(FailOnceAfter(str(marker), str(flag)), name="fail")
        .write_parquet(tmp_path / "out", name="out")
    )
    result = testing.execute(
        env, launcher=ThreadLauncher(), listener=listener, hold_sources=SourceHold(records=n // 4)
    )
    assert len(result.restarts) == 1
    rows = published(tmp_path / "out")
    assert sorted(r["index"] for r in rows) == list(range(n))
    assert Counter((r["key"], r["value"]) for r in rows) == Counter(
        (k, c) for k in range(20_000) for c in (1, 2)
    )
    assert result.checkpoints[-1].size > 3 * (1 << 20), "the state is larger than the memory"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"backend": "ram"}, "State.backend must be one of 'memory', 'disk', not 'ram'"),
        ({"full_every": 0}, "State.full_every must be an integer of 1 or more, not 0"),
        ({"memory": 10}, "State.memory must be a number of bytes of at least 1048576 (1 MiB)"),
        ({"incremental": "yes"}, "State.incremental must be True or False, not 'yes'"),
        ({"dir": 3}, "State.dir must be a path, not 3"),
    ],
)
def test_state_settings_are_checked(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        State(**fields)


# -------------------------------------------------- regressions found by a review


def test_a_job_stopped_with_a_savepoint_that_fails_after_it_publishes_nothing_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stop is kept across a restart: restored from the savepoint it was stopped with, the
    job reads nothing more, so a job resumed from that savepoint duplicates nothing. (A sink
    dies as the savepoint's completion is announced: the savepoint's, not a checkpoint's
    before it.)"""
    import cutline.runtime.io.sinks as sinks

    original = sinks.FileSinkWriter.commit
    failed = threading.Event()
    savepoints = tmp_path / "checkpoints" / "savepoints"

    def dies_once(self: Any, checkpoint_id: int) -> Any:
        if not failed.is_set() and any(savepoints.glob(f"savepoint-{checkpoint_id}-*")):
            failed.set()
            raise RuntimeError("the worker died right after the savepoint completed")
        return original(self, checkpoint_id)

    monkeypatch.setattr(sinks.FileSinkWriter, "commit", dies_once)
    n = 3000
    result, path = run_until_savepoint(tmp_path, 2, tmp_path / "out1", n, endpoints_of(monkeypatch))
    assert failed.is_set()
    (savepoint,) = [c for c in result.checkpoints if c.savepoint == path]
    assert [r.restored_from for r in result.restarts] == [savepoint.checkpoint_id]
    assert result.source_records.get(2, 0) == 0, "the restored job read nothing more"
    first = published(tmp_path / "out1")
    assert len(first) < n
    env = build(tmp_path, 2, tmp_path / "out2", n, checkpoint_dir="c2")
    testing.execute(env, launcher=ThreadLauncher(), restore_from=path)
    exactly_once(first + published(tmp_path / "out2"), n)


def test_a_stop_with_a_savepoint_that_fails_leaves_the_job_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stop is asked for while the sources hold half-way; its savepoint cannot be moved to
    its folder, so the job reads on (once periodic checkpoints release the hold)."""
    n = 4000
    env = build(tmp_path, 2, tmp_path / "out", n)

    def ask(checkpoint_id: int) -> str:
        client = JobClient(str(tmp_path / "checkpoints"))
        # the savepoint (the checkpoint after the first complete one) cannot be moved there
        (tmp_path / "sp" / f"savepoint-{checkpoint_id + 1}-{client.run}").mkdir(parents=True)
        return client.savepoint(tmp_path / "sp", stop=True)

    asking = SavepointOnHold(endpoints_of(monkeypatch), ask)
    result = testing.execute(
        env, launcher=ThreadLauncher(), listener=asking, hold_sources=half_of_each_subtask(n, 2)
    )
    answer = [asking.answer()]
    assert isinstance(answer[0], JobClientError), answer
    assert "already exists; the job goes on" in str(answer[0])
    assert result.savepoints == [] and result.checkpoints[-1].final
    exactly_once(published(tmp_path / "out"), n)  # it read on, to the end


def test_periodic_checkpoints_go_on_after_a_stop_with_a_savepoint_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a failed stop "the job goes on": with its checkpoints too. (Rate-limited: the
    input left after the first checkpoint lasts most of a second, checkpoints every 0.05 s.)"""
    n = 4000
    env = build(tmp_path, 2, tmp_path / "out", n, rate_limit=n)

    def ask(checkpoint_id: int) -> str:
        client = JobClient(str(tmp_path / "checkpoints"))
        (tmp_path / "sp" / f"savepoint-{checkpoint_id + 1}-{client.run}").mkdir(parents=True)
        return client.savepoint(tmp_path / "sp", stop=True)

    asking = SavepointOnHold(endpoints_of(monkeypatch), ask)
    result = testing.execute(env, launcher=ThreadLauncher(), listener=asking)
    assert isinstance(asking.answer(), JobClientError)
    assert asking.first is not None
    failed_stop = asking.first + 1
    later = [c for c in result.checkpoints if c.checkpoint_id > failed_stop and not c.final]
    ids = [c.checkpoint_id for c in result.checkpoints]
    assert later, f"no periodic checkpoint after the failed stop {failed_stop}: only {ids}"


@dataclass(frozen=True)
class Bad:
    def __call__(self, record: dict[str, int]) -> dict[str, int]:
        if record["value"] % 97 == 0:
            raise ValueError("bad record")
        return record


def test_dead_letters_and_collect_restore_at_another_parallelism(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def job(parallelism: int) -> StreamEnvironment:
        env = StreamEnvironment(
            parallelism,
            checkpoint_interval=0.05,
            checkpoint_dir=tmp_path / "checkpoints",  # the same: collect's folder is reused
            restart_strategy=FixedDelay(delay=0),
            batch_size=8,
            max_parallelism=16,
            dead_letter_dir=tmp_path / "dead",
        )
        (
            env.from_sequence(0, 2000, name="numbers")
            .map(Bad(), name="bad", on_error="dead_letter")
            .collect()
        )
        return env

    asking = SavepointOnHold(
        endpoints_of(monkeypatch),
        lambda _: JobClient(str(tmp_path / "checkpoints")).savepoint(stop=True),
    )
    first = testing.execute(
        job(2),
        launcher=ThreadLauncher(),
        listener=asking,
        hold_sources=half_of_each_subtask(2000, 2),
    )
    path = asking.answer()
    assert isinstance(path, str), path
    assert 0 < len(first.output) < 2000 - len(range(0, 2000, 97)), "it stopped part-way"
    second = testing.execute(job(3), launcher=ThreadLauncher(), restore_from=path)
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
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A savepoint is asked for while the sources hold half-way; the job fails on the first
    record after it completed (with input left: the sources read on after it)."""
    n = 3000
    marker, flag = tmp_path / "m", tmp_path / "f"
    env = StreamEnvironment(
        2,
        checkpoints=Checkpoints(interval=0.05, dir=tmp_path / "ck", retained=1),
        restart_strategy=FixedDelay(delay=0),
        batch_size=8,
        max_parallelism=16,
    )
    (
        env.from_sequence(0, n, name="numbers")
        .map(key_value, name="keyed")
        .key_by("key")
        .sum("value", name="sums")
        .map(FailOnceAfter(str(marker), str(flag)), name="fail")
        .write_parquet(tmp_path / "out", name="out")
    )
    asking = SavepointOnHold(
        endpoints_of(monkeypatch), lambda _: JobClient(str(tmp_path / "ck")).savepoint()
    )

    def listener(kind: str, message: str) -> None:
        asking(kind, message)
        if kind == "savepoint":
            marker.touch()  # fail right after the savepoint

    result = testing.execute(
        env, launcher=ThreadLauncher(), listener=listener, hold_sources=half_of_each_subtask(n, 2)
    )
    assert isinstance(asking.answer(), str)
    assert len(result.restarts) == 1
    exactly_once(published(tmp_path / "out"), n)
    storage = CheckpointStorage(str(tmp_path / "ck"))
    assert len(storage.completed_ids()) == 1  # retained_checkpoints=1, whatever was restored
    assert set(storage.shared_files()) == referenced(storage)


def test_a_job_stopped_with_a_savepoint_resumes_latest_from_that_savepoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``restore_from="latest"`` in the same directory after a stop with a savepoint goes on
    from the savepoint (its sinks committed what it covers), not from the checkpoint before
    it, which would publish the records in between twice; ``checkpoints list`` says so."""
    n = 3000
    out = tmp_path / "out"
    _, path = run_until_savepoint(tmp_path, 2, out, n, endpoints_of(monkeypatch))
    before = published(out)
    storage = CheckpointStorage(str(tmp_path / "checkpoints"))
    assert storage.completed_ids(), "a checkpoint of the first run, older than the savepoint"
    found = resumable(storage)
    assert found is not None and found.url == path and found.savepoint is not None
    assert summary(storage)[0] == (
        f"restore_from='latest' restores savepoint {found.savepoint} ({path})"
    )
    env = build(tmp_path, 3, out, n)
    result = testing.execute(env, launcher=ThreadLauncher(), restore_from="latest")
    assert result.restored_from == path
    exactly_once(published(out), n)
    assert len(published(out)) > len(before)
