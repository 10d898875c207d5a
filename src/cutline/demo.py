"""The demo of ``make demo``: BENCHMARKS.md B1 (a keyed running count of 2,000,000 events)
on local Spark, with checkpoints every second and one worker process killed part-way.

It writes the input (20 Parquet files), runs ``read_parquet -> key_by("key") -> sum("value")
-> write_parquet`` at parallelism 2, kills a Python worker with SIGKILL once the first
periodic checkpoint is complete, lets cutline restart from it, and checks the published output:
every key's running sums are exactly 1, 2, ..., 200, each once.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from cutline.api.environment import StreamEnvironment
from cutline.runtime.driver import JobResult


def write_b1_input(
    directory: str | Path, events: int = 2_000_000, keys: int = 10_000, files: int = 20
) -> None:
    """B1's input: event ``i`` has key ``"k" + str(i % keys)`` and value 1, in ``files`` files."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, events, files + 1, dtype=np.int64)
    for f in range(files):
        ids = np.arange(bounds[f], bounds[f + 1], dtype=np.int64)
        names = np.char.add("k", (ids % keys).astype(str))
        table = pa.table(
            {"key": pa.array(names.tolist(), pa.string()), "value": np.ones(len(ids), np.int64)}
        )
        pq.write_table(table, directory / f"events-{f:02d}.parquet")


@dataclass
class Verdict:
    """The check of B1's output: every key's running sums are 1..expected, each exactly once."""

    rows: int
    keys: int
    expected_per_key: int
    wrong_keys: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return not self.wrong_keys and self.rows == self.keys * self.expected_per_key


def check_b1_output(directory: str | Path, keys: int, per_key: int) -> Verdict:
    table = ds.dataset(str(directory), format="parquet").to_table(columns=["key", "value"])
    grouped = table.group_by("key").aggregate(
        [("value", "count"), ("value", "count_distinct"), ("value", "max"), ("value", "min")]
    )
    ok = pc.and_(
        pc.and_(
            pc.equal(grouped["value_count"], per_key),
            pc.equal(grouped["value_count_distinct"], per_key),
        ),
        pc.and_(pc.equal(grouped["value_max"], per_key), pc.equal(grouped["value_min"], 1)),
    )
    wrong = grouped.filter(pc.invert(ok))["key"].to_pylist()
    missing = keys - grouped.num_rows
    verdict = Verdict(table.num_rows, grouped.num_rows, per_key, [str(k) for k in wrong])
    if missing:
        verdict.wrong_keys.append(f"{missing} key(s) missing")
    return verdict


def b1_job(
    env: StreamEnvironment, input_dir: str | Path, output_dir: str | Path
) -> StreamEnvironment:
    env.read_parquet(str(input_dir)).key_by("key").sum("value").write_parquet(str(output_dir))
    return env


class WorkerKiller:
    """Kills one slot's Python worker (SIGKILL) when ``when`` says so, in generation 1 only."""

    def __init__(self, slot: str = "slot-1") -> None:
        self.slot = slot
        self.pids: dict[str, int] = {}
        self.killed_at: float | None = None
        self.ready_at: dict[int, float] = {}
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    def on_ready(self, generation: int, pids: dict[str, int]) -> None:
        self.ready_at[generation] = time.monotonic()
        if generation == 1:
            self.pids = pids
            if self._timer is not None:
                self._timer.start()

    def after(self, delay: float) -> WorkerKiller:
        """Kill ``delay`` seconds after generation 1 is running (pass ``on_ready`` to
        ``execute``, and call :meth:`disarm` after it)."""
        self._timer = threading.Timer(delay, self.kill)
        return self

    def disarm(self) -> None:
        """Never kill later: the pid may by then be a reused worker of another job."""
        if self._timer is not None:
            self._timer.cancel()

    def kill(self) -> bool:
        with self._lock:
            if self.killed_at is not None or self.slot not in self.pids:
                return False
            os.kill(self.pids[self.slot], signal.SIGKILL)
            self.killed_at = time.monotonic()
            return True

    def recovery_seconds(self) -> float | None:
        """From the kill to the next generation's slots all running again."""
        if self.killed_at is None or 2 not in self.ready_at:
            return None
        return self.ready_at[2] - self.killed_at


def run_demo(
    workdir: str | Path,
    *,
    events: int = 2_000_000,
    kill: bool = True,
    echo: Callable[[str], None] = print,
    spark: Any = None,
) -> tuple[JobResult, Verdict]:
    workdir = Path(workdir)
    input_dir, output_dir, checkpoints = workdir / "input", workdir / "output", workdir / "ck"
    for folder in (output_dir, checkpoints):
        shutil.rmtree(folder, ignore_errors=True)
    keys, per_key = 10_000, events // 10_000
    if not (input_dir / "events-19.parquet").exists() or _rows(input_dir) != events:
        shutil.rmtree(input_dir, ignore_errors=True)
        echo(f"writing {events:,} events over {keys:,} keys to {input_dir} (20 Parquet files)")
        write_b1_input(input_dir, events, keys)
    # smaller batches than the default: the job then lasts a few seconds here, long enough for
    # a checkpoint to complete before the kill (with the default it is over in about one)
    env = StreamEnvironment(
        parallelism=2,
        checkpoint_interval="1s",
        checkpoint_dir=str(checkpoints),
        restart_delay=0.5,
        batch_size=8192,
        retained_checkpoints=3,  # for `cutline checkpoints show / diff` afterwards
    )
    b1_job(env, input_dir, output_dir)
    killer = WorkerKiller()
    start = time.monotonic()

    def listener(kind: str, message: str) -> None:
        echo(f"[{time.monotonic() - start:6.2f} s] {kind:<10} {message}")
        if kill and kind == "checkpoint" and "(final)" not in message and killer.kill():
            echo(
                f"[{time.monotonic() - start:6.2f} s] {'kill':<10} SIGKILL to the Python worker "
                f"of {killer.slot} (pid {killer.pids[killer.slot]})"
            )

    echo("running read_parquet -> key_by(key) -> sum(value) -> write_parquet at parallelism 2")
    result = env.execute(spark, listener=listener, on_ready=killer.on_ready)
    verdict = check_b1_output(output_dir, keys, per_key)
    echo(
        f"done in {result.duration:.1f} s: {len(result.checkpoints)} checkpoints complete, "
        f"{len(result.restarts)} restart(s)"
    )
    recovery = killer.recovery_seconds()
    if kill and killer.killed_at is None:
        echo(
            "note: the input was read before the first periodic checkpoint completed, so no "
            "worker was killed; run with more --events to see a recovery"
        )
    if recovery is not None:
        echo(f"recovery: {recovery:.1f} s from the kill to every slot running again")
    for restart in result.restarts:
        after = result.source_records.get(restart.generation + 1)
        if restart.restored_from is not None and after is not None:
            echo(
                f"generation {restart.generation + 1} restored checkpoint {restart.restored_from} "
                f"and read the {after:,} events after its offsets"
            )
    if verdict.exact:
        echo(
            f"exact: {verdict.rows:,} records published; all {verdict.keys:,} keys end at "
            f"{per_key}, every running sum 1..{per_key} exactly once"
        )
    else:
        echo(f"NOT exact: {verdict.rows:,} records; wrong keys: {verdict.wrong_keys[:10]}")
    return result, verdict


def _rows(directory: Path) -> int:
    try:
        return int(ds.dataset(str(directory), format="parquet").count_rows())
    except (OSError, pa.ArrowInvalid):
        return -1
