"""When a checkpoint cannot be quick (real backpressure: its barrier waits behind records queued
for a slower subtask), the statistics and the progress say where it waited and behind how many
records. (How close to the interval checkpoints come is measured by bench/b6_cadence.py: no test
asserts a timing.)"""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa

from cutline import StreamEnvironment, testing
from cutline.runtime.checkpoint.storage import CheckpointStorage
from cutline.runtime.task.local import ThreadLauncher


def slow_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A receiver whose cost is per batch: frames are not cut for it, so they stay queued."""
    time.sleep(0.15)
    return batch


def test_a_checkpoint_behind_queued_records_says_where_and_behind_how_many(tmp_path: Path):
    env = StreamEnvironment(
        2,
        checkpoint_interval=0.1,
        checkpoint_dir=str(tmp_path / "ck"),
        batch_size=500,
        buffer_capacity=4,
    )
    (
        env.from_sequence(0, 16_000, name="numbers")
        .key_by(lambda r: r["value"] % 2)
        .map_batches(slow_batch, name="slow")
        .collect()
    )
    said: list[tuple[str, str]] = []
    result = testing.execute(
        env,
        launcher=ThreadLauncher(),
        listener=lambda kind, message: said.append((kind, message)),
        progress=False,
    )  # the sources are far faster than 0.15 s a batch: the buffers are full (4 frames on
    # each side of a channel, a second and more of the receiver's work) from the first moment
    # to the last, so every checkpoint's barrier waits behind them
    assert len(result.output) == 16_000
    behind = [c.waited_behind for c in result.checkpoints if c.waited_behind is not None]
    assert behind, "no checkpoint recorded what its barrier waited behind"
    sender, channel, records = max(behind, key=lambda b: b[2])
    assert sender.startswith("numbers-") and channel.startswith("numbers>slow:")
    assert records >= 1_000
    waiting = [message for kind, message in said if kind == "waiting"]
    assert waiting, said
    assert " in flight for " in waiting[0] and "waiting for slow-" in waiting[0]
    assert "records on numbers>slow:" in waiting[0] and "(backpressure)" in waiting[0]
    # the statistics files say it too, for `cutline checkpoints show`
    history = CheckpointStorage(str(tmp_path / "ck")).read_history()
    assert any(c.waited_behind for c in history.checkpoints)
