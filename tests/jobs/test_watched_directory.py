"""A watched directory (``read_jsonl(dir, monitor=...)``) in real jobs (slots as threads): files
put there while the job runs are read once each, exactly once, through a stop with a savepoint
and a restore at another parallelism too; an empty watched directory needs a schema.

Files arrive by construction, not on a timer: the job's listener puts the next file into the
directory (written under a hidden name, then renamed into place) each time a checkpoint
completes, and asks the job to stop with a savepoint once a checkpoint shows every file it was
given finished. So the job always has a file to wait for while files are due, however fast
the machine.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from test_savepoints import StopWithSavepoint, endpoints_of

from cutline import FixedDelay, JobFailedError, SourceError, StreamEnvironment, testing
from cutline.runtime.checkpoint.reader import open_checkpoint
from cutline.runtime.task.local import ThreadLauncher

ROWS = 50


def put_file(folder: Path, number: int) -> None:
    """File ``number`` (``ROWS`` records), written whole under a hidden name, then renamed."""
    rows = [{"file": number, "row": i, "user": f"u{(number + i) % 7}"} for i in range(ROWS)]
    hidden = folder / f".part-{number:04d}.jsonl.tmp"
    hidden.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.rename(hidden, folder / f"part-{number:04d}.jsonl")


def finished_files(directory: Path, checkpoint: int) -> int:
    """Files every subtask of the source finished at ``checkpoint``."""
    reader = open_checkpoint(str(directory), checkpoint)
    done = 0
    for subtask, handle in reader.handles.items():
        if "landing" in handle.operators:
            splits = reader.state_file(subtask).operators["landing"]["splits"]
            done += sum(1 for state in splits.values() if state.finished)
    return done


class Feeder(StopWithSavepoint):
    """The job's listener: on each complete checkpoint, the next file of ``numbers`` goes into
    the directory; once a checkpoint shows ``until`` files finished, the job is asked to stop
    with a savepoint."""

    def __init__(
        self, folder: Path, checkpoints: Path, numbers: list[int], until: int, endpoints: Any
    ) -> None:
        super().__init__(checkpoints, endpoints)
        self.folder = folder
        self.numbers = list(numbers)
        self.until = until

    def __call__(self, kind: str, message: str) -> None:
        if kind != "checkpoint" or self.stopping:
            return
        checkpoint = int(message.split()[0])
        if self.numbers:
            put_file(self.folder, self.numbers.pop(0))
        if finished_files(self.checkpoints, checkpoint) >= self.until:
            self.stop()


def watching_job(
    tmp_path: Path, parallelism: int, out: str, checkpoints: str = "ck"
) -> StreamEnvironment:
    env = StreamEnvironment(
        parallelism,
        checkpoint_interval=0.05,
        checkpoint_dir=tmp_path / checkpoints,
        restart_strategy=FixedDelay(delay=0),
    )
    env.read_jsonl(tmp_path / "landing", monitor="20ms", name="landing").key_by("user").count(
        name="per_user"
    ).write_parquet(tmp_path / out, name="out")
    return env


def published(*folders: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for folder in folders:
        if folder.exists():
            rows += ds.dataset(str(folder), format="parquet").to_table().to_pylist()
    return rows


def assert_every_row_once(rows: list[dict[str, Any]], files: int) -> None:
    assert Counter((r["file"], r["row"]) for r in rows) == Counter(
        (f, i) for f in range(files) for i in range(ROWS)
    )
    # and each user's running count 1..n, once each
    users = Counter(f"u{(f + i) % 7}" for f in range(files) for i in range(ROWS))
    assert Counter((r["user"], r["count"]) for r in rows) == Counter(
        (u, c) for u, n in users.items() for c in range(1, n + 1)
    )


def test_files_put_into_a_watched_directory_are_read_exactly_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "landing").mkdir()
    for number in range(2):  # there when the job starts
        put_file(tmp_path / "landing", number)
    (tmp_path / "landing" / "_SUCCESS").write_text("")  # never read
    feeder = Feeder(
        tmp_path / "landing", tmp_path / "ck", list(range(2, 10)), 10, endpoints_of(monkeypatch)
    )
    result = testing.execute(
        watching_job(tmp_path, 2, "out"), launcher=ThreadLauncher(), listener=feeder
    )
    assert result.savepoints == [feeder.savepoint()]
    assert_every_row_once(published(tmp_path / "out"), 10)


def test_a_watched_directory_stopped_with_a_savepoint_resumes_at_another_parallelism(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped once four of the files are read; files keep arriving while it is stopped and
    after it resumed at parallelism 3: each file read once, over the two runs."""
    (tmp_path / "landing").mkdir()
    put_file(tmp_path / "landing", 0)
    endpoints = endpoints_of(monkeypatch)
    first = Feeder(tmp_path / "landing", tmp_path / "ck", [1, 2, 3], 4, endpoints)
    testing.execute(watching_job(tmp_path, 2, "out1"), launcher=ThreadLauncher(), listener=first)
    path = first.savepoint()
    for number in (4, 5):  # while no job runs
        put_file(tmp_path / "landing", number)
    second = Feeder(tmp_path / "landing", tmp_path / "ck2", [6, 7, 8], 9, endpoints)
    result = testing.execute(
        watching_job(tmp_path, 3, "out2", "ck2"),
        launcher=ThreadLauncher(),
        listener=second,
        restore_from=path,
    )
    assert result.restored_from == path
    rows = published(tmp_path / "out1", tmp_path / "out2")
    assert published(tmp_path / "out1") and published(tmp_path / "out2")
    assert_every_row_once(rows, 9)


def test_an_empty_watched_directory_needs_a_schema(tmp_path: Path) -> None:
    (tmp_path / "landing").mkdir()
    env = StreamEnvironment(1)
    with pytest.raises(SourceError, match=r"is watched \(monitor=\) but has no jsonl file"):
        env.read_jsonl(tmp_path / "landing", monitor="1s")
    stream = env.read_jsonl(tmp_path / "landing", monitor="1s", schema={"user": "string"})
    assert stream is not None
    with pytest.raises(ValueError, match="monitor"):
        env.read_jsonl(tmp_path / "landing", monitor="0s", schema={"user": "string"})


def test_a_file_that_changes_after_it_was_read_is_reported_and_not_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """File 0 grows once a checkpoint shows it read: the job's listener hears of it (naming
    the file), and the rows added are not read: each row of the files as first put, once."""
    (tmp_path / "landing").mkdir()
    put_file(tmp_path / "landing", 0)
    warned: list[str] = []
    feeder = Feeder(tmp_path / "landing", tmp_path / "ck", [1, 2], 3, endpoints_of(monkeypatch))

    def listener(kind: str, message: str) -> None:
        if kind == "warning":
            warned.append(message)
        grow = kind == "checkpoint" and not (tmp_path / "grown").exists()
        if grow and finished_files(tmp_path / "ck", int(message.split()[0])) >= 1:
            with open(tmp_path / "landing" / "part-0000.jsonl", "a") as grown:
                grown.write(json.dumps({"file": 0, "row": ROWS, "user": "u0"}) + "\n")
            (tmp_path / "grown").touch()
        if (tmp_path / "grown").exists():
            feeder(kind, message)

    env = watching_job(tmp_path, 1, "out")
    testing.execute(env, launcher=ThreadLauncher(), listener=listener)
    feeder.savepoint()
    assert_every_row_once(published(tmp_path / "out"), 3)
    changed = [m for m in warned if "changed after it was read" in m]
    assert len(changed) == 1 and "part-0000.jsonl" in changed[0], warned


def test_a_watched_directory_that_goes_away_fails_the_job_naming_it(tmp_path: Path) -> None:
    """Removed once a checkpoint shows its file read: the next listing fails the job, naming
    the directory (never a silent end of the input)."""
    (tmp_path / "landing").mkdir()
    put_file(tmp_path / "landing", 0)

    def listener(kind: str, message: str) -> None:
        landing = tmp_path / "landing"
        due = kind == "checkpoint" and landing.exists()
        if due and finished_files(tmp_path / "ck", int(message.split()[0])) >= 1:
            for path in landing.iterdir():
                path.unlink()
            landing.rmdir()

    env = StreamEnvironment(
        1, checkpoint_interval=0.05, checkpoint_dir=tmp_path / "ck", restart_strategy=FixedDelay(0)
    )
    env.read_jsonl(tmp_path / "landing", monitor="20ms", name="landing").write_parquet(
        tmp_path / "out", name="out"
    )
    with pytest.raises(JobFailedError, match=r"landing.*does not exist"):
        testing.execute(env, launcher=ThreadLauncher(), listener=listener)
