"""Exactly once, whatever fails when: hypothesis draws the job's shape (parallelism, batch size,
checkpoint interval, input size, checkpointing mode: aligned, unaligned, or aligned with an
alignment timeout; one or three checkpoints at once) and where user code fails (records that raise on their first
attempt, so that the job restarts from whatever checkpoint is latest at that moment), runs the
job through the real runtime (subtask threads, TCP channels, checkpoints on disk, restarts)
and checks the published output exactly: every key's running counts 1..n, each once, both in
the collect sink and in the Parquet sink.

With periodic checkpoints, the sources hold in the first attempt just before the first record
that fails, until a checkpoint completed: the first restart restores a checkpoint (and every
later one too, the latest), however fast the machine.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import pyarrow.dataset as ds
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cutline import Checkpoints, FixedDelay, SourceHold, StreamEnvironment, testing
from cutline.runtime.task.local import ThreadLauncher

KEYS = 5


class FailOnce:
    """Raises on the first encounter of each listed value (shared by every subtask thread)."""

    def __init__(self, values: set[int]) -> None:
        self.pending = set(values)
        self.lock = threading.Lock()

    def __call__(self, record: dict) -> dict:
        value = record["value"]
        with self.lock:
            fail = value in self.pending
            self.pending.discard(value)
        if fail:
            raise RuntimeError(f"injected failure at {value}")
        return {"key": value % KEYS, "value": value}


RESTORED: list[int | None] = []
"""The checkpoint each restart restored (None: from the start), for the soak's report."""


def position(value: int, parallelism: int, splits: int = 128) -> int:
    """How many records the source subtask that reads ``value`` of ``from_sequence(0, n)``
    reads before it: each subtask reads the values of its splits (``value % splits``, dealt
    round-robin) in increasing order."""
    subtask = (value % splits) % parallelism
    return sum(1 for v in range(value) if (v % splits) % parallelism == subtask)


def _run_and_check(tmp_path_factory, parallelism, records, batch_size, interval, failures, data):
    work: Path = tmp_path_factory.mktemp("job")
    failures = {f for f in failures if f < records}
    keyed_op = data.draw(st.sampled_from(["count", "sum"]))
    mode = data.draw(st.sampled_from(["aligned", "unaligned", "aligned-timeout"]))
    modes: dict[str, Checkpoints] = {
        "aligned": Checkpoints(max_concurrent=data.draw(st.sampled_from([1, 3]))),
        "unaligned": Checkpoints(mode="unaligned"),
        "aligned-timeout": Checkpoints(
            alignment_timeout=data.draw(st.sampled_from([0, 0.002, 0.01]))
        ),
    }
    env = StreamEnvironment(
        parallelism,
        checkpoint_interval=interval,
        checkpoint_dir=str(work / "ck"),
        restart_strategy=FixedDelay(len(failures), delay=0),
        batch_size=batch_size,
        buffer_capacity=2,
        checkpoints=modes[mode],
    )
    keyed = env.from_sequence(0, records).map(FailOnce(failures)).key_by("key")
    if keyed_op == "count":
        stream = keyed.count().map(lambda r: {"key": r["key"], "n": r["count"]})
    else:
        stream = keyed.map(lambda r: {"key": r["key"], "one": 1}).key_by("key").sum("one")
        stream = stream.map(lambda r: {"key": r["key"], "n": r["one"]})
    stream.collect()
    stream.write_parquet(str(work / "out"))

    # every failing record comes after its subtask held until a checkpoint completed
    hold = None
    if failures and interval is not None:
        hold = SourceHold(records=min(position(f, parallelism) for f in failures))
    result = testing.execute(env, launcher=ThreadLauncher(), hold_sources=hold)

    # failures in two subtasks at once end one attempt together
    assert (len(result.restarts) > 0) == bool(failures)
    assert len(result.restarts) <= len(failures)
    RESTORED.extend(r.restored_from for r in result.restarts)
    sizes = Counter(v % KEYS for v in range(records))
    expected = Counter((k, i) for k, n in sizes.items() for i in range(1, n + 1))
    assert Counter((r["key"], r["n"]) for r in result.output) == expected
    published = (
        ds.dataset(str(work / "out"), format="parquet").to_table().to_pylist() if records else []
    )
    assert Counter((r["key"], r["n"]) for r in published) == expected


_JOBS = given(
    parallelism=st.integers(1, 3),
    records=st.integers(0, 600),
    batch_size=st.integers(1, 64),
    interval=st.sampled_from([0.005, 0.02, 0.05, None]),
    failures=st.sets(st.integers(0, 599), max_size=3),
    data=st.data(),
)
_SETTINGS = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
}


@settings(max_examples=60, **_SETTINGS)
@_JOBS
def test_every_record_is_published_exactly_once_whatever_fails(tmp_path_factory, **job):
    _run_and_check(tmp_path_factory, **job)


@pytest.mark.slow
@pytest.mark.timeout(3600)
@settings(max_examples=1000, **_SETTINGS)
@_JOBS
def test_soak_every_record_is_published_exactly_once_whatever_fails(tmp_path_factory, **job):
    _run_and_check(tmp_path_factory, **job)


def test_the_runs_above_restored_from_checkpoints_not_only_from_the_start():
    """The property above is only as strong as its restarts: most must restore a checkpoint
    (state, offsets and pre-committed output), not start over. (Runs after it in this file.)
    Every restart of a job with periodic checkpoints does (its sources held until one
    completed before the first failure); those without start over."""
    if not RESTORED:  # run alone
        return
    print(f"{sum(r is not None for r in RESTORED)} of {len(RESTORED)} restarts restored")
    assert sum(r is not None for r in RESTORED) >= len(RESTORED) // 4
