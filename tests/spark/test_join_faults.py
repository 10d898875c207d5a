"""The built-in joins and a ``KeyedCoProcessFunction`` on a real local Spark session, a Python
worker SIGKILLed at a random moment: every result published exactly once (read back from the
Parquet output), equal to the plain-Python answer (``tests/join_inputs.py``: the inputs, in
which no record is late, so the results are fixed by the input alone).

The kill lands by construction (``_execute_killing`` of ``test_event_time_faults.py``): a
random slot's worker after a random delay, or at the latest on the first checkpoint
completed while the sources hold at a random point (the job is then running, however fast
the machine). Under unaligned checkpoints, the join itself is slow (a sleep chained after it)
and its input buffers are two frames, so both of its inputs are full: the worker is killed
on the first checkpoint that recorded records in flight on both.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from test_event_time_faults import _execute_killing
from test_event_time_restore import OnCheckpoint, Slow, published

from cutline import Checkpoints, DataStream, FixedDelay, State, StreamEnvironment
from cutline.demo import WorkerKiller
from cutline.runtime.checkpoint.reader import CheckpointReader, open_checkpoint
from join_inputs import (
    JOINS,
    RIGHT_IDS,
    Input,
    answer,
    assert_once,
    assert_tally,
    join_job,
    tally_job,
    write_side,
)

FILES, PER_FILE = 4, 600
"""Per input: two files for each source subtask (parallelism 2)."""
PER_SUBTASK = FILES // 2 * PER_FILE
KINDS = [*JOINS, "tally"]


def _inputs(tmp_path: Path, seed: int, nulls: bool) -> tuple[Input, Input]:
    """Both inputs; ``nulls``: with records whose key is null."""
    sides: dict[str, Any] = {"files": FILES, "per_file": PER_FILE, "nulls": nulls}
    left = write_side(tmp_path / "in" / "clicks", seed, first_id=0, **sides)
    right = write_side(
        tmp_path / "in" / "views", seed + 1, first_id=RIGHT_IDS, distinct_times=True, **sides
    )
    return left, right


def _env(tmp_path: Path, **settings: Any) -> StreamEnvironment:
    options: dict[str, Any] = {
        "checkpoint_interval": 0.3,
        "checkpoint_dir": str(tmp_path / "ck"),
        "restart_strategy": FixedDelay(delay=0),
        "batch_size": 100,
    }
    options.update(settings)
    return StreamEnvironment(2, **options)


IN_MAKE_TEST = ("interval", "window", "tally")
"""The kinds ``make test`` runs at seed 0 (the memory backend, the disk one, and two inputs
sharing keyed state); every kind at every seed runs in ``make soak``."""


@pytest.mark.parametrize(
    ("kind", "seed"),
    [
        pytest.param(
            kind, seed, marks=() if seed == 0 and kind in IN_MAKE_TEST else pytest.mark.slow
        )
        for seed in (0, 1, 2)
        for kind in KINDS
    ],
)
def test_a_sigkill_at_a_random_moment_publishes_each_join_result_once(
    spark: Any, tmp_path: Path, kind: str, seed: int
) -> None:
    """Interval (full), window (tumbling, left), as-of (left) and regular (inner) joins, and
    a keyed co-process function's shared count and timers: a random worker killed at a
    random moment; every result published once, none from the run that died and again from
    the restored one, outer rows included (and the rows of null keys, which pair with
    nothing). The state backend alternates with the kind and
    the seed: each kind runs on both over the seeds, and ``make test`` runs both."""
    rng = random.Random(f"{kind}-{seed}")
    left, right = _inputs(tmp_path, seed, nulls=kind != "tally")  # (key_by refuses a null)
    out = tmp_path / "out"
    backend = ("memory", "disk")[(KINDS.index(kind) + seed) % 2]
    env = _env(tmp_path, state=State(backend=backend, dir=str(tmp_path / "state")))
    if kind == "tally":
        tally_job(env, left, right, out)
    else:
        join_job(env, left, right, out, [kind])
    killer = WorkerKiller(slot=f"slot-{rng.randrange(2)}").after(rng.uniform(0.2, 1.5))
    _execute_killing(env, spark, killer, rng.randrange(PER_SUBTASK // 4, 3 * PER_SUBTASK // 4))
    if kind == "tally":
        assert_tally(published(out / "tally"), left, right)
    else:
        assert_once(kind, published(out / kind), answer(kind, left.records, right.records))


def _recorded_inputs(reader: CheckpointReader, join: str) -> set[str]:
    """The inputs (their sources' names) of ``join``'s subtasks whose records in flight the
    checkpoint recorded."""
    found = set()
    for subtask, handle in reader.handles.items():
        if join in handle.operators and handle.channel_state:
            inputs, _ = reader.recorded_counts(subtask)
            found |= {channel.split(">")[0] for channel, n in inputs.items() if n}
    return found


MODES = {
    "unaligned": Checkpoints(mode="unaligned", retained=100),
    "aligned-timeout": Checkpoints(mode="aligned", alignment_timeout=0.01, retained=100),
}


@pytest.mark.parametrize(
    "mode", ["unaligned", pytest.param("aligned-timeout", marks=pytest.mark.slow)]
)
def test_unaligned_checkpoints_of_a_join_under_backpressure_survive_a_sigkill(
    spark: Any, tmp_path: Path, mode: str
) -> None:
    """The interval join (full) slow, its input buffers of two frames, unaligned checkpoints
    (or aligned ones that time out into unaligned): a random worker is killed on the first
    checkpoint that recorded records in flight on both of the join's inputs, and the job
    restores it (the records replayed into both inputs): every result once, exact."""
    rng = random.Random(mode)
    left, right = _inputs(tmp_path, 5, nulls=True)
    out = tmp_path / "out"
    env = _env(
        tmp_path,
        buffer_capacity=2,
        checkpoint_interval=0.2,
        batch_size=50,
        checkpoints=MODES[mode],
    )

    def slow(joined: DataStream) -> DataStream:
        return joined.map_batches(Slow(0.01), name="slow")

    join_job(env, left, right, out, ["interval"], after=slow)
    killer = WorkerKiller(slot=f"slot-{rng.randrange(2)}")

    def kill(_: int) -> None:
        killer.kill()

    listener = OnCheckpoint(
        tmp_path / "ck",
        kill,
        lambda reader: _recorded_inputs(reader, "interval") == {"clicks", "views"},
    )
    hold = rng.randrange(PER_SUBTASK // 4, 3 * PER_SUBTASK // 4)
    result = _execute_killing(env, spark, killer, hold, listener)
    assert listener.acted_on is not None, "no checkpoint recorded both inputs in flight"
    restored = result.restarts[0].restored_from
    assert restored == listener.acted_on
    assert _recorded_inputs(open_checkpoint(str(tmp_path / "ck"), restored), "interval") == {
        "clicks",
        "views",
    }
    if mode == "unaligned":
        assert all(c.unaligned for c in result.checkpoints if not c.final)
    wanted = answer("interval", left.records, right.records)
    assert_once("interval", published(out / "interval"), wanted)
