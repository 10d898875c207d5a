"""Checkpoint statistics (``runtime/stats.py``) of whole runs, compared with what is on disk.

One small keyed job behind a slow operator (backpressure) per checkpointing mode (aligned,
unaligned, aligned with an alignment timeout, at-least-once), each with an injected failure
after its first checkpoint, so that it restarts; and the same job on real local Spark (there
without the failure: a restart on Spark starts new Python workers, seconds more). Every
checkpoint is retained, so that every complete checkpoint's statistics can be compared with its files:
its sizes with the bytes written, its channel state records with the records in its state
files, its subtasks with the plan. Then the restarts, the run, the critical path, and the
statistics of a savepoint.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from test_checkpointing_modes import FailOnceAfter
from test_loops import touch_on_checkpoint
from test_savepoints import SavepointOnHold, endpoints_of, half_of_each_subtask

import checkpoint_verification
from cutline import (
    Checkpoints,
    FixedDelay,
    JobClient,
    JobResult,
    SourceHold,
    State,
    StreamEnvironment,
    testing,
)
from cutline.runtime.checkpoint.layout import METADATA, SHARED
from cutline.runtime.checkpoint.location import CheckpointLocation
from cutline.runtime.checkpoint.reader import CheckpointReader
from cutline.runtime.checkpoint.stats import (
    STATS_FOLDER,
    CheckpointStats,
    History,
    RunInfo,
    SubtaskStats,
    critical_path,
)
from cutline.runtime.checkpoint.storage import CheckpointStorage
from cutline.runtime.checkpoint.verify import verify_checkpoint
from cutline.runtime.graph import ExecutionPlan, subtask_name
from cutline.runtime.io.sources import SequenceSource
from cutline.runtime.network.channel import PriorityBarrier
from cutline.runtime.network.input_gate import InputGate
from cutline.runtime.network.output_channel import OutputChannel
from cutline.runtime.network.wire import Barrier, Records
from cutline.runtime.task.local import ThreadLauncher

N = 2_000
KEYS = 16
MODES = ["aligned", "unaligned", "aligned-timeout", "at_least_once", "aligned-concurrent", "spark"]
"""The checkpointing modes with the thread launcher (``aligned-concurrent``: up to three
checkpoints in flight, often, incremental with a full one every third), and one aligned run
on local Spark."""

pytestmark = pytest.mark.xdist_group("checkpoint-stats")
"""Every test of the module on one worker: each mode's job (a module fixture) runs once."""


def with_key(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Adds the column ``key`` (the value's lowest four bits)."""
    return batch.append_column("key", pc.bit_wise_and(batch.column("value"), KEYS - 1))


@dataclass(frozen=True)
class Slow:
    """Sleeps ``pause`` seconds per batch: the buffers before it fill (backpressure)."""

    pause: float

    @property
    def __name__(self) -> str:
        return "slow"

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        time.sleep(self.pause)
        return batch


def environment(
    directory: Path, mode: str, retained: int = 1000, **options: Any
) -> StreamEnvironment:
    """Two subtasks per operator, checkpoints every 0.1 s, all of them retained; ``mode`` is
    one of :data:`MODES`."""
    concurrent = mode == "aligned-concurrent"
    checkpoints = Checkpoints(
        interval=0.02 if concurrent else 0.1,
        dir=directory / "checkpoints",
        retained=retained,
        mode=mode if mode in ("unaligned", "at_least_once") else "aligned",
        # every alignment that has to wait switches
        alignment_timeout=0.0 if mode == "aligned-timeout" else None,
        max_concurrent=3 if concurrent else 1,
    )
    settings: dict[str, Any] = {
        "checkpoints": checkpoints,
        "restart_strategy": FixedDelay(delay=0),
        "batch_size": 20,
        "buffer_capacity": 2,
    }
    if concurrent:
        settings["state"] = State(full_every=3)
    settings.update(options)
    return StreamEnvironment(2, **settings)


def keyed_job(env: StreamEnvironment, pause: float, fail: FailOnceAfter | None) -> None:
    """numbers -> key -> (by key) slow -> fail -> (by key) count -> collect."""
    stream = (
        env.from_sequence(0, N, name="numbers")
        .map_batches(with_key, name="key")
        .key_by("key")
        .map_batches(Slow(pause), name="slow")
    )
    if fail is not None:
        stream = stream.map_batches(fail, name="fail")
    stream.key_by("key").count(name="counts").collect()


@dataclass
class Run:
    """A finished job, its plan, and its checkpoint directory's statistics."""

    mode: str
    result: JobResult
    plan: ExecutionPlan
    storage: CheckpointStorage
    history: History

    @property
    def root(self) -> Path:
        return Path(self.storage.root)

    def complete(self) -> list[CheckpointStats]:
        return [s for s in self.history.checkpoints if s.completed]

    def retained(self) -> list[int]:
        """The complete checkpoints still in the directory (savepoints moved out of it)."""
        return self.storage.completed_ids()


def run_job(directory: Path, mode: str, spark: Any = None) -> Run:
    """The keyed job in ``mode``; with threads, a failure after the first checkpoint restarts
    it once (on Spark a restart starts new Python workers, seconds more: it runs through).
    The sources hold half-way until a checkpoint completed: the failure always lands in a
    running job with input left."""
    marker = directory / "checkpointed"
    env = environment(directory, mode)
    fail = FailOnceAfter(str(marker), str(directory / "failed")) if spark is None else None
    keyed_job(env, 0.02 if spark is None else 0.005, fail)
    before = len(checkpoint_verification.FAILURES)
    listener = touch_on_checkpoint(marker)
    if spark is not None:
        result = env.execute(spark, listener=listener)
    else:
        result = testing.execute(
            env,
            launcher=ThreadLauncher(),
            listener=listener,
            hold_sources=SourceHold(records=N // 4),  # half of each source subtask's
        )
    # (run before the per-test fixture that watches the verification: watched here)
    assert checkpoint_verification.FAILURES[before:] == []
    assert len(result.restarts) == (1 if fail is not None else 0)
    storage = CheckpointStorage(str(directory / "checkpoints"))
    assert_final_counts(mode, result, storage)
    return Run(mode, result, env.plan(), storage, storage.read_history())


def numbers_read(reader: CheckpointReader) -> list[int]:
    """The numbers the sources had read when the checkpoint was taken: split ``j`` of the
    sequence holds ``j``, ``j + slices``, ... and its position is how many of them were read."""
    slices = SequenceSource(0, N).slices
    read: list[int] = []
    for subtask, handle in sorted(reader.handles.items()):
        if "numbers" in handle.operators:
            splits = reader.state_file(subtask).operators["numbers"]["splits"]
            for split, state in splits.items():
                numbers = range(int(split), N, slices)
                read += numbers if state.finished else numbers[: state.position]
    return read


def assert_final_counts(mode: str, result: JobResult, storage: CheckpointStorage) -> None:
    """Each key's final running count. Without a restart, its records: N // KEYS. After the
    restart: the count restored from the checkpoint, plus one per record of the key in its
    channel state (unaligned: in flight, counted after the restore) and per record the sources
    read after it. Exactly once, the records counted and in flight are those the sources read
    before the checkpoint (so the final count is N // KEYS again). At least once, more may be
    counted: a subtask goes on with the inputs whose barrier came while it waits for the
    others' (``BarrierTracker``), so its snapshot counts records after the barrier, which the
    sources read again after the restore. Never fewer: nothing is lost."""
    final: dict[int, int] = {}
    for r in result.output:
        final[r["key"]] = max(final.get(r["key"], 0), r["count"])
    if not result.restarts:
        assert final == dict.fromkeys(range(KEYS), N // KEYS)
        return
    restored = result.restarts[0].restored_from
    assert restored is not None
    reader = CheckpointReader(storage.location(restored), restored)
    read = Counter(n % KEYS for n in numbers_read(reader))
    taken = Counter({entry.key: entry.value for entry in reader.keyed_entries("counts")})
    taken.update(c.record["value"] % KEYS for c in reader.channel_state())
    # (counted, or in flight; the rest of each key's records are read after the restore)
    assert final == {key: taken[key] + N // KEYS - read[key] for key in range(KEYS)}
    if mode == "at_least_once":
        assert all(taken[key] >= read[key] for key in range(KEYS)), "none lost"
    else:
        assert +taken == +read, "each counted once"


@pytest.fixture(scope="module", params=MODES)
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """One finished run per mode, shared by the tests of this module."""
    mode = request.param
    spark = request.getfixturevalue("spark") if mode == "spark" else None
    return run_job(tmp_path_factory.mktemp(mode), mode, spark)


def sizes_on_disk(folder: Path) -> dict[str, int]:
    """File name -> bytes, of every file in ``folder`` but the metadata."""
    return {
        p.name: p.stat().st_size for p in folder.iterdir() if p.is_file() and p.name != METADATA
    }


# ---------------------------------------------------------------------- which checkpoints


def test_every_triggered_checkpoint_has_one_statistics_file(run: Run) -> None:
    files = sorted(p.name for p in (run.root / STATS_FOLDER).glob("checkpoint-*.json"))
    ids = [s.checkpoint_id for s in run.history.checkpoints]
    assert run.history.unreadable == []
    assert len(files) == len(ids)
    assert ids == list(range(1, max(ids) + 1)), "ids are used in order, each gets its file"
    # nothing is triggered after the final checkpoint: it is the last id used
    assert run.complete()[-1].final and run.complete()[-1].checkpoint_id == max(ids)
    assert sorted(files) == sorted(f"checkpoint-{n}.json" for n in ids)


def test_completed_statistics_are_the_result_s_checkpoints(run: Run) -> None:
    assert [s.checkpoint_id for s in run.complete()] == [
        c.checkpoint_id for c in run.result.checkpoints
    ]
    assert [s.to_dict() for s in run.complete()] == [c.to_dict() for c in run.result.checkpoints]
    assert run.complete()[-1].final
    assert all(not s.final for s in run.complete()[:-1])


def test_aborted_checkpoints_say_why(run: Run) -> None:
    aborted = {s.checkpoint_id: s for s in run.history.checkpoints if not s.completed}
    for stats in aborted.values():
        assert stats.status == "aborted"
        assert stats.reason
    for checkpoint_id, reason in run.result.aborted:
        assert aborted[checkpoint_id].reason == reason[:2000]
    for stats in run.complete():
        assert stats.status == "completed" and stats.reason is None


def test_each_checkpoint_knows_its_run_mode_and_generation(run: Run) -> None:
    (info,) = run.history.runs
    generations = {s.generation for s in run.history.checkpoints}
    assert generations == ({1} if run.mode == "spark" else {1, 2})
    restored = run.history.restarts[0].restored_from if run.history.restarts else None
    for stats in run.history.checkpoints:
        assert stats.run == info.run
        assert stats.checkpointing == info.checkpointing
        assert stats.triggered_at >= 0
        assert stats.trigger_time >= info.started
        assert stats.savepoint is None
        if stats.generation == 2:
            assert restored is not None and stats.checkpoint_id > restored
    times = [s.trigger_time for s in run.history.checkpoints]
    assert times == sorted(times), "triggered in the order of their ids"


# -------------------------------------------------------------------------------- times


def test_all_durations_are_zero_or_more_and_acknowledgements_come_before_completion(
    run: Run,
) -> None:
    for stats in run.history.checkpoints:
        assert stats.duration >= 0
        assert stats.alignment >= 0
        for sub in stats.subtasks.values():
            for name in ("acknowledged", "start_delay", "alignment", "synchronous", "asynchronous"):
                assert getattr(sub, name) >= 0, (stats.checkpoint_id, sub.subtask, name)
            if stats.completed:
                assert sub.acknowledged <= stats.duration
        if stats.subtasks:
            assert stats.alignment == max(s.alignment for s in stats.subtasks.values())


def test_every_subtask_of_the_plan_acknowledged_each_completed_checkpoint(run: Run) -> None:
    subtasks = set(run.plan.subtasks())
    for stats in run.complete():
        assert set(stats.subtasks) == subtasks, stats.checkpoint_id
        for name, sub in stats.subtasks.items():
            assert sub.subtask == name
    for stats in run.history.checkpoints:
        assert set(stats.subtasks) <= subtasks


# -------------------------------------------------------------------------------- sizes


def test_sizes_equal_the_bytes_of_the_files_written(run: Run) -> None:
    retained = run.retained()
    assert retained == [s.checkpoint_id for s in run.complete()], "all were retained"
    shared = sizes_on_disk(run.root / SHARED) if (run.root / SHARED).exists() else {}
    named_before: set[str] = set()
    for checkpoint_id in retained:
        stats = run.history.checkpoint(checkpoint_id)
        assert stats is not None
        metadata = run.storage.read_metadata(checkpoint_id)
        own = sizes_on_disk(run.root / f"chk-{checkpoint_id}")
        named = {ref.path.rsplit("/", 1)[-1] for h in metadata.handles.values() for ref in h.shared}
        new = named - named_before
        assert stats.size == sum(own.values()) + sum(shared[name] for name in new)
        state_files = sum(own[h.path] for h in metadata.handles.values())
        segments = sum(
            (shared[ref.path.rsplit("/", 1)[-1]] if ref.shared else own[ref.path])
            for h in metadata.handles.values()
            for ref in h.segments
        )
        assert stats.full_size == state_files + segments
        named_before |= named


def test_each_subtask_s_sizes_are_its_files(run: Run) -> None:
    named_before: set[str] = set()
    for checkpoint_id in run.retained():
        stats = run.history.checkpoint(checkpoint_id)
        assert stats is not None
        folder = run.root / f"chk-{checkpoint_id}"
        for subtask, handle in run.storage.read_metadata(checkpoint_id).handles.items():
            sub = stats.subtasks[subtask]
            assert sub.state_size == (folder / handle.path).stat().st_size == handle.size
            assert sub.full_size == handle.size + sum(ref.size for ref in handle.segments)
            new = [ref for ref in handle.segments if ref.path not in named_before]
            assert sub.segments_size == sum(ref.size for ref in new), (checkpoint_id, subtask)
            named_before |= {ref.path for ref in handle.segments}
        assert stats.size == sum(s.size for s in stats.subtasks.values())


def test_channel_state_records_are_the_records_in_the_state_files(run: Run) -> None:
    recorded_somewhere = 0
    for checkpoint_id in run.retained():
        stats = run.history.checkpoint(checkpoint_id)
        assert stats is not None
        reader = CheckpointReader(run.storage.location(checkpoint_id), checkpoint_id)
        per_subtask: dict[str, int] = {}
        for record in reader.channel_state():
            per_subtask[record.subtask] = per_subtask.get(record.subtask, 0) + 1
        assert stats.channel_state_records == sum(per_subtask.values())
        for name, sub in stats.subtasks.items():
            assert sub.channel_state_records == per_subtask.get(name, 0), (checkpoint_id, name)
            assert (sub.channel_state_bytes > 0) == (sub.channel_state_records > 0)
        assert stats.channel_state_bytes == sum(
            s.channel_state_bytes for s in stats.subtasks.values()
        )
        assert stats.unaligned == any(s.unaligned for s in stats.subtasks.values())
        recorded_somewhere += stats.channel_state_records
    if run.mode in ("aligned", "at_least_once", "aligned-concurrent", "spark"):
        assert recorded_somewhere == 0
        assert not any(s.unaligned for s in run.history.checkpoints)
    if run.mode == "unaligned":
        assert recorded_somewhere > 0, "the buffers were full: some records were overtaken"


# ----------------------------------------------------------------------- restarts, runs


def test_the_restart_is_recorded_with_its_cause(run: Run) -> None:
    (info,) = run.history.runs
    if run.mode == "spark":  # no failure there
        assert run.history.restarts == []
        assert not list((run.root / STATS_FOLDER).glob("restart-*.json"))
        return
    (restart,) = run.history.restarts
    assert (run.root / STATS_FOLDER / f"restart-{info.run}-1.json").exists()
    assert restart.run == info.run
    assert restart.generation == 1
    assert restart.restarted
    assert "injected failure after a checkpoint" in restart.cause
    assert "fail" in restart.cause  # the operator
    assert restart.restored_from is not None
    restored = run.history.checkpoint(restart.restored_from)
    assert restored is not None and restored.completed and restored.generation == 1
    assert restart.failed_at >= 0
    assert info.started <= restart.time <= (info.ended or 0)
    assert [r.to_dict() for r in run.result.restarts] == [restart.to_dict()]
    # the timeline: the first generation's checkpoints were triggered before the failure
    for stats in run.history.checkpoints:
        if stats.generation == 1:
            assert stats.triggered_at <= restart.failed_at
        else:
            assert stats.triggered_at > restart.failed_at


def test_the_run_is_recorded_as_finished_with_the_plan_s_subtasks_and_channels(
    run: Run,
) -> None:
    (info,) = run.history.runs
    plan = run.plan
    assert info.outcome == "finished"
    assert info.ended is not None and info.ended >= info.started
    assert info.parallelism == 2
    assert info.checkpointing == (
        "at_least_once"
        if run.mode == "at_least_once"
        else ("unaligned" if run.mode == "unaligned" else "aligned")
    )
    assert info.subtasks == plan.subtasks()
    assert info.operators == {op.uid: op.name for c in plan.chains for op in c.operators}
    assert info.restored_from is None
    # every input channel of every subtask, each with the subtask at its two ends
    expected = {
        channel: subtask_name(chain.uid, index)
        for chain in plan.chains
        for index in range(plan.parallelism)
        for channel in plan.input_channels(chain, index)
    }
    assert {c: ends[1] for c, ends in info.channels.items()} == expected
    # and the sender of each is the subtask that counted what it sent on it
    for checkpoint_id in run.retained():
        for subtask, handle in run.storage.read_metadata(checkpoint_id).handles.items():
            assert handle.channels is not None
            for channel in handle.channels["sent"]:
                assert info.channels[channel][0] == subtask
            for channel in handle.channels["received"]:
                assert info.channels[channel][1] == subtask


def critical_path_holds(stats: CheckpointStats, info: RunInfo, plan: ExecutionPlan) -> None:
    """The path starts at the slowest subtask, each hop goes back along an input channel of
    its subtask to that channel's sender, and it ends at a source."""
    path = critical_path(stats, info)
    slowest = stats.slowest
    assert path and slowest is not None and path[0][0] == slowest.subtask
    for (subtask, channel), (upstream, _) in itertools.pairwise(path):
        assert channel is not None
        assert channel in stats.subtasks[subtask].barriers
        assert info.channels[channel] == [upstream, subtask]
    last, channel = path[-1]
    assert channel is None
    # a source, or a subtask that snapshotted before any barrier reached it (the alignment
    # timeout started the checkpoint there)
    assert last in plan.source_subtasks() or (
        stats.subtasks[last].snapshot_barrier is None and stats.checkpointing == "aligned"
    ), (stats.checkpoint_id, path)


def test_the_critical_path_of_each_checkpoint_ends_at_a_source(run: Run) -> None:
    (info,) = run.history.runs
    for stats in run.complete():
        critical_path_holds(stats, info, run.plan)


# ----------------------------------------------------------------------------- savepoints


def test_a_savepoint_s_statistics_name_it_and_count_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = environment(tmp_path, "aligned", retained=1, batch_size=10)
    keyed_job(env, 0.0, None)  # (no need to be slow: the savepoint comes while it holds)
    asking = SavepointOnHold(
        endpoints_of(monkeypatch),
        lambda _: JobClient(str(tmp_path / "checkpoints")).savepoint(tmp_path / "sp"),
    )
    result = testing.execute(
        env, launcher=ThreadLauncher(), listener=asking, hold_sources=half_of_each_subtask(N, 2)
    )
    path = asking.answer()
    assert isinstance(path, str), path
    assert result.savepoints == [path]
    history = CheckpointStorage(str(tmp_path / "checkpoints")).read_history()
    (stats,) = [s for s in history.checkpoints if s.savepoint is not None]
    assert stats.savepoint == path
    assert stats.completed and not stats.final
    assert [c.savepoint for c in result.checkpoints].count(path) == 1
    assert set(stats.subtasks) == set(env.plan().subtasks())
    on_disk = sizes_on_disk(Path(path))
    assert stats.size == stats.full_size == sum(on_disk.values())
    location = CheckpointLocation.open(path)
    metadata = location.read_metadata()
    assert metadata.checkpoint_id == stats.checkpoint_id
    for subtask, handle in metadata.handles.items():
        assert handle.shared == []  # a savepoint owns its files
        assert stats.subtasks[subtask].state_size == on_disk[handle.path]
    verification = verify_checkpoint(location)
    assert verification.ok, verification.summary()
    (info,) = history.runs
    critical_path_holds(stats, info, env.plan())


# ------------------------------------------------------------ found through the statistics


def test_a_barrier_the_alignment_timeout_promotes_keeps_its_incremental_base() -> None:
    token = b"stats-test"
    with InputGate(["c"], token=token, generation=0, capacity=1) as gate:
        out = OutputChannel(("127.0.0.1", gate.port), "c", token=token, generation=0, capacity=8)
        try:
            out.send(Records(["r0"]))  # takes the only credit: what follows waits in the queue
            deadline = time.monotonic() + 30
            while gate.buffered("c") < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            out.send(Records(["r1"]))
            out.send(Barrier(2, base=1))  # checkpoint 2 may build on checkpoint 1's files
            assert [f.batch for f in out.promote(2) or []] == [["r1"]]
            item = gate.poll(set(), timeout=30, priority_only=True)
            assert item is not None
            _, frame = item
            assert isinstance(frame, PriorityBarrier)
            assert frame.barrier.checkpoint_id == 2 and frame.barrier.unaligned
            assert frame.barrier.base == 1
        finally:
            out.close()


def test_the_critical_path_of_a_loop_s_checkpoint_ends_at_its_source() -> None:
    # source -> head -> body -> back to head; the head acknowledges last: its recording of the
    # back edge ends with the barrier that went round the loop (as in a real loop's statistics)
    info = RunInfo(
        run="r",
        started=0.0,
        parallelism=1,
        checkpointing="aligned",
        operators={"src": "src", "head": "iterate", "body": "body"},
        subtasks=["src-0", "head-0", "body-0"],
        channels={
            "src>head:0>0": ["src-0", "head-0"],
            "head>body:0>0": ["head-0", "body-0"],
            "body>head:0>0": ["body-0", "head-0"],
        },
    )

    def acknowledged(
        name: str, at: float, barriers: dict[str, float], snapshot_at: float
    ) -> SubtaskStats:
        return SubtaskStats(
            name, at, 0.0, 0.0, 0.0, 0.0, 100, barriers=barriers, snapshot_at=snapshot_at
        )

    stats = CheckpointStats(
        1,
        1,
        duration=0.5,
        subtasks={
            "src-0": acknowledged("src-0", 0.1, {}, 0.05),
            "head-0": acknowledged("head-0", 0.5, {"src>head:0>0": 0.1, "body>head:0>0": 0.4}, 0.1),
            "body-0": acknowledged("body-0", 0.3, {"head>body:0>0": 0.2}, 0.2),
        },
    )
    path = critical_path(stats, info)
    assert path[0][0] == "head-0"
    assert path[-1] == ("src-0", None)
