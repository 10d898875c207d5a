"""``connect`` exactly once across a stop with a savepoint and a restore at another
parallelism under the other state backend: the state a key's two sides share, and the
broadcast state every subtask holds (copied to each new subtask, checked to be the same)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from test_event_time_restore import SOURCE, OnCheckpoint, StopWithSavepoint, endpoints_of

from cutline import (
    BroadcastProcessFunction,
    KeyedCoProcessFunction,
    SourceHold,
    State,
    StreamEnvironment,
    testing,
)
from cutline.runtime.checkpoint.reader import CheckpointReader
from cutline.runtime.co_operators import restored_copy
from cutline.runtime.operators import OperatorContext, RecordError
from cutline.runtime.task.local import ThreadLauncher

KEYS = 13
ROWS = 3_000
HOLD = 700


def write(path: Path, rows: list[dict[str, Any]], parts: int) -> Path:
    path.mkdir(parents=True)
    table = pa.Table.from_pylist(rows)
    size = len(rows) // parts
    for i in range(parts):
        pq.write_table(table.slice(i * size, size), path / f"{i}.parquet")
    return path


class Tally(KeyedCoProcessFunction):
    """Per key, the records of both sides so far (one count, shared): each record is emitted
    with its side and the count it made."""

    def open(self, ctx: Any) -> None:
        self.seen = ctx.value_state("seen")

    def _count(self, record: Any, side: str) -> Any:
        seen = self.seen.get(0) + 1
        self.seen.update(seen)
        yield {"key": record["key"], "id": record["id"], "side": side, "seen": seen}

    def process_left(self, record: Any, ctx: Any) -> Any:
        return self._count(record, "left")

    def process_right(self, record: Any, ctx: Any) -> Any:
        return self._count(record, "right")


class Limits(BroadcastProcessFunction):
    def process(self, record: Any, ctx: Any) -> Any:
        yield {"id": record["id"], "rules": len(ctx.broadcast_state)}

    def process_broadcast(self, value: Any, ctx: Any) -> Any:
        ctx.broadcast_state[value["kind"]] = value["limit"]
        return None


def job(env: StreamEnvironment, inputs: Path, out: Path) -> None:
    left = env.read_parquet(inputs / "left", name=SOURCE)  # (the one OnCheckpoint watches)
    right = env.read_parquet(inputs / "right")
    left.key_by("key").connect(right.key_by("key")).process(Tally(), name="tally").write_parquet(
        out / "tally", name="tally-out"
    )
    rules = env.read_parquet(inputs / "rules")
    left.connect(rules.broadcast()).process(Limits(), name="limits").write_parquet(
        out / "limits", name="limits-out"
    )


def broadcast_everywhere(reader: CheckpointReader) -> bool:
    """Every subtask of ``limits`` holds the 4 rules in the checkpoint."""
    states = [
        reader.state_file(subtask).operators["limits"]
        for subtask, handle in reader.handles.items()
        if "limits" in handle.operators
    ]
    return bool(states) and all(len(s) == 4 for s in states)


@pytest.mark.parametrize(("before", "after", "p1", "p2"), [("memory", "disk", 2, 3)])
def test_connected_state_is_exact_through_a_savepoint_restored_at_another_parallelism(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, before: str, after: str, p1: int, p2: int
) -> None:
    inputs = tmp_path / "in"
    write(inputs / "left", [{"key": i % KEYS, "id": i} for i in range(ROWS)], 2)
    write(inputs / "right", [{"key": i % KEYS, "id": -i - 1} for i in range(ROWS)], 2)
    write(inputs / "rules", [{"kind": k, "limit": k} for k in range(4)], 1)
    endpoints = endpoints_of(monkeypatch)

    def environment(p: int, backend: str, name: str) -> StreamEnvironment:
        return StreamEnvironment(
            p,
            checkpoint_interval=0.05,
            checkpoint_dir=tmp_path / f"ck{name}",
            state=State(backend=backend, dir=tmp_path / f"state{name}"),  # type: ignore[arg-type]
            batch_size=100,
        )

    env = environment(p1, before, "1")
    job(env, inputs, tmp_path / "out1")
    stop = StopWithSavepoint(tmp_path / "ck1", endpoints)
    listener = OnCheckpoint(tmp_path / "ck1", stop, broadcast_everywhere, hold=HOLD, releases=1000)
    first = testing.execute(
        env,
        launcher=ThreadLauncher(),
        listener=listener,
        hold_sources=SourceHold(records=HOLD, checkpoints=1000),
    )
    savepoint = stop.answer()
    assert isinstance(savepoint, str) and first.savepoints == [savepoint], savepoint

    env = environment(p2, after, "2")
    job(env, inputs, tmp_path / "out2")
    testing.execute(env, savepoint, launcher=ThreadLauncher(), restore_from=savepoint)

    tally = [
        r
        for run in ("out1", "out2")
        for r in ds.dataset(tmp_path / run / "tally", format="parquet").to_table().to_pylist()
    ]
    assert sorted(r["id"] for r in tally) == sorted(
        [*range(ROWS), *(-i - 1 for i in range(ROWS))]
    ), "every record once"
    counts: dict[int, list[int]] = defaultdict(list)
    for r in tally:
        counts[r["key"]].append(r["seen"])
    for key, seen in counts.items():  # one count per key, shared by both sides, never reset
        assert sorted(seen) == list(range(1, len(seen) + 1)), key

    first_limits = ds.dataset(tmp_path / "out1" / "limits", format="parquet").to_table()
    later = ds.dataset(tmp_path / "out2" / "limits", format="parquet").to_table().to_pylist()
    assert sorted([*first_limits.column("id").to_pylist(), *(r["id"] for r in later)]) == list(
        range(ROWS)
    )
    # the rules were read before the savepoint: after the restore every subtask (3 now, from
    # the 2 copies) has all of them without reading them again
    assert later and all(r["rules"] == 4 for r in later)


def test_broadcast_copies_that_differ_fail_the_restore_naming_where() -> None:
    ctx = OperatorContext(
        name="limits", subtask=0, parallelism=3, max_parallelism=128, generation=1
    )
    assert restored_copy([{"a": 1}, {"a": 1}], ctx) == {"a": 1}
    assert restored_copy(None, ctx) == {}
    with pytest.raises(
        RecordError,
        match=r"limits: the checkpoint holds broadcast states that differ between its subtasks "
        r"\(copy 0 and copy 1, at key 'b': 2 and None\)",
    ):
        restored_copy([{"a": 1, "b": 2}, {"a": 1}], ctx)
