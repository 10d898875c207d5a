"""Windows of the disk backend larger than the memory it is given, through a failure: a job
whose tumbling and sliding windows hold far more runs than ``state_memory`` lets it keep in
memory (they are written to files in ``state_dir``) fails once, restores from its last
complete checkpoint (taken while the sources were held part-way) and publishes every window
exactly once with its exact sum."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from test_event_time import FailOnceOn

from cutline import (
    EventTime,
    FixedDelay,
    Sliding,
    SourceHold,
    State,
    StreamEnvironment,
    Tumbling,
    testing,
)
from cutline.runtime.task.local import ThreadLauncher

USERS = 40_000
"""Keys: each subtask holds about 20,000 keys in each of its 3 windows (and 4 slices), over
1 MB of runs, beyond the 0.5 MB that 1 MiB of ``state_memory`` keeps in memory."""


def test_windows_larger_than_the_state_memory_are_exact_through_a_failure(
    tmp_path: Path,
) -> None:
    rng = random.Random(7)
    rows = [
        {"user": f"user-{u:06d}", "ts": window * 1_000 + rng.randrange(1_000), "amount": 1 + u % 5}
        for window in range(3)
        for u in range(USERS)
    ]
    rows.sort(key=lambda r: r["ts"])
    rows[-1]["amount"] = 99  # (the record the failure is injected on: after the hold)
    (tmp_path / "in").mkdir()
    table = pa.Table.from_pylist(rows)
    for i in range(4):
        pq.write_table(
            table.slice(i * len(rows) // 4, len(rows) // 4), tmp_path / "in" / f"{i}.parquet"
        )
    env = StreamEnvironment(
        2,
        checkpoint_interval=0.05,
        checkpoint_dir=tmp_path / "checkpoints",
        restart_strategy=FixedDelay(delay=0),
        batch_size=5_000,
        state=State(backend="disk", memory=1 << 20, dir=tmp_path / "state"),
    )
    keyed = (
        env.read_parquet(tmp_path / "in", event_time=EventTime("ts", max_out_of_orderness=0))
        .map_batches(FailOnceOn(99, tmp_path / "failed"))
        .key_by("user")
    )
    keyed.window(Tumbling("1s")).sum("amount", name="tumbling").collect("tumbling")
    keyed.window(Sliding("2s", every="1s")).sum("amount", name="sliding").collect("sliding")
    # each source subtask reads 2 of the 4 files (30,000 records each), holds after 20,000
    # until a checkpoint completed, then reads on to the record the job fails on
    result = testing.execute(
        env, launcher=ThreadLauncher(), hold_sources=SourceHold(records=20_000)
    )
    assert len(result.restarts) == 1, "the failure was injected once"
    assert result.restarts[0].restored_from is not None, "restored from a checkpoint"
    for name, size in (("tumbling", 1_000), ("sliding", 2_000)):
        wanted: Counter[tuple[str, int]] = Counter()
        for r in rows:
            start = r["ts"] - r["ts"] % 1_000
            for s in range(start - size + 1_000, start + 1, 1_000):
                wanted[(r["user"], s)] += r["amount"]
        got = [(r["user"], r["window_start"], r["amount"]) for r in result.collected[name]]
        assert len(got) == len({(u, s) for u, s, _ in got}), f"{name}: each window once"
        assert {(u, s): a for u, s, a in got} == dict(wanted), name
