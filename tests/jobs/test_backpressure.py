"""Backpressure: a slow operator slows its sources down, so memory stays bounded.

The job runs through the real runtime (TCP channels, bounded queues) with the thread launcher,
so that one counter can see both ends: how many records the sources emitted, and how many the
slow operator has processed. Without backpressure the sources would read the whole input at
once (their reading is hundreds of times faster than the slow operator); with it, the records
in flight stay below what the queues and socket buffers hold.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pyarrow as pa
import pyarrow.compute as pc

from cutline import StreamEnvironment, testing
from cutline.runtime.task.local import ThreadLauncher

ROWS = 1_000_000
BATCH = 10_000
PADDING = "x" * 100  # about 1 MB per batch: socket buffers hold less than one


class Flow:
    lock = threading.Lock()
    emitted = 0
    processed = 0
    most_in_flight = 0


def count_emitted(batch: pa.RecordBatch) -> pa.RecordBatch:
    with Flow.lock:
        Flow.emitted += batch.num_rows
    padding = pa.array([PADDING] * batch.num_rows, pa.string())
    return batch.append_column("padding", padding).append_column(
        "key", pc.bit_wise_and(batch.column("value"), 7)
    )


def slow_operator(batch: pa.RecordBatch) -> pa.RecordBatch:
    time.sleep(0.02)
    with Flow.lock:
        Flow.processed += batch.num_rows
        Flow.most_in_flight = max(Flow.most_in_flight, Flow.emitted - Flow.processed)
    return batch.select(["key"])


def test_a_slow_operator_slows_the_sources_and_memory_stays_bounded(tmp_path):
    Flow.emitted = Flow.processed = Flow.most_in_flight = 0
    env = StreamEnvironment(
        2,
        checkpoint_interval=0.2,
        checkpoint_dir=str(tmp_path / "ck"),
        batch_size=BATCH,
        buffer_capacity=2,
    )
    (
        env.from_sequence(0, ROWS)
        .map_batches(count_emitted)
        .key_by("key")
        .map_batches(slow_operator)
        .key_by("key")
        .count()
        .collect()
    )
    result = testing.execute(env, launcher=ThreadLauncher())
    # exact output: every key's running counts 1..n, once each
    per_key = Counter(r["key"] for r in result.output)
    assert sum(per_key.values()) == ROWS
    for key, n in per_key.items():
        assert sorted(r["count"] for r in result.output if r["key"] == key) == list(range(1, n + 1))
    # bounded: per channel at most the queue (2 batches), about one batch in each socket
    # direction and one being decoded, for 4 channels, plus the batches in hand at the sources;
    # far below the whole input, which the sources would have read at once without it
    assert Flow.most_in_flight <= 30 * BATCH
    assert Flow.most_in_flight < ROWS // 3
    # and aligned checkpoints still completed while the buffers were full
    assert result.checkpoints[-1].final
