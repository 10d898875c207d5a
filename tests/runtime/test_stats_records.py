"""Statistics records round-trip through their JSON files, and a file with a field of the
wrong type is named as unreadable (never a traceback in ``cutline checkpoints`` or the report)."""

from __future__ import annotations

import json

import pytest

from cutline.runtime.checkpoint.stats import (
    CheckpointStats,
    RestartInfo,
    RunInfo,
    SubtaskStats,
    decode,
    encode,
    history_of,
)


def good(n: int) -> bytes:
    return encode(CheckpointStats(checkpoint_id=n, generation=1, duration=0.1))


def test_records_round_trip_through_their_files() -> None:
    sub = SubtaskStats("sum-0", 0.2, 0.01, 0.0, 0.001, 0.1, 100, barriers={"a>b:0>0": 0.01})
    stats = CheckpointStats(3, 1, 0.25, subtasks={"sum-0": sub}, savepoint="/x", reason=None)
    assert decode("checkpoint-3.json", encode(stats)) == stats
    run = RunInfo("ab", 1.0, 2, "aligned", {"u": "name"}, ["u-0"], {"c": ["u-0", "v-0"]})
    assert decode("run-ab.json", encode(run)) == run
    restart = RestartInfo(1, "boom", None, 1.5, run="ab", time=5.0, restarted=False)
    assert decode("restart-ab-1.json", encode(restart)) == restart
    assert decode("notes.json", b"{}") is None


@pytest.mark.parametrize(
    ("name", "change", "field"),
    [
        ("checkpoint-2.json", {"checkpoint_id": "2"}, "checkpoint_id"),
        ("checkpoint-2.json", {"duration": None}, "duration"),
        ("checkpoint-2.json", {"subtasks": {"s": {"subtask": "s", "acknowledged": "x"}}}, ""),
        ("checkpoint-2.json", {"subtasks": [1]}, "subtasks"),
        ("checkpoint-2.json", {"status": 3}, "status"),
    ],
)
def test_a_checkpoint_file_with_a_wrongly_typed_field_is_unreadable(
    name: str, change: dict[str, object], field: str
) -> None:
    bad = dict(json.loads(good(2)), **change)
    history = history_of({"checkpoint-1.json": good(1), name: json.dumps(bad).encode()})
    assert [s.checkpoint_id for s in history.checkpoints] == [1]
    (problem,) = history.unreadable
    assert problem.startswith(f"{name} is not a valid statistics file: {field}")


def test_run_and_restart_files_with_a_null_time_are_unreadable() -> None:
    run = RunInfo("ab", 1.0, 2, "aligned", {}, [], {})
    restart = RestartInfo(1, "x", None, 1.0, run="ab", time=5.0)
    files = {
        "run-ab.json": encode(run),
        "run-cd.json": json.dumps(dict(run.to_dict(), run="cd", started=None)).encode(),
        "restart-ab-1.json": encode(restart),
        "restart-ab-2.json": json.dumps(dict(restart.to_dict(), generation=2, time=None)).encode(),
    }
    history = history_of(files)
    assert [r.run for r in history.runs] == ["ab"]
    assert [r.generation for r in history.restarts] == [1]
    assert len(history.unreadable) == 2


def test_sizes_and_ids_for_people() -> None:
    from cutline.runtime.checkpoint.stats import human_bytes, id_ranges

    assert [human_bytes(n) for n in (0, 512, 1536, 3 * 2**20, 5 * 2**40)] == [
        "0 B",
        "512 B",
        "1.5 KiB",
        "3.0 MiB",
        "5.0 TiB",
    ]
    assert id_ranges([10, 1, 2, 3, 5, 6, 3]) == "1-3, 5-6, 10"
    assert id_ranges([]) == "none"


def test_the_temporary_names_of_atomic_writes_are_not_statistics_files() -> None:
    """A statistics file is written under ``.NAME.<random>.tmp`` and renamed: a temporary file
    a crash left behind is neither a record, nor unreadable, nor a checkpoint id."""
    from cutline.runtime.checkpoint.stats import checkpoint_ids_in

    files = {
        "checkpoint-1.json": good(1),
        ".checkpoint-2.json.0123abcd.tmp": good(2)[:7],
        ".run-ab.json.0123abcd.tmp": b"",
    }
    history = history_of(files)
    assert [s.checkpoint_id for s in history.checkpoints] == [1]
    assert history.unreadable == [] and history.runs == []
    assert checkpoint_ids_in(sorted(files)) == [1]


@pytest.mark.parametrize("data", [b"", b'{"kind": "checkp'], ids=["empty", "partial"])
def test_an_empty_or_partial_statistics_file_is_named_unreadable(data: bytes) -> None:
    """What a full disk left before statistics were written atomically: still named, never
    fatal, if one comes from elsewhere (an older cutline, a copy cut short)."""
    history = history_of({"checkpoint-1.json": good(1), "checkpoint-2.json": data})
    assert [s.checkpoint_id for s in history.checkpoints] == [1]
    (problem,) = history.unreadable
    assert problem.startswith("checkpoint-2.json is not a valid statistics file")
