"""Incremental checkpoints of the window operators' state, against a run that takes none.

The columnar layout (the memory backend's windows of a built-in) writes its windows as a chain
of segments of its own: a full one, then the changes since the checkpoint each builds on (the
keys whose accumulators changed; of sessions, the keys whose sessions did). Random records
and watermarks go through a job that checkpoints, building on the newest complete checkpoint
(some never complete), fails at random and restores from the newest complete one (under
either backend, at another parallelism), replays what came after it and publishes only what
it had not: the windows come out exactly as those of a job that never failed.
"""

from __future__ import annotations

import pickle
import random
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_window_operators import Job

from cutline.protocol.watermarks import MAX_WATERMARK
from cutline.runtime.eventtime.aggregations import Aggregation
from cutline.runtime.eventtime.assigners import Session, Sliding, Tumbling
from cutline.runtime.eventtime.keyed import KeyedWindows
from cutline.runtime.eventtime.logic import WindowLogic
from cutline.runtime.eventtime.timestamps import TimeColumn
from cutline.runtime.state.columns import COLUMNS

ASSIGNERS: dict[str, Tumbling | Sliding | Session] = {
    "tumbling": Tumbling("300ms"),
    "sliding": Sliding("400ms", every="100ms"),
    "session": Session(gap="60ms"),
}


def window_logic(windows: str, kind: str, lateness: int = 0) -> WindowLogic:
    aggregation = Aggregation(kind) if kind == "count" else Aggregation(kind, "n")
    return WindowLogic(
        ASSIGNERS[windows], aggregation, "user", TimeColumn("ts", 0, pa.int64()), lateness
    )


def segment(job: Job, handle: dict[str, Any]) -> dict[str, Any]:
    """The newest segment of a handle's columns, decoded."""
    found: dict[str, Any] = pickle.loads(job.store.files[handle[COLUMNS][-1]["path"]])
    return found


def keys_written(found: dict[str, Any]) -> int:
    if "panes" in found:  # (windows, and slices of sliding windows)
        return sum(len(entry[4]) for entry in [*found["panes"], *found["slices"]])
    rows = found["sessions"]
    return 0 if rows is None else len(rows["keys"])


@pytest.mark.parametrize("windows", ["tumbling", "sliding", "session"])
def test_an_incremental_checkpoint_writes_only_the_keys_that_changed(windows: str) -> None:
    """1,000 keys with open windows: the first checkpoint writes them all; one that builds on
    it after 10 keys changed writes those 10 (sliding windows too: a record is in one slice,
    not in its 4 windows); with nothing changed, none; a savepoint, all again. Each restores
    to the same windows."""
    logic = window_logic(windows, "sum")
    job = Job(logic, "memory", 1)
    job.process([{"user": f"u{i}", "ts": 1_000, "n": i} for i in range(1_000)], arrow=True)
    first = job.checkpoint(1)[1][0]
    assert segment(job, first)["format"] == 1 and keys_written(segment(job, first)) == 1_000
    job.process([{"user": f"u{i}", "ts": 1_010, "n": 1} for i in range(0, 1_000, 100)], True)
    second = job.checkpoint(2, base=1)[1][0]
    assert len(second[COLUMNS]) == 2 and not second[COLUMNS][1]["full"]
    assert keys_written(segment(job, second)) == 10
    third = job.checkpoint(3, base=2)[1][0]
    assert len(third[COLUMNS]) == 3 and keys_written(segment(job, third)) == 0
    savepoint = job.ops[0].snapshot(4, base=3, savepoint=True).write(job.store, "sp")
    assert len(savepoint[COLUMNS]) == 1 and keys_written(segment(job, savepoint)) == 1_000
    job.watermark(MAX_WATERMARK)
    wanted = Counter(map(str, job.output))
    for handle in (third, savepoint):
        restored = Job(logic, "memory", 1, (job.store, [handle]))
        restored.watermark(MAX_WATERMARK)
        assert Counter(map(str, restored.output)) == wanted
        restored.close()
    job.close()


def test_a_chain_is_at_most_full_every_long_and_a_restored_one_is_built_on() -> None:
    logic = window_logic("tumbling", "count")
    job = Job(logic, "memory", 1, full_every=3)
    lengths = []
    for n in range(1, 8):
        job.process([{"user": f"u{n}", "ts": 10, "n": 1}], arrow=True)
        handle = job.checkpoint(n, base=n - 1 if n > 1 else None)[1][0]
        lengths.append(len(handle[COLUMNS]))
    assert lengths == [1, 2, 3, 1, 2, 3, 1]
    restored = Job(logic, "memory", 1, (job.store, [handle]), full_every=3, restored=7)
    restored.process([{"user": "new", "ts": 10, "n": 1}], arrow=True)
    again = restored.checkpoint(8, base=7)[1][0]
    assert len(again[COLUMNS]) == 2 and keys_written(segment(restored, again)) == 1
    job.close()
    restored.close()


@dataclass
class Complete:
    """A checkpoint that completed: what to restore, and how far the job had come."""

    id: int
    state: Any
    step: int
    published: int
    late: int


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    kind=st.sampled_from(["count", "sum", "min", "max", "mean"]),
    windows=st.sampled_from(["tumbling", "sliding", "session"]),
    lateness=st.sampled_from([0, 0, 300]),
    full_every=st.integers(1, 4),
)
def test_windows_are_exact_through_incremental_checkpoints_failures_and_restores(
    seed: int, kind: str, windows: str, lateness: int, full_every: int
) -> None:
    rng = random.Random(seed)
    logic = window_logic(windows, kind, lateness)
    steps: list[tuple[str, Any]] = []
    t = 0
    for _ in range(rng.randint(5, 60)):
        batch = []
        for _ in range(rng.randint(1, 30)):
            t += rng.randint(0, 8)
            batch.append(
                {
                    "user": f"u{rng.randrange(12)}",
                    "ts": t - rng.randint(0, 150),
                    "n": rng.randint(-5, 50),
                }
            )
        steps.append(("records", (batch, rng.random() < 0.8)))
        if rng.random() < 0.5:
            steps.append(("watermark", t - rng.randint(0, 250)))
        if rng.random() < 0.4:
            steps.append(("checkpoint", rng.random() < 0.8))  # (completes, or not)
        if rng.random() < 0.1:
            steps.append(("fail", None))
    reference = Job(logic, "memory", 1)
    watermark = -(2**63)
    for what, value in steps:
        if what == "records":
            reference.process(*value)
        elif what == "watermark" and value > watermark:
            watermark = value
            reference.watermark(value)
    reference.watermark(MAX_WATERMARK)

    backend = rng.choice(["memory", "disk"])
    job = Job(logic, backend, rng.randint(1, 3), full_every=full_every)
    complete: list[Complete] = []
    checkpoint, watermark, at = 0, -(2**63), 0
    while at < len(steps):
        what, value = steps[at]
        if what == "records":
            job.process(*value)
        elif what == "watermark" and value > watermark:
            watermark = value
            job.watermark(value)
        elif what == "checkpoint":
            checkpoint += 1
            state = job.checkpoint(checkpoint, base=complete[-1].id if complete else None)
            if value:
                complete.append(Complete(checkpoint, state, at, len(job.output), len(job.late)))
        elif what == "fail" and complete:
            last = complete[-1]
            restored = Job(
                logic,
                rng.choice(["memory", "disk"]),
                rng.randint(1, 3),
                (last.state[0], last.state[1]),
                full_every=full_every,
                restored=last.id,
            )
            restored.output = job.output[: last.published]  # (a sink publishes no more)
            restored.late = job.late[: last.late]
            job.close()
            job = restored
            watermark = max([-(2**63)] + [v for w, v in steps[: last.step] if w == "watermark"])
            steps = (
                steps[: last.step + 1]
                + [s for s in steps[last.step + 1 : at] if s[0] != "checkpoint"]
                + steps[at + 1 :]
            )
            at = last.step
        at += 1
    job.watermark(MAX_WATERMARK)

    def last_results(found: list[dict[str, Any]]) -> dict[tuple[str, int, int], Any]:
        out: dict[tuple[str, int, int], Any] = {}
        for r in found:
            out[(r["user"], r["window_start"], r["window_end"])] = r[logic.aggregation.output]
        return out

    if lateness == 0:
        assert Counter(
            (r["user"], r["window_start"], r["window_end"], round(r[logic.aggregation.output], 9))
            for r in job.output
        ) == Counter(
            (r["user"], r["window_start"], r["window_end"], round(r[logic.aggregation.output], 9))
            for r in reference.output
        )
    elif windows != "session":
        assert last_results(job.output) == pytest.approx(last_results(reference.output))
    assert Counter(map(str, job.late)) == Counter(map(str, reference.late))
    job.close()
    reference.close()


@pytest.mark.parametrize("backend", ["memory", "disk"])
def test_early_records_count_per_key_and_window_through_merges_and_rescaled_restores(
    backend: str,
) -> None:
    """``early_records=3`` on sessions (gap 60): two sessions of 2 records each give nothing
    early; the record that bridges them makes one session of 5 records (their counts add up,
    Flink's rule), which gives its result so far, and its count starts again; the counts are
    keyed state, so a restore at another parallelism goes on counting (1 before it, 2 after:
    early again), and the final result is the whole."""
    logic = WindowLogic(
        ASSIGNERS["session"],
        Aggregation("count"),
        "user",
        TimeColumn("ts", 0, pa.int64()),
        early_records=3,
    )
    job = Job(logic, backend, 1)
    assert all(type(op.store).__name__ == "KeyedWindows" for op in job.ops)
    for ts in (0, 10, 100, 110):
        job.process([{"user": "a", "ts": ts, "n": 1}], arrow=True)
    assert job.output == []
    job.process([{"user": "a", "ts": 50, "n": 1}], arrow=False)
    job.process([{"user": "a", "ts": 120, "n": 1}], arrow=True)
    assert [(r["window_start"], r["count"], r["final"]) for r in job.output] == [(0, 5, False)]
    restored = Job(logic, backend, 3, job.checkpoint(1))
    job.close()
    restored.process([{"user": "a", "ts": 130, "n": 1}], arrow=True)
    assert restored.output == []
    restored.process([{"user": "a", "ts": 140, "n": 1}], arrow=True)
    restored.watermark(MAX_WATERMARK)
    assert [(r["window_start"], r["count"], r["final"]) for r in restored.output] == [
        (0, 8, False),
        (0, 8, True),
    ]
    restored.close()


@pytest.mark.parametrize("key_type", ["int", "str"])
@pytest.mark.parametrize("windows", ["tumbling", "sliding"])
def test_a_large_window_looks_a_small_batch_up_in_its_index_of_keys(
    key_type: str, windows: str
) -> None:
    """3,000 keys in a window and batches of 10: the window keeps an index of its keys (a
    batch no longer hashes the whole window); new keys join it, checkpoints in between share
    the arrays, and the results are exact, before and after a restore."""
    rng = random.Random(7)
    logic = window_logic(windows, "sum")

    def key(i: int) -> Any:
        return i if key_type == "int" else f"u{i}"

    records = [{"user": key(i), "ts": 1_000, "n": i} for i in range(3_000)]
    job = Job(logic, "memory", 1)
    job.process(records, arrow=True)
    sums: Counter[Any] = Counter({r["user"]: r["n"] for r in records})
    for n in range(1, 40):
        some = [3_000 + rng.randrange(4), rng.randrange(3_000)]  # (new keys come again)
        batch = [{"user": key(i), "ts": 1_000, "n": rng.randint(1, 9)} for i in some * 5]
        job.process(batch, arrow=True)
        for r in batch:
            sums[r["user"]] += r["n"]
        if n % 10 == 0:
            job.checkpoint(n, base=n - 10 if n > 10 else None)
    state = job.checkpoint(40, base=30)  # (the changes since 30: an incremental one)
    assert not state[1][0][COLUMNS][-1]["full"]
    op = job.ops[0]
    holders = op.store.slices if windows == "sliding" else op.store.windows  # type: ignore[attr-defined]
    assert all(piece.index is not None for piece in holders.values())
    restored = Job(logic, "memory", 1, state)
    restored.process([{"user": key(5), "ts": 1_000, "n": 1}], arrow=True)
    job.process([{"user": key(5), "ts": 1_000, "n": 1}], arrow=True)
    sums[key(5)] += 1
    for finished in (job, restored):
        finished.watermark(MAX_WATERMARK)
        found = {(r["user"], r["window_start"]): r["n"] for r in finished.output}
        assert len(found) == len(finished.output), "each key once in each window"
        starts = {r["window_start"] for r in finished.output}
        assert len(starts) == (4 if windows == "sliding" else 1)
        for start in starts:
            assert {u: v for (u, s), v in found.items() if s == start} == dict(sums)
        finished.close()


def test_the_sliced_layouts_count_their_open_windows_as_the_keyed_one() -> None:
    """The ``windows`` figure (key and window pairs not fired yet) of sliding windows kept
    as slices (of columns, or of runs) equals the keyed layout's (a key in several slices of
    a window counts once)."""
    logic = window_logic("sliding", "count")
    rng = random.Random(3)
    jobs = [
        Job(logic, "memory", 1),
        Job(logic, "disk", 1),
        Job(logic, "memory", 1, layout=KeyedWindows),
    ]
    records = [
        {"user": f"u{rng.randrange(20)}", "ts": rng.randrange(2_000), "n": 1} for _ in range(300)
    ]
    for job in jobs:
        job.process(records, arrow=True)
        job.watermark(900)
    figures = [job.ops[0].figures() for job in jobs]
    assert [type(job.ops[0].store).__name__ for job in jobs] == [
        "SlicedWindows",
        "SlicedRuns",
        "KeyedWindows",
    ]
    assert figures[0] is not None and figures[1] is not None and figures[2] is not None
    assert figures[0]["windows"] == figures[1]["windows"] == figures[2]["windows"] > 0
    for job in jobs:
        job.close()


@pytest.mark.parametrize("backend", ["memory", "disk"])
def test_sliding_windows_give_early_results_of_every_open_window(backend: str) -> None:
    """``early=`` on sliding windows (slices on the memory backend): every open window of each
    key, its count so far, then each final one once."""
    logic = WindowLogic(
        Sliding("2s", every="1s"),
        Aggregation("count"),
        "user",
        TimeColumn("ts", 0, pa.int64()),
        early=10_000,
    )
    job = Job(logic, backend, 1)
    job.process([{"user": "a", "ts": 100, "n": 1}, {"user": "b", "ts": 1150, "n": 1}], True)

    def clock(now: int) -> list[tuple[Any, ...]]:
        job.output = []
        for op in job.ops:
            job._take(op, op.on_processing_time(now))
        return sorted((r["user"], r["window_start"], r["count"], r["final"]) for r in job.output)

    assert clock(50_000) == [
        ("a", -1000, 1, False),
        ("a", 0, 1, False),
        ("b", 0, 1, False),
        ("b", 1000, 1, False),
    ]
    job.process([{"user": "a", "ts": 900, "n": 1}], True)
    job.output = []
    job.watermark(999)  # (the window [-1000, 1000) fires)
    assert [(r["user"], r["window_start"], r["count"]) for r in job.output] == [("a", -1000, 2)]
    assert clock(60_000) == [("a", 0, 2, False), ("b", 0, 1, False), ("b", 1000, 1, False)]
    job.close()


def test_thousands_of_sessions_through_incremental_checkpoints_and_a_restore() -> None:
    """6,000 keys' sessions, most fired and dropped, others merged by later records, with
    incremental checkpoints between and a restore at another parallelism: the columnar
    sessions publish what the keyed layout does."""
    rng = random.Random(11)
    logic = window_logic("session", "sum")
    jobs = [Job(logic, "memory", 1), Job(logic, "disk", 1)]
    for n in range(1, 13):
        base = (n - 1) * 50
        batch = [
            {"user": f"u{rng.randrange(6_000)}", "ts": base + rng.randrange(40), "n": 1}
            for _ in range(2_000)
        ]
        for job in jobs:
            job.process(batch, arrow=n % 3 != 0)
            job.watermark(n * 50 - 120)
            if n % 4 == 0:
                job.checkpoint(n, base=n - 4 if n > 4 else None)
    restored = [Job(logic, j.backend, 2, j.checkpoint(99, base=12)) for j in jobs]
    for job, again in zip(jobs, restored, strict=True):
        again.output = list(job.output)
        again.process([{"user": "u1", "ts": 560, "n": 5}], arrow=True)
        again.watermark(MAX_WATERMARK)
        job.close()
    found = [
        Counter((r["user"], r["window_start"], r["window_end"], r["n"]) for r in job.output)
        for job in restored
    ]
    assert found[0] == found[1] and sum(found[0].values()) > 1_000
    for job in restored:
        job.close()
