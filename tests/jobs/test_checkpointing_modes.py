"""Every checkpointing mode through the real runtime (threads for slots, real sockets and files):
aligned, unaligned, aligned with an alignment timeout, and at-least-once, each under
backpressure from a slow operator, with and without an injected failure.

Exactly-once modes must publish exactly the expected output; at-least-once must lose
nothing, and the duplicates it published are counted. The end-to-end runs on local Spark
with killed workers are in ``test_spark_jobs.py``.
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from cutline import Checkpoints, FixedDelay, JobResult, SourceHold, StreamEnvironment, testing
from cutline.runtime.task.local import ThreadLauncher

N = 2_000
EXACTLY_ONCE = ["aligned", "unaligned", "aligned-timeout"]


def environment(
    tmp_path: Path, mode: str, checkpoints: Checkpoints | None = None, **options: Any
) -> StreamEnvironment:
    """Checkpoints every 0.1 s in ``mode`` (or ``"aligned-timeout"``: aligned, and every
    alignment that has to wait switches to unaligned), with the fields of ``checkpoints``."""
    checkpoints = checkpoints or Checkpoints()
    if mode == "aligned-timeout":
        checkpoints = replace(checkpoints, alignment_timeout=0.0)
    else:
        checkpoints = replace(checkpoints, mode=mode)
    settings: dict[str, Any] = {
        "checkpoint_interval": 0.1,
        "checkpoint_dir": tmp_path / "checkpoints",
        "checkpoints": checkpoints,
        "restart_strategy": FixedDelay(delay=0),
        "batch_size": 20,
    }
    settings.update(options)
    return StreamEnvironment(2, **settings)


@dataclass(frozen=True)
class SlowBatches:
    """Sleeps ``pause`` seconds per batch while ``flag`` does not exist (then runs freely)."""

    flag: str
    pause: float

    @property
    def __name__(self) -> str:
        return "slow_batches"

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if not os.path.exists(self.flag):
            time.sleep(self.pause)
        return batch


@dataclass(frozen=True)
class FailOnceAfter:
    """Raises once, on the first batch after ``marker`` exists (a flag file remembers it)."""

    marker: str
    flag: str

    @property
    def __name__(self) -> str:
        return "fail_once_after"

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if os.path.exists(self.marker):
            try:
                os.close(os.open(self.flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return batch
            raise RuntimeError("injected failure after a checkpoint")
        return batch


def touch_on(path: Path, *kinds: str) -> Callable[[str, str], None]:
    def listener(kind: str, message: str) -> None:
        if kind in kinds:
            path.touch()

    return listener


HALF = SourceHold(records=N // 4)
"""Each source subtask (of two) holds after half its records until a checkpoint completed:
a failure on the first batch after a complete checkpoint always has input left to fail on."""


def keyed_job(
    env: StreamEnvironment,
    tmp_path: Path,
    pause: float,
    *,
    fast_flag: str = "fast",
    then: Callable[[pa.RecordBatch], pa.RecordBatch] | None = None,
) -> None:
    """Sequence -> key_by -> a slow operator (fast once ``tmp_path/fast_flag`` exists) ->
    ``then`` -> keyed running count -> collect."""
    slow = (
        env.from_sequence(0, N)
        .map_batches(lambda b: b.append_column("key", pa.compute.bit_wise_and(b["value"], 15)))
        .key_by("key")
        .map_batches(SlowBatches(str(tmp_path / fast_flag), pause))
    )
    if then is not None:
        slow = slow.map_batches(then)
    slow.key_by("key").count().collect()


def expected_counts() -> Counter[tuple[int, int]]:
    sizes = Counter(v & 15 for v in range(N))
    return Counter((k, i) for k, n in sizes.items() for i in range(1, n + 1))


def counts(result: JobResult) -> Counter[tuple[int, int]]:
    return Counter((r["key"], r["count"]) for r in result.output)


@pytest.mark.parametrize("mode", EXACTLY_ONCE)
def test_exactly_once_modes_give_the_exact_output_under_backpressure(
    tmp_path: Path, mode: str
) -> None:
    env = environment(tmp_path, mode)
    keyed_job(env, tmp_path, pause=0.02)
    result = testing.execute(env, launcher=ThreadLauncher())
    assert result.restarts == []
    assert counts(result) == expected_counts()
    assert result.checkpoints[-1].final
    if mode == "aligned":
        assert all(not c.unaligned and c.channel_state_records == 0 for c in result.checkpoints)


@pytest.mark.parametrize("mode", EXACTLY_ONCE)
def test_exactly_once_modes_restore_from_a_checkpoint_taken_under_backpressure(
    tmp_path: Path, mode: str
) -> None:
    marker = tmp_path / "checkpointed"
    env = environment(tmp_path, mode)
    fail = FailOnceAfter(str(marker), str(tmp_path / "failed"))
    keyed_job(env, tmp_path, 0.01, fast_flag="never", then=fail)
    result = testing.execute(
        env, launcher=ThreadLauncher(), listener=touch_on(marker, "checkpoint"), hold_sources=HALF
    )
    assert len(result.restarts) == 1
    assert result.restarts[0].restored_from is not None
    assert counts(result) == expected_counts()


def test_unaligned_checkpoints_record_the_records_in_flight_and_restore_them(
    tmp_path: Path,
) -> None:
    """The job fails on the first batch after the first checkpoint completed, and that is the
    checkpoint it restores: the listener keeps the driver until the failure happened (the
    slow operator goes on with the batches it has meanwhile), so no other checkpoint can
    complete first. The slow operator (behind full buffers) is the load: its batches take
    two seconds at least, and the first checkpoint comes after 0.2 s."""
    marker, failed = tmp_path / "checkpointed", tmp_path / "failed"
    env = environment(tmp_path, "unaligned", checkpoint_interval=0.2)
    fail = FailOnceAfter(str(marker), str(failed))
    keyed_job(env, tmp_path, 0.02, fast_flag="never", then=fail)

    def listener(kind: str, message: str) -> None:
        if kind == "checkpoint" and not marker.exists():
            marker.touch()
            deadline = time.monotonic() + 60  # (only so that a broken job cannot hang)
            while not failed.exists() and time.monotonic() < deadline:
                time.sleep(0.002)

    result = testing.execute(env, launcher=ThreadLauncher(), listener=listener)
    assert counts(result) == expected_counts()
    first = result.checkpoints[0]
    assert first.unaligned
    assert first.channel_state_records > 0  # the buffers were full: records were overtaken
    assert result.restarts[0].restored_from == first.checkpoint_id


@pytest.mark.parametrize("mode", ["aligned", "unaligned"])
def test_unaligned_checkpoints_complete_while_aligned_ones_wait_behind_full_buffers(
    tmp_path: Path, mode: str
) -> None:
    # A slow operator (a second per batch) with full buffers on both its inputs: an aligned
    # barrier waits behind every queued batch (many seconds), longer than the checkpoint
    # timeout; an unaligned one overtakes them and completes after the batch in progress.
    # The first checkpoint that ends (completes or is aborted) lets the operator go fast.
    fast = tmp_path / "fast"
    env = environment(
        tmp_path,
        mode,
        checkpoint_interval=0.5,
        checkpoints=Checkpoints(timeout=6, tolerable_failures=5),
        batch_size=100,
    )
    keyed_job(env, tmp_path, pause=1.0)
    result = testing.execute(
        env, launcher=ThreadLauncher(), listener=touch_on(fast, "checkpoint", "abort")
    )
    assert counts(result) == expected_counts()
    if mode == "unaligned":
        assert result.aborted == []
        assert result.checkpoints[0].checkpoint_id == 1
        assert result.checkpoints[0].channel_state_records > 0
    else:
        assert result.aborted[0][0] == 1
        assert "timed out" in result.aborted[0][1] or "expired" in result.aborted[0][1]


def test_an_alignment_timeout_switches_a_slow_alignment_to_unaligned(tmp_path: Path) -> None:
    env = environment(
        tmp_path, "aligned", checkpoints=Checkpoints(alignment_timeout=0.2), batch_size=100
    )
    keyed_job(env, tmp_path, pause=0.3)
    result = testing.execute(
        env, launcher=ThreadLauncher(), listener=touch_on(tmp_path / "fast", "abort")
    )
    assert counts(result) == expected_counts()
    assert any(c.unaligned for c in result.checkpoints)


def test_at_least_once_loses_nothing_across_a_restart_and_counts_its_duplicates(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "checkpointed"
    env = environment(tmp_path, "at_least_once")
    (
        env.from_sequence(0, N)
        .map_batches(lambda b: b.append_column("key", pa.compute.bit_wise_and(b["value"], 15)))
        .key_by("key")
        .map_batches(SlowBatches(str(tmp_path / "never"), 0.01))
        .map_batches(FailOnceAfter(str(marker), str(tmp_path / "failed")))
        .key_by("key")
        .map(lambda r: r["value"])
        .collect()
    )
    result = testing.execute(
        env, launcher=ThreadLauncher(), listener=touch_on(marker, "checkpoint"), hold_sources=HALF
    )
    assert len(result.restarts) == 1
    published = Counter(result.output)
    assert set(published) == set(range(N))  # nothing lost
    duplicates = sum(published.values()) - N
    assert duplicates >= 0
    assert all(n >= 1 for n in published.values())


def most_in_flight(result: JobResult) -> int:
    """The most periodic checkpoints of ``result`` in flight at one moment (trigger to
    complete). The final checkpoint is triggered on demand, whatever is in flight."""
    periodic = [c for c in result.checkpoints if not c.final]
    events = sorted(
        [(c.triggered_at, 1) for c in periodic]
        + [(c.triggered_at + c.duration, -1) for c in periodic]
    )
    most = now = 0
    for _, step in events:  # at equal times the completion (-1) comes first
        now += step
        most = max(most, now)
    return most


@pytest.mark.parametrize("concurrent", [1, 3])
def test_concurrent_checkpoints_honour_the_maximum_and_the_output_is_exact(
    tmp_path: Path, concurrent: int
) -> None:
    # Checkpoints every 20 ms that take longer than that (a slow operator behind full
    # buffers): with room for three, several are in flight at once, never more than three.
    env = environment(
        tmp_path,
        "aligned",
        checkpoints=Checkpoints(max_concurrent=concurrent),
        checkpoint_interval=0.02,
    )
    keyed_job(env, tmp_path, pause=0.02)
    result = testing.execute(env, launcher=ThreadLauncher())
    assert counts(result) == expected_counts()
    ids = [c.checkpoint_id for c in result.checkpoints]
    assert ids == sorted(ids)
    assert most_in_flight(result) <= concurrent
    if concurrent > 1:
        assert most_in_flight(result) > 1


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"mode": "exactly_once"},
            "Checkpoints.mode must be one of 'aligned', 'unaligned', 'at_least_once', not "
            "'exactly_once'",
        ),
        (
            {"mode": "unaligned", "alignment_timeout": "1s"},
            "Checkpoints.alignment_timeout applies to mode='aligned' only, not mode='unaligned'",
        ),
        (
            {"alignment_timeout": -1},
            "Checkpoints.alignment_timeout must be a finite duration of 0 s or more, not -1",
        ),
        (
            {"mode": "unaligned", "max_concurrent": 2},
            "unaligned checkpoints are taken one at a time: Checkpoints.max_concurrent must be 1 "
            "with mode='unaligned', not 2",
        ),
        (
            {"alignment_timeout": "10ms", "max_concurrent": 3},
            "with an alignment_timeout checkpoints may go unaligned, and those are taken one at "
            "a time: Checkpoints.max_concurrent must be 1, not 3",
        ),
        ({"max_concurrent": 0}, "Checkpoints.max_concurrent must be an integer of 1 or more"),
        ({"max_concurrent": True}, "Checkpoints.max_concurrent must be an integer of 1 or more"),
        ({"alignment_timeout": float("nan")}, "alignment_timeout=nan is not a duration"),
    ],
)
def test_bad_checkpointing_settings_are_refused_with_a_clear_message(
    fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        Checkpoints(**fields)
