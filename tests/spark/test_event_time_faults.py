"""Event-time windows on a real local Spark session, with a Python worker SIGKILLed at a random
moment: every window's result is published exactly once (read back from the Parquet output),
equal to the one computed in plain Python from the same input.

The input (``write_clicks`` of ``test_event_time_restore.py``): Parquet files overlapping in
event time, each at most the job's ``max_out_of_orderness`` out of order, so no record is late
and the results are determined by the input alone. The kill lands by construction: the sources
hold part-way until a checkpoint triggered after the hold completed and the listener, which
kills, was told of it (``_execute_killing`` of ``test_spark_jobs.py``).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from test_event_time_restore import (
    VECTORIZED,
    Clicks,
    OnCheckpoint,
    Slow,
    assert_exact,
    expected,
    fired_windows_kept,
    published,
    window_job,
    write_clicks,
)

from cutline import (
    Checkpoints,
    DataStream,
    FixedDelay,
    SourceHold,
    State,
    StreamEnvironment,
    testing,
)
from cutline.demo import WorkerKiller
from cutline.runtime.checkpoint.reader import open_checkpoint
from cutline.runtime.driver.result import JobResult

FILES, PER_FILE = 6, 1000
"""Six files of 1,000 clicks: three per source subtask at parallelism 2."""


def _env(tmp_path: Path, **settings: Any) -> StreamEnvironment:
    options: dict[str, Any] = {
        "checkpoint_interval": 0.3,
        "checkpoint_dir": str(tmp_path / "ck"),
        "restart_strategy": FixedDelay(delay=0),
        "batch_size": 100,
    }
    options.update(settings)
    return StreamEnvironment(2, **options)


def _clicks(tmp_path: Path, seed: int) -> Clicks:
    return write_clicks(tmp_path / "in", seed, files=FILES, per_file=PER_FILE, row_group=100)


def _execute_killing(
    env: StreamEnvironment, spark: Any, killer: WorkerKiller, hold: int, listener: Any = None
) -> JobResult:
    """Run the job with ``killer`` armed (its timer, and the first checkpoint completed while
    the sources hold after ``hold`` records each, or ``listener``'s condition): it must have
    killed a worker, and the job restarted once for it."""
    try:
        result = testing.execute(
            env,
            spark,
            on_ready=killer.on_ready,
            listener=listener if listener is not None else killer,
            hold_sources=SourceHold(records=hold),
        )
    finally:
        killer.disarm()  # never kill a reused worker of a later test
    assert killer.killed_at is not None
    assert len(result.restarts) == 1
    cause = result.restarts[0].cause
    assert "lost" in cause or "died" in cause, cause
    return result


def _random_kill(rng: random.Random, clicks: Clicks) -> tuple[WorkerKiller, int]:
    """A killer of a random slot after a random delay, and a random hold in the middle half of
    what each source subtask reads."""
    per_subtask = len(clicks.read_by(0, 2))
    killer = WorkerKiller(slot=f"slot-{rng.randrange(2)}").after(rng.uniform(0.2, 1.5))
    return killer, rng.randrange(per_subtask // 4, 3 * per_subtask // 4)


@pytest.mark.parametrize(
    "seed", [0, pytest.param(1, marks=pytest.mark.slow)]
)  # (seed 1: make soak)
@pytest.mark.parametrize("kind", VECTORIZED)
def test_a_sigkill_at_a_random_moment_publishes_each_window_once(
    spark, tmp_path: Path, kind: str, seed: int
) -> None:
    """Tumbling count, sliding sum, session count: a random worker killed at a random moment;
    every window is published once with its exact result, none from the run that died and
    again from the restored one."""
    rng = random.Random(f"{kind}-{seed}")
    clicks = _clicks(tmp_path, seed)
    env = _env(tmp_path)
    window_job(env, clicks, tmp_path / "out", [kind])
    killer, hold = _random_kill(rng, clicks)
    _execute_killing(env, spark, killer, hold)
    assert_exact(kind, published(tmp_path / "out" / kind), expected(kind, clicks.records))


def _slow_between_key_by_and_windows(stream: DataStream) -> DataStream:
    return stream.key_by("user").map_batches(Slow(0.01), name="slow")


MODES = {
    "unaligned": Checkpoints(mode="unaligned"),
    "aligned-timeout": Checkpoints(mode="aligned", alignment_timeout=0.05),
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_unaligned_checkpoints_under_backpressure_survive_a_sigkill(
    spark, tmp_path: Path, mode: str
) -> None:
    """A slow operator between ``key_by`` and the windows, buffers of two frames: unaligned
    checkpoints (or aligned ones that time out into unaligned) record records and watermarks
    in flight; a worker is killed at a random moment; each window once, exact."""
    rng = random.Random(f"{mode}-kill")
    clicks = _clicks(tmp_path, 5)
    kinds = ("tumbling", "session")
    env = _env(
        tmp_path,
        buffer_capacity=2,
        checkpoint_interval=0.2,
        batch_size=50,
        checkpoints=MODES[mode],
    )
    window_job(env, clicks, tmp_path / "out", kinds, through=_slow_between_key_by_and_windows)
    killer, hold = _random_kill(rng, clicks)
    result = _execute_killing(env, spark, killer, hold)
    for kind in kinds:
        assert_exact(kind, published(tmp_path / "out" / kind), expected(kind, clicks.records))
    if mode == "unaligned":
        assert all(c.unaligned for c in result.checkpoints if not c.final)
    # the premise: the buffers were full, and checkpoints recorded what was in flight
    assert any(c.unaligned and c.channel_state_records > 0 for c in result.checkpoints)


def test_the_disk_state_backend_restores_windows_after_a_sigkill(spark, tmp_path: Path) -> None:
    """The windows' state in the disk backend (incremental checkpoints): a random worker
    killed at a random moment; each window once, exact."""
    rng = random.Random("disk")
    clicks = _clicks(tmp_path, 9)
    kinds = ("sliding", "session")
    env = _env(tmp_path, state=State(backend="disk", dir=str(tmp_path / "state")))
    window_job(env, clicks, tmp_path / "out", kinds)
    killer, hold = _random_kill(rng, clicks)
    _execute_killing(env, spark, killer, hold)
    for kind in kinds:
        assert_exact(kind, published(tmp_path / "out" / kind), expected(kind, clicks.records))


def test_windows_kept_for_allowed_lateness_are_published_once_after_a_sigkill(
    spark, tmp_path: Path
) -> None:
    """With allowed lateness, windows that fired stay in state, marked fired. A worker is
    killed on a checkpoint that holds such windows (while a source subtask holds: the job is
    running); after the restore none fires again (no record is late: none may), each window
    is published once with its result, and the late output is empty."""
    rng = random.Random("lateness")
    clicks = _clicks(tmp_path, 12)
    kinds = VECTORIZED
    hold = clicks.hold_in_last_file(2, fraction=rng.uniform(0.2, 0.8))
    env = _env(tmp_path, checkpoints=Checkpoints(retained=100))
    window_job(env, clicks, tmp_path / "out", kinds, lateness="5s", late=True)
    killer = WorkerKiller(slot=f"slot-{rng.randrange(2)}")
    listener = OnCheckpoint(
        tmp_path / "ck",
        lambda _: killer.kill(),
        lambda reader: all(fired_windows_kept(reader, kind) > 0 for kind in kinds),
        hold=hold,
    )
    result = _execute_killing(env, spark, killer, hold, listener)
    assert listener.acted_on is not None
    restored = result.restarts[0].restored_from
    assert restored is not None and restored >= listener.acted_on
    reader = open_checkpoint(str(tmp_path / "ck"), restored)
    assert all(fired_windows_kept(reader, kind) > 0 for kind in kinds)
    for kind in kinds:
        assert_exact(kind, published(tmp_path / "out" / kind), expected(kind, clicks.records))
        assert published(tmp_path / "out" / f"{kind}-late") == []
