"""A join on the disk backend whose state is several times the memory it is given, through a
failure: the interval join's kept rows (every view, with a payload, kept for a minute of event
time) are written to Arrow files in ``state_dir`` beyond half of ``state_memory``; the job
fails once, restores from its last complete checkpoint (taken while the sources were held
part-way, the rows spilled), and publishes every pair and every unmatched click exactly once;
no spill file is left after the job."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_event_time import FailOnceOn

from cutline import EventTime, FixedDelay, SourceHold, State, StreamEnvironment, testing
from cutline.runtime.state.spill import SpillFiles
from cutline.runtime.task.local import ThreadLauncher

ADS = 20_000
VIEWS = 40_000
"""Views kept: about 20,000 in each of the 2 subtasks, each with a 250-byte payload: 5 MB, five
times the 1 MiB of ``state_memory`` (and ten times the half of it a join keeps in memory)."""
CLICKS = 8_000
S = 1_000


def write(path: Path, rows: list[dict[str, Any]]) -> None:
    """Rows into 2 files, each in time order."""
    path.mkdir(parents=True)
    for i in range(2):
        part = sorted(rows[i::2], key=lambda r: r["ts"])
        pq.write_table(pa.Table.from_pylist(part), path / f"{i}.parquet")


def test_a_join_larger_than_the_state_memory_is_exact_through_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(11)
    views = [
        {"ad": rng.randrange(ADS), "ts": rng.randrange(60 * S), "view": i, "page": f"{i:0250d}"}
        for i in range(VIEWS)
    ]
    clicks = [
        {"ad": rng.randrange(ADS), "ts": rng.randrange(60 * S), "click": i, "amount": 1}
        for i in range(CLICKS)
    ]
    max(clicks, key=lambda c: c["ts"])["amount"] = 99  # (the failure: after the hold)
    write(tmp_path / "views", views)
    write(tmp_path / "clicks", clicks)
    spilled: list[str] = []
    write_files = SpillFiles.write

    def counted(self: SpillFiles, batches: Any) -> Any:
        path, mapped = write_files(self, batches)
        spilled.append(path)
        return path, mapped

    monkeypatch.setattr(SpillFiles, "write", counted)
    env = StreamEnvironment(
        2,
        checkpoint_interval=0.05,
        checkpoint_dir=tmp_path / "checkpoints",
        restart_strategy=FixedDelay(delay=0),
        batch_size=2_000,
        state=State(backend="disk", memory=1 << 20, dir=tmp_path / "state"),
    )
    time = EventTime("ts", max_out_of_orderness=0)
    left = env.read_parquet(tmp_path / "clicks", event_time=time, name="clicks").map_batches(
        FailOnceOn(99, tmp_path / "failed")
    )
    right = env.read_parquet(tmp_path / "views", event_time=time, name="views")
    left.interval_join(right, on="ad", between=("-60s", "0s"), how="left").collect()
    # each source subtask holds after 3,000 records until a checkpoint completed
    result = testing.execute(env, launcher=ThreadLauncher(), hold_sources=SourceHold(3_000))
    assert len(result.restarts) == 1, "the failure was injected once"
    assert result.restarts[0].restored_from is not None, "restored from a checkpoint"
    # (named join-<subtask>-<generation>-<n>.arrow: both subtasks spilled in both attempts,
    # the second its rows restored from the checkpoint)
    made = {Path(p).name.rsplit("-", 1)[0] for p in spilled if Path(p).name.startswith("join-")}
    assert made == {"join-0-1", "join-1-1", "join-0-2", "join-1-2"}
    by_ad: dict[int, list[dict[str, Any]]] = {}
    for v in views:
        by_ad.setdefault(v["ad"], []).append(v)
    wanted: Counter[tuple[Any, ...]] = Counter()
    for c in clicks:
        found = [v for v in by_ad.get(c["ad"], []) if -60 * S <= v["ts"] - c["ts"] <= 0]
        for v in found:
            wanted[(c["click"], v["view"], v["page"])] += 1
        if not found:
            wanted[(c["click"], None, None)] += 1
    got = Counter((r["click"], r["view"], r["page"]) for r in result.collected["collect"])
    assert got == wanted
    assert not list((tmp_path / "state").rglob("*.arrow")), "no spill file is left"
