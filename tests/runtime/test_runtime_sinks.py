"""The exactly-once file sink: nothing visible before its checkpoint completes, everything
published once, across failures and restores."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from cutline.connectors import SinkContext
from cutline.runtime.io.file_formats import JSONL, output_format
from cutline.runtime.io.sinks import PENDING, FileSink, FileSinkWriter, SinkError


def open_sink(
    sink: FileSink,
    subtask: int,
    generation: int,
    state: Any = None,
    run: str = "r0",
    adopted: dict[int, Any] | None = None,
) -> FileSinkWriter:
    """The writer of ``subtask`` in attempt ``generation``, restored from its own ``state``,
    or from the ``adopted`` states of old subtasks (a restore at another parallelism)."""
    restored = adopted if adopted is not None else ({} if state is None else {subtask: state})
    return sink.writer(SinkContext("out", subtask, subtask + 1, generation, run), restored)


def batch(values: range) -> pa.RecordBatch:
    return pa.record_batch({"value": list(values)})


def published(folder: Path) -> list[int]:
    """What a reader of the output directory sees (pyarrow skips _ and . names, as Spark does)."""
    if not any(folder.glob("*.parquet")):
        return []
    return sorted(ds.dataset(str(folder), format="parquet").to_table()["value"].to_pylist())


def test_output_is_published_only_when_its_checkpoint_completes(tmp_path: Path) -> None:
    out = tmp_path / "out"
    writer = open_sink(FileSink(str(out)), subtask=0, generation=0)
    writer.write(batch(range(0, 10)))
    state = writer.pre_commit(1)
    assert published(out) == []  # pre-committed: pending, invisible
    assert len(list((out / PENDING).iterdir())) == 1
    writer.write(batch(range(10, 15)))
    writer.pre_commit(2)
    assert writer.commit(1) == [state["pending"][0]["name"]]
    assert published(out) == list(range(10))
    writer.commit(2)
    assert published(out) == list(range(15))
    assert list((out / PENDING).iterdir()) == []


def test_a_checkpoint_without_records_writes_no_file(tmp_path: Path) -> None:
    writer = open_sink(FileSink(str(tmp_path / "out")), 0, 0)
    state = writer.pre_commit(1)
    assert (state["checkpoint"], state["pending"]) == (1, [])
    assert writer.commit(1) == []


def test_recovery_publishes_the_restored_checkpoint_once_and_drops_the_rest(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    sink = FileSink(str(out))
    first = open_sink(sink, 0, generation=0)
    first.write(batch(range(0, 5)))
    first.pre_commit(1)
    first.commit(1)
    first.write(batch(range(5, 9)))
    restored_state = json.loads(json.dumps(first.pre_commit(2)))  # checkpoint 2 completes...
    first.write(batch(range(9, 12)))
    first.pre_commit(3)  # ...3 is pre-committed but never completes
    # the attempt dies before the "complete 2" notification reached it
    assert published(out) == list(range(5))
    second = open_sink(sink, 0, generation=1, state=restored_state)
    assert published(out) == list(range(9))  # 2's part published, 3's dropped
    assert list((out / PENDING).iterdir()) == []
    # a third attempt restoring the same checkpoint again publishes nothing twice
    open_sink(sink, 0, generation=2, state=restored_state)
    assert published(out) == list(range(9))
    # replay after checkpoint 2 goes on normally
    second.write(batch(range(9, 12)))
    second.pre_commit(3)
    second.commit(3)
    assert published(out) == list(range(12))


def test_recovery_leaves_other_subtasks_pending_parts_alone(tmp_path: Path) -> None:
    out = tmp_path / "out"
    sink = FileSink(str(out))
    other = open_sink(sink, 1, 0)
    other.write(batch(range(100, 103)))
    other.pre_commit(1)
    open_sink(sink, 0, 1, state={"pending": []})  # subtask 0 recovers
    assert len(list((out / PENDING).iterdir())) == 1
    other.commit(1)
    assert published(out) == [100, 101, 102]


def test_a_lost_pre_committed_part_is_an_error_naming_it(tmp_path: Path) -> None:
    out = tmp_path / "out"
    writer = open_sink(FileSink(str(out)), 0, 0)
    writer.write(batch(range(3)))
    state = writer.pre_commit(1)
    name = state["pending"][0]["name"]
    (out / PENDING / name).unlink()
    with pytest.raises(SinkError, match=f"part {name} was pre-committed but is neither"):
        open_sink(FileSink(str(out)), 0, 1, state=state)


def test_json_lines_output(tmp_path: Path) -> None:
    out = tmp_path / "out"
    writer = open_sink(FileSink(str(out), JSONL), 0, 0)
    writer.write(pa.record_batch({"key": ["a", "b"], "n": [1, 2]}))
    writer.pre_commit(7)
    writer.commit(7)
    (part,) = out.glob("*.jsonl")
    rows: list[dict[str, Any]] = [json.loads(line) for line in part.read_text().splitlines()]
    assert rows == [{"key": "a", "n": 1}, {"key": "b", "n": 2}]


def test_a_full_disk_is_an_error_naming_the_file(tmp_path: Path) -> None:
    out = tmp_path / "out"
    writer = open_sink(FileSink(str(out)), 0, 0)
    name = "part-00000-0000000001-g0-r0-0.parquet"
    (out / PENDING / name).symlink_to("/dev/full")  # a real ENOSPC on write
    writer.write(batch(range(1000)))
    with pytest.raises(SinkError, match=f"cannot write .*{name}: .*No space left on device"):
        writer.pre_commit(1)


def test_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown output format 'xml'"):
        output_format("xml")
    with pytest.raises(TypeError, match="format must be an OutputFormat"):
        FileSink("/tmp/x", "jsonl")


def test_the_part_file_is_written_in_the_asynchronous_part(tmp_path: Path) -> None:
    """``pre_commit_later`` only closes the records into a part (the synchronous part of a
    checkpoint); the file is written when the snapshot thread completes it."""
    out = tmp_path / "out"
    writer = open_sink(FileSink(str(out)), 0, 0)
    writer.write(batch(range(0, 10)))
    later = writer.prepare_commit(1)
    (name,) = [p["name"] for p in later.state["pending"]]
    assert not (out / PENDING / name).exists()
    writer.write(batch(range(10, 12)))  # the subtask goes on meanwhile
    assert later.complete() == later.state
    assert (out / PENDING / name).exists()
    writer.commit(1)
    assert published(out) == list(range(10))


def test_a_dropped_pre_commit_is_written_before_a_later_one_is_published(tmp_path: Path) -> None:
    """A checkpoint dropped before its asynchronous part (aborted, declined) never wrote its
    part; the next checkpoint's state names it, so it is written before anything is published."""
    out = tmp_path / "out"
    writer = open_sink(FileSink(str(out)), 0, 0)
    writer.write(batch(range(0, 5)))
    writer.prepare_commit(1)  # dropped: never completed
    writer.write(batch(range(5, 9)))
    second = writer.prepare_commit(2)
    assert len(second.state["pending"]) == 2
    writer.commit(2)
    assert published(out) == list(range(9))


def test_a_part_that_cannot_be_written_later_fails_the_writer(tmp_path: Path) -> None:
    """The write fails on the snapshot thread (the checkpoint is declined); the writer stays
    failed, so the subtask fails at its next record and the job restarts."""
    out = tmp_path / "out"
    writer = open_sink(FileSink(str(out)), 0, 0)
    writer.write(batch(range(0, 5)))
    later = writer.prepare_commit(1)
    (out / PENDING).rmdir()
    (out / PENDING).write_text("not a folder")  # the part file cannot be created
    with pytest.raises(SinkError, match=r"cannot write .*_pending/part-00000-0000000001"):
        later.complete()
    with pytest.raises(SinkError, match="cannot write"):
        writer.write(batch(range(5, 6)))
    with pytest.raises(SinkError, match="cannot write"):
        writer.prepare_commit(2)
