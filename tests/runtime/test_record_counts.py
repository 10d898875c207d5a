"""The job's counts in the checkpoint statistics and metadata, and the verdict made of them:
files of an older version (without counts) still read, and say they do not know them."""

from __future__ import annotations

import dataclasses
import json

from cutline.protocol.watermarks import MAX_WATERMARK
from cutline.runtime.checkpoint.stats import (
    CheckpointStats,
    RecordCounts,
    RestartInfo,
    SubtaskStats,
    decode,
    encode,
)
from cutline.runtime.driver.summary import JobCounts, JobSummary, OperatorCount


def test_counts_round_trip_through_the_statistics_files() -> None:
    sub = SubtaskStats("sum-0", 0.2, 0.01, 0.0, 0.001, 0.1, 100, records={"sum": [5, 5]})
    stats = CheckpointStats(
        3, 1, 0.25, records={"numbers": [0, 9], "sum": [9, 9]}, dead_letters=2, subtasks={"s": sub}
    )
    read = decode("checkpoint-3.json", encode(stats))
    assert read == stats
    assert isinstance(read, CheckpointStats)
    assert read.counts() == RecordCounts({"numbers": (0, 9), "sum": (9, 9)}, 2)


def test_a_statistics_file_without_counts_still_reads() -> None:
    sub = SubtaskStats("sum-0", 0.2, 0.01, 0.0, 0.001, 0.1, 100)
    data = CheckpointStats(3, 1, 0.25, subtasks={"sum-0": sub}).to_dict()
    for record in (data, data["subtasks"]["sum-0"]):
        del record["records"], record["dead_letters"]
    read = decode("checkpoint-3.json", json.dumps(data).encode())
    assert isinstance(read, CheckpointStats)
    assert read.records == {} and read.dead_letters == 0 and read.counts() is None
    assert read.subtasks["sum-0"].records == {}


def test_counts_add_per_operator_and_a_metadata_without_them_knows_none() -> None:
    restored = RecordCounts({"a": (0, 10), "b": (10, 4)}, 1)
    generation = RecordCounts({"a": (0, 5), "c": (2, 2)}, 2)
    assert restored + generation == RecordCounts({"a": (0, 15), "b": (10, 4), "c": (2, 2)}, 3)
    assert RecordCounts.in_extra(restored.to_extra()) == restored
    assert RecordCounts.in_extra({"savepoint": False, "run": "ab"}) is None  # an older version
    assert RecordCounts.in_extra({"records": {"a": "x"}}) is None  # not readable: not known


def summary(**changes: object) -> JobSummary:
    counts = JobCounts(
        (
            OperatorCount("clicks", "clicks", "source", 0, 20_000),
            OperatorCount("w", "per_minute", "window", 20_000, 1_200),
            OperatorCount("out", "per_minute_out", "sink", 1_200, 0),
        ),
        dead_letters=0,
    )
    made = JobSummary.of(counts, {"per_minute": 11}, [MAX_WATERMARK], 13, 0, [])
    return dataclasses.replace(made, **changes)  # type: ignore[arg-type]


def test_the_verdict_says_the_figures_in_a_sentence() -> None:
    assert summary().verdict() == (
        "read 20,000 records (clicks 20,000); wrote 1,200 (per_minute_out 1,200); 1,200 window "
        "results (per_minute 1,200); 11 late records (per_minute 11); no dead letters; "
        "watermark at the end: end of input; no restarts"
    )
    at = summary(watermark=90_061_001, late={}, dead_letters=1).verdict()
    assert "; no late records; 1 dead letter; " in at
    assert "; watermark at the end: 1970-01-02 01:01:01.001 UTC; no restarts" in at


def test_the_verdict_names_each_restart_by_the_first_line_of_its_cause() -> None:
    long = "map (subtask map-0): RuntimeError: " + "x" * 200 + "\n  record: {...}\nTraceback"
    restarts = [
        RestartInfo(1, "sum (subtask sum-1): ValueError: boom\nTraceback ...", 3, 1.0),
        RestartInfo(2, long, 5, 2.0),
    ]
    made = JobSummary.of(None, {}, [], 2, 0, restarts)
    verdict = made.verdict()
    assert verdict.startswith("2 restarts (generation 1: sum (subtask sum-1): ValueError: boom; ")
    assert "generation 2: map (subtask map-0): RuntimeError: xxx" in verdict
    assert verdict.endswith("x...)") and "Traceback" not in verdict
    assert len(made.restarts[1]) == len("generation 2: ") + 100


def test_counts_from_a_checkpoint_that_did_not_know_them_say_since_when() -> None:
    made = summary(since="/ck/savepoints/sp-4")
    assert made.verdict().startswith("since the restore of /ck/savepoints/sp-4: read 20,000 ")
