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
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from cutline import StreamEnvironment

N = 20_000
KEYS = 7


class Freeze:
    """A phase hook: slot ``slot`` of generation 1 stops itself (SIGSTOP) on entering ``phase``,
    after writing its process id to ``pids`` (the test kills it afterwards, whatever happened)."""

    def __init__(self, phase: str, pids: Path, slot: int = 1) -> None:
        self.phase, self.pids, self.slot = phase, str(pids), slot

    def __call__(self, phase: str, slot: int, generation: int) -> None:
        if generation == 1 and phase == self.phase and slot == self.slot:
            with open(self.pids, "a") as out:
                out.write(f"{os.getpid()}\n")
            os.kill(os.getpid(), signal.SIGSTOP)


class Stall(Freeze):
    """A phase hook: the slot's thread that enters ``phase`` blocks (its process and heartbeats
    go on) until Spark kills the worker when the driver cancels the generation."""

    def __call__(self, phase: str, slot: int, generation: int) -> None:
        if generation == 1 and phase == self.phase and slot == self.slot:
            with open(self.pids, "a") as out:
                out.write(f"{os.getpid()}\n")
            while True:
                time.sleep(1)


def key_value(record: dict) -> dict:
    """Values 1..N (never 0, so that every running sum of a key differs from the others)."""
    return {"key": record["value"] % KEYS, "value": record["value"] + 1}


def _run(spark, tmp_path: Path, hook: Freeze, **settings: object):
    options: dict[str, object] = {
        "checkpoint_interval": 0.2,
        "checkpoint_dir": str(tmp_path / "ck"),
        "restart_delay": 0,
        "heartbeat_timeout": 2,
        "batch_size": 500,
    }
    options.update(settings)
    env = StreamEnvironment(2, **options)  # type: ignore[arg-type]
    env.from_sequence(0, N).map(key_value).key_by("key").sum("value").write_parquet(
        tmp_path / "out"
    )
    try:
        return env.execute(spark, phase_hook=hook)
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


@pytest.mark.parametrize(
    ("phase", "said"),
    [
        ("start", "did not start within 6 s (start_timeout)"),
        ("rendezvous", "no heartbeat for 2 s, during the rendezvous"),
        ("restore", "no heartbeat for 2 s, while restoring its state"),
        ("running", "no heartbeat for 2 s, while running"),
        ("final_checkpoint", "no heartbeat for 2 s, during the final checkpoint"),
        ("commit", "no heartbeat for 2 s, while publishing after the final checkpoint"),
    ],
)
def test_a_worker_frozen_in_any_phase_is_noticed_and_the_job_restarts_exactly(
    spark, tmp_path, phase, said
):
    result = _run(spark, tmp_path, Freeze(phase, tmp_path / "pids"), start_timeout=6)
    assert (tmp_path / "pids").exists(), "the hook froze nothing"
    assert result.restarts, "the frozen worker was not noticed"
    assert "slot-1" in result.restarts[0].cause and said in result.restarts[0].cause
    _assert_exact(tmp_path / "out")


@pytest.mark.parametrize(
    ("phase", "settings", "said"),
    [
        (
            "restore",
            {"restore_timeout": 2},
            "slot-1: did not report running within 2 s of starting its restore (restore_timeout)",
        ),
        (
            "commit",
            {"commit_timeout": 2},
            "slot-1 did not publish and end within 2 s of the final checkpoint",
        ),
    ],
)
def test_a_worker_that_stalls_in_a_phase_misses_its_deadline_and_the_job_restarts_exactly(
    spark, tmp_path, phase, settings, said
):
    """The process is alive and sends heartbeats; only the phase's deadline tells."""
    result = _run(spark, tmp_path, Stall(phase, tmp_path / "pids"), **settings)
    assert (tmp_path / "pids").exists(), "the hook stalled nothing"
    assert result.restarts
    assert said in result.restarts[0].cause
    _assert_exact(tmp_path / "out")
