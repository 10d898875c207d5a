"""What ``print(result)`` ends with: the records read per source and written per sink, window
results, late records, dead letters, the watermark at the end and the restarts, counted for
the whole job: a job that fails and restarts from a checkpoint (reading again what came after
it) says the same figures as the job without the failure, and a job stopped with a savepoint
and resumed says, at the end of the second run, what the whole job did. Real jobs (threads),
real files."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from test_event_time import write_late_input
from test_savepoints import build as savepoint_job
from test_savepoints import endpoints_of, exactly_once, published, run_until_savepoint

from cutline import (
    Checkpoints,
    EventTime,
    FixedDelay,
    SourceHold,
    StreamEnvironment,
    Tumbling,
    testing,
)
from cutline.runtime.checkpoint.storage import CheckpointStorage
from cutline.runtime.driver.result import JobResult
from cutline.runtime.driver.summary import JobSummary
from cutline.runtime.task.local import ThreadLauncher

from ledger import first_time

N = 3000
KEYS = 7
WINDOW = 100
"""Milliseconds of each window: the values are the records' event time (epoch ms)."""
REJECTED = range(0, N, 97)
"""The values the job sends to the dead letters."""


@dataclasses.dataclass(frozen=True)
class FailOnceAt:
    """Raises once (a flag file remembers it), on the record of value ``value``."""

    value: int
    flag: str

    @property
    def __name__(self) -> str:
        return "fail_once_at"

    def __call__(self, record: dict[str, int]) -> dict[str, int]:
        if record["value"] == self.value and first_time(self.flag):
            raise RuntimeError(f"injected failure at record {self.value}")
        return record


class FailOnceAtTime:
    """A map_batches function that raises once, on the first batch with a record at ``ts``
    (a flag file remembers it)."""

    __name__ = "fail_once_at_time"

    def __init__(self, ts: int, flag: Path) -> None:
        self.ts, self.flag = ts, flag

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if self.ts in batch.column("ts").to_pylist() and not self.flag.exists():
            self.flag.touch()
            raise RuntimeError(f"injected failure at the record of {self.ts}")
        return batch


def checked(record: dict[str, int]) -> dict[str, int]:
    """A record keyed by its value; every 97th is refused (it goes to the dead letters)."""
    if record["value"] % 97 == 0:
        raise ValueError(f"{record['value']} is a multiple of 97")
    return {"key": record["value"] % KEYS, "value": record["value"], "one": 1}


def job(tmp_path: Path, out: Path, fail_at: int = -1, **options: Any) -> StreamEnvironment:
    """Numbers (their value is their event time), a map that fails once at ``fail_at``, a map
    whose refusals go to the dead letters, then per key a running sum and windows of
    :data:`WINDOW` ms, each written to Parquet."""
    env = StreamEnvironment(
        2,
        checkpoint_interval=0.05,
        checkpoint_dir=tmp_path / "checkpoints",
        restart_strategy=FixedDelay(delay=0),
        batch_size=8,
        max_parallelism=16,
        dead_letter_dir=tmp_path / "dead",
        **options,
    )
    keyed = (
        env.from_sequence(
            0, N, name="numbers", event_time=EventTime("value", max_out_of_orderness="50ms")
        )
        .map(FailOnceAt(fail_at, str(tmp_path / "failed")), name="fail")
        .map(checked, name="checked", on_error="dead_letter")
        .key_by("key")
    )
    keyed.sum("one", name="sums").write_parquet(out / "sums", name="sums_out")
    keyed.window(Tumbling(f"{WINDOW}ms")).count(name="per_window").write_parquet(
        out / "counts", name="counts_out"
    )
    return env


def windows_of(values: Iterable[int]) -> int:
    """How many (key, window) pairs the values fill: the windows the job fires."""
    return len({(v % KEYS, v // WINDOW) for v in values})


def dead_letters_published(folder: Path) -> int:
    return sum(
        len(path.read_text().splitlines())
        for path in folder.rglob("*.jsonl")
        if "_pending" not in path.parts
    )


def counted_since_the_start(result: JobResult) -> JobSummary:
    """Its summary without what only this run says (its checkpoints and restarts)."""
    return dataclasses.replace(result.summary(), checkpoints=0, restarts=())


def test_a_job_without_faults_says_what_it_read_wrote_and_refused(tmp_path: Path) -> None:
    result = testing.execute(
        job(tmp_path, tmp_path / "out"), launcher=ThreadLauncher(), progress=False
    )
    kept = N - len(REJECTED)
    windows = windows_of(v for v in range(N) if v % 97)
    summary = result.summary()
    assert summary.read == {"numbers": N}
    assert summary.written == {"sums_out": kept, "counts_out": windows}
    assert summary.window_results == {"per_window": windows}
    assert summary.records["checked"] == (N, kept)
    assert summary.records["sums"] == (kept, kept)
    assert summary.dead_letters == len(REJECTED) == dead_letters_published(tmp_path / "dead")
    assert summary.late == {} and summary.restarts == ()
    assert len(published(tmp_path / "out" / "sums")) == kept
    assert len(published(tmp_path / "out" / "counts")) == windows
    verdict = (
        f"read 3,000 records (numbers 3,000); wrote {kept + windows:,} (sums_out {kept:,}, "
        f"counts_out {windows:,}); {windows:,} window results (per_window {windows:,}); "
        "no late records; 31 dead letters; watermark at the end: end of input; no restarts"
    )
    assert summary.verdict() == verdict
    text = repr(result)
    assert text.startswith("JobResult(") and "1 generation(s)" in text
    assert text.endswith(f"): {verdict}")
    # the final checkpoint counted the same, and its metadata keeps it for a restore
    final = result.checkpoints[-1]
    assert final.final
    assert result.counts is not None
    by_uid = {o.uid: [o.records_in, o.records_out] for o in result.counts.operators}
    assert final.records == by_uid and final.dead_letters == len(REJECTED)
    storage = CheckpointStorage(str(tmp_path / "checkpoints"))
    extra = storage.read_metadata(final.checkpoint_id).extra
    assert extra["records"] == by_uid and extra["dead_letters"] == len(REJECTED)


@pytest.mark.parametrize("mode", ["aligned", "unaligned"])
def test_a_job_that_fails_once_and_restarts_counts_every_record_once(
    tmp_path: Path, mode: str
) -> None:
    """The failure comes after a checkpoint (the sources hold half-way until checkpoints
    completed): the job restores it and reads the records after it again. The figures are
    those of the same job without the failure; the last generation alone read less.
    Unaligned, records in flight at the checkpoint are in its channel state: processed
    after the snapshots, so counted after the restore, once."""
    clean = testing.execute(
        job(tmp_path / "clean", tmp_path / "clean" / "out"),
        launcher=ThreadLauncher(),
        progress=False,
    )
    failing = tmp_path / "failing"
    result = testing.execute(
        job(failing, failing / "out", fail_at=N - 1, checkpoints=Checkpoints(mode=mode)),
        launcher=ThreadLauncher(),
        progress=False,
        hold_sources=SourceHold(records=N // 4, checkpoints=2),
    )
    [restart] = result.restarts
    assert restart.restored_from is not None, "restored from a checkpoint, not the start"
    assert result.metrics is not None
    assert result.metrics.operator("numbers").records_out < N, "the last generation read less"
    assert counted_since_the_start(result) == counted_since_the_start(clean)
    assert result.summary().read == {"numbers": N}
    assert result.summary().dead_letters == dead_letters_published(failing / "dead")
    assert len(published(failing / "out" / "sums")) == N - len(REJECTED)
    verdict = result.summary().verdict()
    assert "31 dead letters; watermark at the end: end of input; 1 restart (generation 1: " in (
        verdict
    )
    assert verdict.endswith("RuntimeError: injected failure at record 2999)")
    assert verdict.split("; 1 restart")[0] == clean.summary().verdict().split("; no restarts")[0]


def test_late_records_per_window_operator_survive_a_restart_once(tmp_path: Path) -> None:
    """One record is too late for its window (read a record at a time, at parallelism 1); a
    restart after it, from a checkpoint that counted it (the source holds right after it until
    a checkpoint completed), neither forgets nor repeats it."""

    def late_job(workdir: Path, fail: bool) -> JobResult:
        (workdir / "in").mkdir(parents=True)
        write_late_input(workdir / "in" / "clicks.parquet")
        env = StreamEnvironment(
            1,
            checkpoint_interval=0.05,
            checkpoint_dir=workdir / "checkpoints",
            restart_strategy=FixedDelay(delay=0),
            batch_size=1,
        )
        stream = env.read_parquet(workdir / "in", event_time="ts", name="clicks")
        if fail:
            stream = stream.map_batches(FailOnceAtTime(2600, workdir / "failed"), name="fail")
        counts = stream.key_by("user").window(Tumbling("1s")).count(name="per_second")
        counts.collect("counts")
        counts.late().collect("late")
        options: dict[str, Any] = {"hold_sources": SourceHold(records=102)} if fail else {}
        # (102 records: the window's 100, the one at 2500 and the late one at 500)
        return testing.execute(env, launcher=ThreadLauncher(), progress=False, **options)

    clean = late_job(tmp_path / "clean", fail=False)
    failed = late_job(tmp_path / "failed", fail=True)
    assert len(failed.restarts) == 1 and failed.restarts[0].restored_from is not None
    for result in (clean, failed):
        summary = result.summary()
        assert summary.late == {"per_second": 1}
        assert summary.read == {"clicks": 103}
        assert summary.window_results == {"per_second": 2}
        assert summary.written == {"collect(counts)": 2, "collect(late)": 1}
        assert summary.verdict().startswith(
            "read 103 records (clicks 103); wrote 3 (collect(counts) 2, collect(late) 1); "
            "2 window results (per_second 2); 1 late record (per_second 1); no dead letters; "
            "watermark at the end: end of input; "
        )


@pytest.mark.parametrize("after", [2, 3])
def test_a_job_stopped_with_a_savepoint_and_resumed_counts_the_whole_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, after: int
) -> None:
    """Stopped with a savepoint half-way, then resumed with ``restore_from="latest"`` (at
    another parallelism too): the second run's figures are the whole job's."""
    out = tmp_path / "out"
    first, path = run_until_savepoint(tmp_path, 2, out, N, endpoints_of(monkeypatch))
    before = first.summary()
    assert 0 < before.read["numbers"] < N, "it stopped part-way"
    assert before.written == {"out": len(published(out))}
    [savepoint] = [c for c in first.checkpoints if c.savepoint == path]
    assert savepoint.records["numbers"] == [0, before.read["numbers"]]

    second = testing.execute(
        savepoint_job(tmp_path, after, out, N),
        launcher=ThreadLauncher(),
        progress=False,
        restore_from="latest",
    )
    assert second.restored_from == path
    exactly_once(published(out), N)
    summary = second.summary()
    assert summary.read == {"numbers": N} and summary.written == {"out": N}
    assert summary.records["keyed"] == (N, N) and summary.records["sums"] == (N, N)
    assert summary.since is None
    assert second.summary().verdict() == (
        "read 3,000 records (numbers 3,000); wrote 3,000 (out 3,000); no dead letters; no restarts"
    )


def test_a_checkpoint_that_does_not_know_the_counts_before_it_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A savepoint written by a version of cutline that did not count (its metadata without
    the counts): the resumed run counts from it, and says so."""
    out = tmp_path / "out"
    first, path = run_until_savepoint(tmp_path, 2, out, N, endpoints_of(monkeypatch))
    metadata = Path(path) / "_metadata"
    data = json.loads(metadata.read_text())
    del data["extra"]["records"], data["extra"]["dead_letters"]
    metadata.write_text(json.dumps(data))
    second = testing.execute(
        savepoint_job(tmp_path, 2, out, N),
        launcher=ThreadLauncher(),
        progress=False,
        restore_from=path,
    )
    summary = second.summary()
    assert summary.since == path
    assert summary.read == {"numbers": N - first.summary().read["numbers"]}
    assert summary.verdict().startswith(f"since the restore of {path}: read ")
