"""Window contents and timers read as Spark DataFrames (``read_state``): exactly what the
checkpoint holds, as the checkpoint reader shows it, for the columnar windows (memory
backend), the keyed layout (disk backend) and a process function's timers.

The jobs run on threads, held half-way so that their last checkpoint holds windows and
timers not fired yet; only the reading is Spark's.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cutline import (
    Checkpoints,
    KeyedProcessFunction,
    ProcessContext,
    SourceHold,
    State,
    StreamEnvironment,
    Tumbling,
    testing,
)
from cutline.runtime.checkpoint.reader import open_checkpoint
from cutline.runtime.task.local import ThreadLauncher
from cutline.spark.datasource import read_state


class Remind(KeyedProcessFunction):
    """An event-time timer 5 s after each click."""

    def process(self, record: dict[str, Any], ctx: ProcessContext) -> None:
        ctx.timer_service.register_event_time_timer(record["ts"] + 5000)

    def on_timer(self, timestamp: int, ctx: ProcessContext) -> list[dict[str, Any]]:
        return [{"user": ctx.key, "at": timestamp}]


def held_job(tmp_path: Path, backend: str) -> Path:
    """Clicks through windows and a timer function; the sources hold half-way until the job
    ends (a stop after the hold): the last checkpoint holds open windows and timers."""
    rng = random.Random(3)
    (tmp_path / "in").mkdir()
    rows = []
    t = 1_700_000_000_000
    for _ in range(400):
        t += rng.randint(0, 40)
        rows.append({"user": f"u{rng.randrange(5)}", "ts": t, "amount": rng.randint(1, 9)})
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in" / "c.parquet")
    checkpoints = tmp_path / "ck"
    env = StreamEnvironment(
        1,
        checkpoints=Checkpoints(interval=0.05, dir=checkpoints, retained=100),
        state=State(backend=backend),
    )
    keyed = env.read_parquet(tmp_path / "in", event_time="ts").key_by("user")
    keyed.window(Tumbling("5s")).sum("amount", name="per_5s").collect("sums")
    keyed.process(Remind(), name="remind").collect("reminders")
    testing.execute(env, launcher=ThreadLauncher(), hold_sources=SourceHold(records=200))
    return checkpoints


@pytest.mark.parametrize("backend", ["memory", "disk"])
def test_windows_and_timers_are_read_as_the_checkpoint_holds_them(
    spark, tmp_path: Path, backend: str
) -> None:
    checkpoints = held_job(tmp_path, backend)
    chosen = None
    for folder in sorted(checkpoints.glob("chk-*"), key=lambda p: int(p.name[4:])):
        reader = open_checkpoint(str(folder))
        if any(True for _ in reader.keyed_entries("per_5s")):
            chosen = folder
            break
    assert chosen is not None, "a checkpoint holds windows not fired yet"
    reader = open_checkpoint(str(chosen))
    for operator, state in (("per_5s", "windows"), ("remind", "_timers")):
        wanted = sorted(
            (repr(e.key), repr(e.value)) for e in reader.keyed_entries(operator) if e.state == state
        )
        assert wanted, f"{operator} holds {state}"
        df = read_state(spark, str(chosen), operator, state=state, types="string")
        got = sorted((r["key"], r["value"]) for r in df.collect())
        assert got == wanted
