"""Every phase of a generation has a deadline: a worker that freezes (SIGSTOP: no crash, no
closed connection) or stalls (its process alive, its heartbeats going on) in any phase is noticed,
the generation fails with a cause naming the slot and the phase, and the job restarts and
publishes its output exactly once.

The faults land by construction: the job's phase hook runs in the slot's own process as it enters
each phase, and the test's hook freezes or stalls exactly there (in the first generation only).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import replace
from pathlib import Path

import pyarrow.dataset as ds

from cutline import FixedDelay, StreamEnvironment, Timeouts, testing

N = 20_000
KEYS = 7


class Freeze:
    """A phase hook: slot ``slot`` of generation ``g`` stops itself (SIGSTOP) on entering
    ``phases[g - 1]``, after writing its process id to ``pids`` (the test kills it afterwards,
    whatever happened). One phase per generation: every restart is the next phase's test."""

    def __init__(self, phases: list[str], pids: Path, slot: int = 1) -> None:
        self.phases, self.pids, self.slot = phases, str(pids), slot

    def __call__(self, phase: str, slot: int, generation: int) -> None:
        mine = generation <= len(self.phases) and phase == self.phases[generation - 1]
        if mine and slot == self.slot:
            with open(self.pids, "a") as out:
                out.write(f"{os.getpid()}\n")
            self.fault()

    def fault(self) -> None:
        os.kill(os.getpid(), signal.SIGSTOP)


class Stall(Freeze):
    """A phase hook: the slot's thread that enters the phase blocks (its process and its
    heartbeats go on) until Spark kills the worker when the driver cancels the generation."""

    def fault(self) -> None:
        while True:
            time.sleep(1)


def key_value(record: dict) -> dict:
    """Values 1..N (never 0, so that every running sum of a key differs from the others)."""
    return {"key": record["value"] % KEYS, "value": record["value"] + 1}


def _run(spark, tmp_path: Path, hook: Freeze, timeouts: Timeouts | None = None, **settings: object):
    options: dict[str, object] = {
        "checkpoint_interval": 0.2,
        "checkpoint_dir": str(tmp_path / "ck"),
        "restart_strategy": FixedDelay(delay=0),
        "timeouts": replace(timeouts or Timeouts(), heartbeat=2),
        "batch_size": 500,
    }
    options.update(settings)
    env = StreamEnvironment(2, **options)  # type: ignore[arg-type]
    env.from_sequence(0, N).map(key_value).key_by("key").sum("value").write_parquet(
        tmp_path / "out"
    )
    try:
        return testing.execute(env, spark, phase_hook=hook)
    finally:
        pids = Path(hook.pids)
        for pid in pids.read_text().split() if pids.exists() else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)


def _assert_exact(output: Path) -> None:
    table = ds.dataset(str(output), format="parquet").to_table()
    finals: dict[int, list[int]] = {}
    for key, value in zip(table["key"].to_pylist(), table["value"].to_pylist(), strict=True):
        finals.setdefault(key, []).append(value)
    assert table.num_rows == N
    for key, sums in finals.items():
        assert len(sums) == len(set(sums))  # every running sum once
        assert max(sums) == sum(v + 1 for v in range(key, N, KEYS))


FROZEN = {
    "rendezvous": "no heartbeat for 2 s, during the rendezvous",
    "restore": "no heartbeat for 2 s, while restoring its state",
    "running": "no heartbeat for 2 s, while running",
    "final_checkpoint": "no heartbeat for 2 s, during the final checkpoint",
    "commit": "no heartbeat for 2 s, while publishing after the final checkpoint",
}


def test_a_worker_frozen_in_any_phase_is_noticed_and_the_job_restarts_exactly(spark, tmp_path):
    """Generation 1 freezes in the rendezvous, generation 2 while restoring, 3 while running,
    4 at the final checkpoint, 5 while publishing; generation 6 ends the job."""
    phases = list(FROZEN)
    result = _run(
        spark,
        tmp_path,
        Freeze(phases, tmp_path / "pids"),
        restart_strategy=FixedDelay(len(phases), delay=0),
    )
    assert len((tmp_path / "pids").read_text().split()) == len(phases)
    assert len(result.restarts) == len(phases)
    for restart, phase in zip(result.restarts, phases, strict=True):
        assert restart.cause.startswith("slot-1: stopped answering (")
        assert FROZEN[phase] in restart.cause, (phase, restart.cause)
    _assert_exact(tmp_path / "out")


def test_a_worker_frozen_before_it_reached_the_driver_misses_the_start_deadline(spark, tmp_path):
    """(The deadline is what a slot that is not frozen needs to start on a loaded machine, with
    room: slot-0 took over 6 s with three test workers on two cores.)"""
    result = _run(
        spark, tmp_path, Freeze(["start"], tmp_path / "pids"), timeouts=Timeouts(start=20)
    )
    [restart] = result.restarts
    assert restart.cause.startswith("slot-1 did not start within 20 s (Timeouts.start)")
    _assert_exact(tmp_path / "out")


def test_a_worker_that_stalls_in_a_phase_misses_its_deadline_and_the_job_restarts_exactly(
    spark, tmp_path
):
    """The process is alive and sends heartbeats; only the phase's deadline tells: generation 1
    stalls while restoring, generation 2 while publishing after the final checkpoint."""
    hook = Stall(["restore", "commit"], tmp_path / "pids")
    result = _run(
        spark,
        tmp_path,
        hook,
        timeouts=Timeouts(restore=2, commit=2),
        restart_strategy=FixedDelay(2, delay=0),
    )
    restore, commit = result.restarts
    assert restore.cause.startswith(
        "slot-1: did not report running within 2 s of starting its restore (Timeouts.restore)"
    )
    # (the other slot waits for the stalled one's end of input: both are named)
    assert "slot-1 did not publish and end within 2 s of the final checkpoint" in commit.cause
    _assert_exact(tmp_path / "out")
