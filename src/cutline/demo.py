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
import subprocess
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

from cutline import testing
from cutline.api.environment import StreamEnvironment
from cutline.api.progress import wanted
from cutline.api.setting_groups import Checkpoints, HostLossPolicy, Timeouts
from cutline.runtime.driver.events import (
    CheckpointCompleted,
    GenerationRunning,
    JobEvent,
    JobListener,
    SavepointCompleted,
)
from cutline.runtime.driver.restart import FixedDelay
from cutline.runtime.driver.result import JobResult
from cutline.runtime.task.launch import SourceHold


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
    env: StreamEnvironment,
    input_dir: str | Path,
    output_dir: str | Path,
    rate: float | None = None,
) -> StreamEnvironment:
    env.read_parquet(str(input_dir), rate_limit=rate).key_by("key").sum("value").write_parquet(
        str(output_dir)
    )
    return env


class WorkerKiller(JobListener):
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

    def on_event(self, event: JobEvent) -> None:
        """As a job's listener: kill on the first checkpoint completed (not the final one, not
        a savepoint), unless :meth:`after`'s timer killed already. With the sources held
        part-way (``cutline.testing.execute(env, hold_sources=...)``) the job is then still
        running, however fast the machine."""
        match event:
            case SavepointCompleted():
                pass
            case CheckpointCompleted(final=False):
                self.kill()

    def describe(self) -> str:
        """What :meth:`kill` did."""
        return f"killed the Python worker of {self.slot} (pid {self.pids[self.slot]}) with SIGKILL"

    def recovery_seconds(self) -> float | None:
        """From the kill to the next generation's slots all running again."""
        if self.killed_at is None or 2 not in self.ready_at:
            return None
        return self.ready_at[2] - self.killed_at


class HostKiller(WorkerKiller):
    """On a cluster: runs ``command`` (a shell command; ``{host}`` stands for the host of
    ``slot``, e.g. ``scripts/cluster.sh kill-worker {host}``) to lose that slot's host."""

    def __init__(self, command: str, hosts: Callable[[], dict[str, str]], slot: str) -> None:
        super().__init__(slot)
        self.command = command
        self.hosts = hosts
        self.host: str | None = None

    def kill(self) -> bool:
        with self._lock:
            host = self.hosts().get(self.slot)
            if self.killed_at is not None or not host or host == "?":
                return False
            self.host = host
            self.killed_at = time.monotonic()
            subprocess.run(self.command.replace("{host}", host), shell=True, check=False)
            return True

    def describe(self) -> str:
        return f"lost the host {self.host} of {self.slot}: ran `{self.command}`"


def run_demo(
    workdir: str | Path,
    *,
    events: int = 2_000_000,
    kill: bool = True,
    echo: Callable[[str], None] = print,
    spark: Any = None,
    parallelism: int = 2,
    kill_command: str | None = None,
    resume: bool = False,
    on_host_loss: HostLossPolicy = "restart",
    heartbeat_timeout: float = 30.0,
    rate: float | None = None,
) -> tuple[JobResult, Verdict]:
    """Run B1 and check its output. On a cluster (``spark`` not local) ``workdir`` must be a
    path every host sees, and a worker host is lost only through ``kill_command``. With
    ``resume`` the job starts from the newest checkpoint in ``workdir`` (a driver that died
    part-way), keeping what was published. ``rate``: events per second at most (the whole
    source)."""
    from cutline.spark.launcher import SparkLauncher, is_local

    workdir = Path(workdir).absolute()
    input_dir, output_dir, checkpoints = workdir / "input", workdir / "output", workdir / "ck"
    if not resume:
        for folder in (output_dir, checkpoints):
            shutil.rmtree(folder, ignore_errors=True)
    keys, per_key = 10_000, events // 10_000
    if not (input_dir / "events-19.parquet").exists() or _rows(input_dir) != events:
        if resume:
            raise FileNotFoundError(
                f"{input_dir} does not hold the {events:,} events of an earlier run to resume"
            )
        shutil.rmtree(input_dir, ignore_errors=True)
        echo(f"writing {events:,} events over {keys:,} keys to {input_dir} (20 Parquet files)")
        write_b1_input(input_dir, events, keys)
    env = StreamEnvironment(
        parallelism=parallelism,
        checkpoints=Checkpoints(
            interval="1s",
            dir=checkpoints,
            retained=3,  # for `cutline checkpoints show / diff` afterwards
        ),
        timeouts=Timeouts(heartbeat=heartbeat_timeout),
        restart_strategy=FixedDelay(delay=0.5),
        on_host_loss=on_host_loss,
    )
    b1_job(env, input_dir, output_dir, rate)
    launcher = SparkLauncher.for_session(spark, parallelism)
    local = is_local(launcher.spark)
    hosts: dict[int, dict[str, str]] = {}
    last_slot = f"slot-{parallelism - 1}"
    killer: WorkerKiller = (
        HostKiller(kill_command, lambda: hosts.get(1, {}), last_slot)
        if kill_command is not None
        else WorkerKiller(last_slot)
    )
    kill = kill and (local or kill_command is not None)
    # The kill must come while the job runs, on a machine of any speed: every source subtask
    # stops at half its input until a checkpoint taken since is complete and the listener
    # (which kills on it) was told; then it reads on, or rather, its worker is dead by then.
    hold = SourceHold(records=events // (2 * parallelism)) if kill and not resume else None
    start = time.monotonic()

    class Listener(JobListener):
        """Say every event; note where each generation runs; kill on the first checkpoint."""

        def on_event(self, event: JobEvent) -> None:
            echo(f"[{time.monotonic() - start:6.2f} s] {event}")
            match event:
                case GenerationRunning(generation=generation, hosts=running_on):
                    hosts[generation] = running_on
                case SavepointCompleted():
                    pass
                case CheckpointCompleted(final=False) if kill and killer.kill():
                    echo(f"[{time.monotonic() - start:6.2f} s] {killer.describe()}")

    listener = Listener()

    where = "local Spark" if local else f"Spark at {launcher.spark.sparkContext.master}"
    echo(
        "running read_parquet -> key_by(key) -> sum(value) -> write_parquet at parallelism "
        f"{parallelism} on {where}" + (", from the newest checkpoint" if resume else "")
    )
    if hold is not None:
        echo(
            f"each source subtask pauses after {hold.records:,} events until a checkpoint is "
            "complete; then a worker is killed"
        )
    result = testing.execute(
        env,
        launcher=launcher,
        listener=listener,
        on_ready=killer.on_ready,
        restore_from="latest" if resume else None,
        hold_sources=hold,
        progress=None if wanted(None) else False,  # (without a terminal: its own lines only)
    )
    verdict = check_b1_output(output_dir, keys, per_key)
    echo(
        f"done in {result.duration:.1f} s: {len(result.checkpoints)} checkpoints complete, "
        f"{len(result.restarts)} restart(s)"
    )
    if result.restored_from is not None:
        echo(f"resumed from {result.restored_from}")
    for generation, slots in sorted(result.hosts.items()):
        echo(f"generation {generation} ran on {', '.join(sorted(set(slots.values())))}")
    recovery = killer.recovery_seconds()
    if kill and killer.killed_at is None:
        echo("note: no worker was killed (the job failed before its first checkpoint completed)")
    elif not local and kill_command is None and not resume:
        echo("note: on a cluster no worker is killed unless --kill-command says how")
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
